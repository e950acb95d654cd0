// Tolerances derived from the computation instead of one machine's rounding (CONVENTIONS.md "A
// tolerance must hold on every CPU, BLAS kernel set and thread count"): a K-term f32 sum is good
// to about K·2^-24·Σ|terms| whatever order its BLAS kernel set, kernel variant or thread count
// adds the terms in. `magnitude` is Σ|terms| of each value: the same computation run on the
// inputs' absolute values (products and sums of non-negative numbers add up exactly the |terms|).
// Two f32 computations of one value then differ by at most 2·K·2^-24·magnitude, K being the
// longest chain of additions any value goes through.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace bp::test {

inline constexpr double kF32UnitRoundoff = 0x1p-24;

inline double f32_sum_bound(double K, double magnitude) {
  return 2.0 * K * kF32UnitRoundoff * magnitude;
}

// |actual - expected| <= f32_sum_bound(K, magnitude) for every value.
inline ::testing::AssertionResult within_f32_sum_bound(const std::vector<float>& actual,
                                                       const std::vector<float>& expected,
                                                       const std::vector<float>& magnitude, double K) {
  if (actual.size() != expected.size() || actual.size() != magnitude.size())
    return ::testing::AssertionFailure() << "sizes differ: " << actual.size() << ", " << expected.size() << " and "
                                         << magnitude.size() << " magnitudes";
  size_t bad = 0, first = 0;
  double worst = 0, first_allowed = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(actual[i]) - static_cast<double>(expected[i]));
    const double allowed = f32_sum_bound(K, magnitude[i]);
    if (!(diff <= allowed)) {
      if (!bad) first = i, first_allowed = allowed;
      ++bad;
      worst = std::max(worst, diff);
    }
  }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << actual.size() << " values differ; first at " << first << ": "
                                       << actual[first] << " vs " << expected[first] << " (allowed " << first_allowed
                                       << " = 2·" << K << "·2^-24·" << magnitude[first] << "; worst |diff| " << worst
                                       << ")";
}

}  // namespace bp::test
