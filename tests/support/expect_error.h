// expect_error and code_of: run a callable and expect a bp::Error; expect_error checks its code and
// that its message names every needle, code_of returns the code (and the message) for the test to
// compare. Shared by the tests of every layer.
#pragma once

#include <gtest/gtest.h>

#include <functional>
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

// The code of the bp::Error f throws (its message into *message when given). A callable that does not
// throw, or throws something else, fails the test and returns RUNTIME_INTERNAL, which no caller expects.
inline ErrorCode code_of(const std::function<void()>& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  ADD_FAILURE() << "expected a bp::Error";
  return ErrorCode::RUNTIME_INTERNAL;
}

}  // namespace bp::test
