// The test executables' precompiled headers: the library's (precompiled.h) and GoogleTest's.
#pragma once

#include <gtest/gtest.h>

#include "precompiled.h"
