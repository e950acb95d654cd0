// Shared helpers for tests: seeded random tensors, tolerance checks, paths.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace bp::test {

// Uniform values in [lo, hi) from a fixed seed (never zeros).
std::vector<float> random_vector(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
Tensor random_tensor(Shape shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// Per-dtype tolerances (CONVENTIONS.md): |a - b| <= atol + rtol * |b|.
struct Tolerance {
  double atol, rtol;
};
inline constexpr Tolerance kTolF32{1e-5, 1e-5};
inline constexpr Tolerance kTolBF16{2e-2, 2e-2};
inline constexpr Tolerance kTolF16{1e-3, 1e-3};

// Fails the test (with the first offending index) when actual and expected differ beyond tol.
::testing::AssertionResult all_close(const std::vector<float>& actual, const std::vector<float>& expected,
                                     Tolerance tol);
::testing::AssertionResult all_close(const std::vector<double>& actual, const std::vector<double>& expected,
                                     Tolerance tol);

std::string source_dir();  // repository root
std::string binary_dir();  // CMake build folder
std::string backprop_exe();
std::string shared_dir();  // ../shared next to the repository
// Runs a shell command, returns its exit code and captures stdout+stderr into *output.
int run_command(const std::string& cmd, std::string* output);
// A fresh temporary folder, removed when the object dies.
struct TempDir {
  TempDir();
  ~TempDir();
  std::string path;
};

}  // namespace bp::test
