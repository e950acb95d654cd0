// expect_error: run a callable and expect a bp::Error with a given code whose message names
// every needle (the settings tests of tests/core and tests/cli share it).
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "core/error.h"

namespace bp::test {

// Runs f, expects a bp::Error with `code` whose message contains every needle.
template <class F>
void expect_error(F&& f, ErrorCode code, std::initializer_list<std::string> needles) {
  try {
    f();
    FAIL() << "expected " << error_info(code).name;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n << " in " << e.what();
  }
}

}  // namespace bp::test
