// Helpers of the CUDA-kernel tests (tests/cuda): random inputs, bf16 rounding, and the tolerance
// check (CONVENTIONS.md: |got − ref| <= atol + rtol·|ref|; f32 ~1e-5, bf16 ~2e-2). Kernels run on
// the CPU simulation (src/backend/cuda/sim); "device" memory is ordinary host memory there.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_compat.cuh"
#include "core/dtype.h"

namespace bp::sim::test {

struct Tolerance {
  double atol, rtol;
};
constexpr Tolerance kF32Tol{1e-5, 1e-5};
constexpr Tolerance kBf16Tol{2e-2, 2e-2};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = d(rng);
  return v;
}

inline std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = __float2bfloat16(v[i]);
  return r;
}
inline std::vector<float> to_f32(const std::vector<bf16>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = __bfloat162float(v[i]);
  return r;
}
// The values a bf16 tensor can hold: what the CPU reference gets in bf16 tests.
inline std::vector<float> round_bf16(const std::vector<float>& v) {
  return to_f32(to_bf16(v));
}

// Storage of type T holding v (bf16 rounds).
template <class T>
std::vector<T> as(const std::vector<float>& v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return to_bf16(v);
}
template <class T>
std::vector<float> back(const std::vector<T>& v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else
    return to_f32(v);
}
template <class T>
constexpr Tolerance tolerance_of() {
  return std::is_same_v<T, float> ? kF32Tol : kBf16Tol;
}

inline void expect_close(const std::vector<float>& got, const std::vector<float>& ref, Tolerance tol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double lim = tol.atol + tol.rtol * std::abs(ref[i]);
    if (!(std::abs(double(got[i]) - ref[i]) <= lim) && ++bad <= 5)
      ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << ", reference " << ref[i];
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " values outside tolerance";
}

// `copy` is `of` rounded to nearest-even bf16, bit for bit (a producer's bf16 output beside its
// own f32 one: ops/linear.h x_bf16).
inline void expect_bf16_copy(const std::vector<bf16>& copy, const std::vector<float>& of, const std::string& what) {
  ASSERT_EQ(copy.size(), of.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < of.size(); ++i)
    if (copy[i].bits != ::bp::f32_to_bf16(of[i]) && ++bad <= 5)
      ADD_FAILURE() << what << " [" << i << "]: bits " << copy[i].bits << " for " << of[i];
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << of.size() << " values not the rounded f32 output";
}

}  // namespace bp::sim::test
