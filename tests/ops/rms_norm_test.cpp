// RMSNorm: forward (y and rstd) and backward (dx, dw) against a double reference at odd sizes,
// backward against finite differences, dx = / dw += semantics, frozen w, errors.
#include "ops/rms_norm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "op_test_util.h"
#include "support/finite_diff.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::all_close;
using test::random_tensor;
using test::to_double;

std::vector<double> ref_forward(const std::vector<double>& x, const std::vector<double>& w, double eps, int64_t N,
                                int64_t D, std::vector<double>* rstd = nullptr) {
  std::vector<double> y(x.size());
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += x[n * D + j] * x[n * D + j];
    const double r = 1.0 / std::sqrt(ss / D + eps);
    if (rstd) rstd->push_back(r);
    for (int64_t j = 0; j < D; ++j) y[n * D + j] = x[n * D + j] * r * w[j];
  }
  return y;
}

TEST(RmsNorm, ForwardAndBackwardMatchReferenceAtOddSizes) {
  uint64_t seed = 1;
  const float eps = 1e-5f;
  for (auto [N, D] : {std::pair<int64_t, int64_t>{1, 31}, {31, 32}, {33, 1}, {257, 33}, {32, 257}}) {
    Tensor x = random_tensor({N, D}, ++seed), w = random_tensor({D}, ++seed, 0.5f, 1.5f);
    Tensor dy = random_tensor({N, D}, ++seed);
    Tensor rstd;
    Tensor y = rms_norm_forward(x, w, eps, &rstd);
    const auto xd = to_double(x.to_vector()), wd = to_double(w.to_vector()), g = to_double(dy.to_vector());
    std::vector<double> rr;
    const auto ry = ref_forward(xd, wd, eps, N, D, &rr);
    EXPECT_TRUE(all_close(to_double(y.to_vector()), ry, {1e-5, 1e-5})) << N << "x" << D;
    EXPECT_TRUE(all_close(to_double(rstd.to_vector()), rr, {1e-6, 1e-6})) << N << "x" << D;

    Tensor dx = Tensor::empty({N, D}), dw = Tensor::zeros({D});
    rms_norm_backward(dy, x, w, rstd, dx, &dw);
    std::vector<double> rdx(xd.size()), rdw(static_cast<size_t>(D), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      const double r = rr[n];
      double dot = 0;
      for (int64_t j = 0; j < D; ++j) dot += wd[j] * g[n * D + j] * xd[n * D + j];
      for (int64_t j = 0; j < D; ++j) {
        rdx[n * D + j] = r * wd[j] * g[n * D + j] - xd[n * D + j] * r * r * r * dot / D;
        rdw[j] += g[n * D + j] * xd[n * D + j] * r;
      }
    }
    EXPECT_TRUE(all_close(to_double(dx.to_vector()), rdx, {1e-5, 1e-5})) << N << "x" << D;
    EXPECT_TRUE(all_close(to_double(dw.to_vector()), rdw, {1e-5, 1e-5})) << N << "x" << D;
  }
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t N = 3, D = 7;
  const float eps = 1e-6f;
  Tensor x = random_tensor({N, D}, 5), w = random_tensor({D}, 6, 0.5f, 1.5f), dy = random_tensor({N, D}, 7);
  Tensor rstd;
  rms_norm_forward(x, w, eps, &rstd);
  Tensor dx = Tensor::empty({N, D}), dw = Tensor::zeros({D});
  rms_norm_backward(dy, x, w, rstd, dx, &dw);
  std::vector<double> xd = to_double(x.to_vector()), wd = to_double(w.to_vector());
  const std::vector<double> g = to_double(dy.to_vector());
  auto loss = [&] { return test::dot(g, ref_forward(xd, wd, eps, N, D)); };
  EXPECT_TRUE(all_close(to_double(dx.to_vector()), test::numeric_gradient(&xd, loss), {2e-5, 1e-4}));
  EXPECT_TRUE(all_close(to_double(dw.to_vector()), test::numeric_gradient(&wd, loss), {2e-5, 1e-4}));
}

