// DoRA with LoRA dropout against a plain double-precision reference of PEFT's formula
// (tuners/lora/variants.py DoraLinearVariant.forward while training with dropout, dora.py
// DoraLinearLayer.forward with base_result None):
//   result = x·Wᵀ + b                                   (the base layer on the undropped x)
//   xd     = dropout(x)                                 (the LoRA dropout module's mask)
//   result += (m/n − 1) ⊙ (xd·Wᵀ) + (m/n) ⊙ s·(xd·Aᵀ)·Bᵀ,  n_j = ||W_j + s·(B·A)_j|| detached.
// The mask is the kernels' (cpu::dropout_keep with the projection's seed), as the LoRA dropout
// tests make it identical. Backward: every gradient (x, A, B, m) against central differences of
// the reference with n held at its value (PEFT detaches it). An f32 and a bf16-held W (the held
// path makes xd through an identity A), with a residual; and p = 0 gives DoRA without dropout.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/linear.h"
#include "core/dtype.h"
#include "ops/linear.h"
#include "support/finite_diff.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::random_tensor;
using test::to_double;

struct DoraRef {
  int64_t T, in, out, r;
  std::vector<double> x, W, b, A, B, m, mask, res;
  double s;
  std::vector<double> n;  // fixed row norms (detached)

  void set_norms() {
    n.assign(static_cast<size_t>(out), 0.0);
    for (int64_t j = 0; j < out; ++j) {
      double sq = 0;
      for (int64_t i = 0; i < in; ++i) {
        double w = W[j * in + i];
        for (int64_t k = 0; k < r; ++k) w += s * B[j * r + k] * A[k * in + i];
        sq += w * w;
      }
      n[j] = std::sqrt(sq);
    }
  }

  std::vector<double> forward() const {
    std::vector<double> y(static_cast<size_t>(T * out));
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> xd(static_cast<size_t>(in)), xa(static_cast<size_t>(r), 0.0);
      for (int64_t i = 0; i < in; ++i) xd[i] = x[t * in + i] * mask[t * in + i];
      for (int64_t k = 0; k < r; ++k)
        for (int64_t i = 0; i < in; ++i) xa[k] += xd[i] * A[k * in + i];
      for (int64_t j = 0; j < out; ++j) {
        double base = 0, dropped = 0, lora = 0;
        for (int64_t i = 0; i < in; ++i) base += x[t * in + i] * W[j * in + i], dropped += xd[i] * W[j * in + i];
        for (int64_t k = 0; k < r; ++k) lora += s * xa[k] * B[j * r + k];
        const double c = m[j] / n[j];
        y[t * out + j] = res[t * out + j] + base + b[j] + (c - 1.0) * dropped + c * lora;
      }
    }
    return y;
  }
};

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i]))) << what << " [" << i << "]";
}

TEST(LinearDora, DropoutFollowsPeftForwardAndBackward) {
  const int64_t T = 9, in = 13, out = 7, r = 3;
  for (DType held : {DType::F32, DType::BF16})
    for (float p : {0.3f, 0.0f}) {
      SCOPED_TRACE(::testing::Message() << (held == DType::F32 ? "f32 W" : "bf16 W") << ", p = " << p);
      const Tensor x = random_tensor({T, in}, 1), W = random_tensor({out, in}, 2).to(held);
      const Tensor b = random_tensor({out}, 3), res = random_tensor({T, out}, 4), dy = random_tensor({T, out}, 5);
      const Tensor A = random_tensor({r, in}, 6), B = random_tensor({out, r}, 7);
      const Tensor m = random_tensor({out}, 8, 0.5f, 1.5f);
      const Tensor W32 = W.to(DType::F32);
      Tensor nsq = Tensor::empty({out});
      for (int64_t j = 0; j < out; ++j) {
        double sq = 0;
        for (int64_t i = 0; i < in; ++i)
          sq += static_cast<double>(W32.data<float>()[j * in + i]) * W32.data<float>()[j * in + i];
        nsq.data<float>()[j] = static_cast<float>(sq);
      }
      LoraWeights lora{&A, &B, 0.5f, p, 1234, true};
      lora.magnitude = &m, lora.weight_norm_sq = &nsq;

      DoraRef ref{T,
                  in,
                  out,
                  r,
                  to_double(x.to_vector()),
                  to_double(W32.to_vector()),
                  to_double(b.to_vector()),
                  to_double(A.to_vector()),
                  to_double(B.to_vector()),
                  to_double(m.to_vector()),
                  {},
                  to_double(res.to_vector()),
                  0.5,
                  {}};
      ref.mask.resize(static_cast<size_t>(T * in));
      for (int64_t i = 0; i < T * in; ++i)
        ref.mask[i] = p == 0 ? 1.0 : cpu::dropout_keep(1234, static_cast<uint64_t>(i), p) ? 1.0 / (1.0 - p) : 0.0;
      ref.set_norms();

      // A bf16-held W's GEMMs may read x (dy) rounded to bf16 where the CPU multiplies bf16: 2⁻⁸
      // relative per operand over sums of 13 terms, against the f64 reference on the f32 x.
      const double tol_y = held == DType::F32 ? 2e-5 : 2e-2, tol_g = held == DType::F32 ? 2e-4 : 2e-2;
      LinearSaved saved;
      const Tensor y = linear_forward(x, W, &b, &lora, &saved, nullptr, &res);
      expect_close(y.to_vector(), ref.forward(), tol_y, "y");

      Tensor dx = Tensor::empty({T, in}), dA = Tensor::zeros({r, in}), dB = Tensor::zeros({out, r});
      Tensor dm = Tensor::zeros({out});
      LinearGrads g{&dx, nullptr, nullptr, &dA, &dB};
      g.dm = &dm;
      linear_backward(dy, x, W, &lora, &saved, g);
      const std::vector<double> dyd = to_double(dy.to_vector());
      auto loss = [&] { return test::dot(dyd, ref.forward()); };
      expect_close(dx.to_vector(), test::numeric_gradient(&ref.x, loss), tol_g, "dx");
      expect_close(dA.to_vector(), test::numeric_gradient(&ref.A, loss), tol_g, "dA");
      expect_close(dB.to_vector(), test::numeric_gradient(&ref.B, loss), tol_g, "dB");
      expect_close(dm.to_vector(), test::numeric_gradient(&ref.m, loss), tol_g, "dm");
    }
}

// Evaluation (training false) applies no dropout: DoRA's plain output.
TEST(LinearDora, EvalModeIgnoresTheDropout) {
  const Tensor x = random_tensor({5, 6}, 11), W = random_tensor({4, 6}, 12);
  const Tensor A = random_tensor({2, 6}, 13), B = random_tensor({4, 2}, 14), m = random_tensor({4}, 15, 0.5f, 1.5f);
  const Tensor nsq = random_tensor({4}, 16, 2.0f, 3.0f);
  LoraWeights with{&A, &B, 0.5f, 0.4f, 7, false}, without{&A, &B, 0.5f, 0.0f, 7, true};
  with.magnitude = without.magnitude = &m;
  with.weight_norm_sq = without.weight_norm_sq = &nsq;
  EXPECT_EQ(linear_forward(x, W, nullptr, &with, nullptr).to_vector(),
            linear_forward(x, W, nullptr, &without, nullptr).to_vector());
  with.training = true;
  EXPECT_NE(linear_forward(x, W, nullptr, &with, nullptr).to_vector(),
            linear_forward(x, W, nullptr, &without, nullptr).to_vector());
}

}  // namespace
}  // namespace bp
