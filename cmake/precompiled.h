// The headers nearly every C++ file of backprop parses, precompiled once per target (CMake option
// BACKPROP_PCH, bp_precompile_headers in CMakeLists.txt): libstdc++'s, fmt and nlohmann::json are
// ~90% of a typical file's 160,000 preprocessed lines. Only external headers belong here: a
// project header would rebuild every file when it changes. Files still include what they use
// (a BACKPROP_PCH=OFF build checks it).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>