TEST(RmsNorm, DwAccumulatesDxOverwritesFrozenWeightSkipsDw) {
  const int64_t N = 40, D = 70;
  Tensor x = random_tensor({N, D}, 1), w = random_tensor({D}, 2), dy = random_tensor({N, D}, 3);
  Tensor rstd;
  rms_norm_forward(x, w, 1e-5f, &rstd);
  Tensor dx = Tensor::empty({N, D}), dw = Tensor::zeros({D});
  rms_norm_backward(dy, x, w, rstd, dx, &dw);
  const auto dx1 = dx.to_vector(), dw1 = dw.to_vector();
  dx.fill(9.0f);
  rms_norm_backward(dy, x, w, rstd, dx, &dw);
  EXPECT_TRUE(all_close(dx.to_vector(), dx1, {0, 0}));
  std::vector<float> twice = dw1;
  for (float& v : twice) v *= 2.0f;
  EXPECT_TRUE(all_close(dw.to_vector(), twice, {1e-6, 1e-6}));
  Tensor dx_frozen = Tensor::empty({N, D});
  rms_norm_backward(dy, x, w, rstd, dx_frozen, nullptr);
  EXPECT_TRUE(all_close(dx_frozen.to_vector(), dx1, {0, 0}));
  // accumulate_dx adds to what dx holds (a residual's gradient); dw accumulates as before.
  const Tensor prior = random_tensor({N, D}, 4);
  Tensor dx_acc = prior.clone();
  rms_norm_backward(dy, x, w, rstd, dx_acc, nullptr, /*accumulate_dx=*/true);
  std::vector<float> want = prior.to_vector();
  for (size_t i = 0; i < want.size(); ++i) want[i] += dx1[i];
  EXPECT_TRUE(all_close(dx_acc.to_vector(), want, {1e-6, 1e-6}));
}

// y's bf16 copy (the projections' GEMM operand on a card: ops/linear.h x_bf16): each value the
// nearest-even rounding of y, rows above the parallel threshold; y unchanged by asking for it; a
// copy of another shape or type is refused.
TEST(RmsNorm, Bf16CopyIsTheRoundedOutput) {
  const int64_t N = 29, D = 1023;
  Tensor x = random_tensor({N, D}, 11, -3.0f, 3.0f), w = random_tensor({D}, 12, 0.5f, 1.5f);
  Tensor y16;
  const Tensor y = rms_norm_forward(x, w, 1e-5f, nullptr, &y16);
  EXPECT_EQ(y.to_vector(), rms_norm_forward(x, w, 1e-5f, nullptr).to_vector());
  test::expect_bf16_copy_of(y16, y, "y");
  // Backward: the resulting dx's copy, accumulated onto a residual's gradient.
  const Tensor dy = random_tensor({N, D}, 13), prior = random_tensor({N, D}, 14);
  Tensor rstd, dx = prior.clone(), dx_alone = prior.clone(), dx16;
  rms_norm_forward(x, w, 1e-5f, &rstd);
  rms_norm_backward(dy, x, w, rstd, dx, nullptr, true, &dx16);
  rms_norm_backward(dy, x, w, rstd, dx_alone, nullptr, true);
  EXPECT_EQ(dx.to_vector(), dx_alone.to_vector());
  test::expect_bf16_copy_of(dx16, dx, "accumulated dx");
  Tensor wrong_shape = Tensor::empty({N, D - 1}, DType::BF16), wrong_type = Tensor::empty({N, D});
  for (Tensor* wrong : {&wrong_shape, &wrong_type})
    test::expect_op_error([&] { rms_norm_forward(x, w, 1e-5f, nullptr, wrong); }, ErrorCode::RUNTIME_INTERNAL,
                          {"[rms_norm]", "y_bf16"});
}

TEST(RmsNorm, Errors) {
  Tensor x = random_tensor({4, 16}, 1), w = random_tensor({15}, 2);
  test::expect_op_error([&] { rms_norm_forward(x, w, 1e-5f, nullptr); }, ErrorCode::RUNTIME_INTERNAL,
                        {"[rms_norm]", "16", "15"});
  Tensor w16 = random_tensor({16}, 3);
  test::expect_op_error([&] { rms_norm_forward(x, w16, 0.0f, nullptr); }, ErrorCode::INPUT_VALIDATION_FAILED, {"eps"});
}

}  // namespace
}  // namespace bp
