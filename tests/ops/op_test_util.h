// Small helpers shared by the op tests in this folder (linear, embedding, rms_norm, rope, swiglu).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace bp::test {

// Runs f, expects a bp::Error with `code` whose message contains every string in `parts`.
template <class F>
void expect_op_error(F&& f, ErrorCode code, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace bp::test
