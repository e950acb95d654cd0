// SwiGLU: forward and backward against a double reference at odd sizes, backward against
// finite differences, = semantics, shape errors. GeGLU (Gemma's gelu_pytorch_tanh gate) the same way.
#include "ops/swiglu.h"

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

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}

class SwiGLUEveryCpuVariant : public test::PerKernelVariant {};

TEST_P(SwiGLUEveryCpuVariant, ForwardAndBackwardMatchReferenceAtOddSizes) {
  uint64_t seed = 1;
  for (auto [T, F] : {std::pair<int64_t, int64_t>{1, 31}, {31, 32}, {33, 1}, {257, 33}, {32, 257}}) {
    // Gate values over a wide range so sigmoid saturates on both sides.
    Tensor gate = random_tensor({T, F}, ++seed, -12.0f, 12.0f), up = random_tensor({T, F}, ++seed);
    Tensor dh = random_tensor({T, F}, ++seed);
    Tensor h = swiglu_forward(gate, up);
    Tensor dgate = Tensor::empty({T, F}), dup = Tensor::empty({T, F});
    dgate.fill(5.0f);  // garbage: = semantics
    dup.fill(5.0f);
    swiglu_backward(dh, gate, up, dgate, dup);
    const auto g = to_double(gate.to_vector()), u = to_double(up.to_vector()), d = to_double(dh.to_vector());
    std::vector<double> rh(g.size()), rdg(g.size()), rdu(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      const double s = 1.0 / (1.0 + std::exp(-g[i]));
      rh[i] = silu(g[i]) * u[i];
      rdu[i] = d[i] * silu(g[i]);
      rdg[i] = d[i] * u[i] * (s + g[i] * s * (1.0 - s));
    }
    EXPECT_TRUE(all_close(to_double(h.to_vector()), rh, {1e-6, 1e-5})) << T << "x" << F;
    EXPECT_TRUE(all_close(to_double(dgate.to_vector()), rdg, {1e-6, 1e-5})) << T << "x" << F;
    EXPECT_TRUE(all_close(to_double(dup.to_vector()), rdu, {1e-6, 1e-5})) << T << "x" << F;
  }
}
BP_PER_KERNEL_VARIANT(SwiGLUEveryCpuVariant);

TEST(SwiGLU, BackwardMatchesFiniteDifferences) {
  const int64_t T = 4, F = 9;
  Tensor gate = random_tensor({T, F}, 3, -4.0f, 4.0f), up = random_tensor({T, F}, 4), dh = random_tensor({T, F}, 5);
  Tensor dgate = Tensor::empty({T, F}), dup = Tensor::empty({T, F});
  swiglu_backward(dh, gate, up, dgate, dup);
  std::vector<double> g = to_double(gate.to_vector()), u = to_double(up.to_vector());
  const std::vector<double> d = to_double(dh.to_vector());
  auto loss = [&] {
    double l = 0;
    for (size_t i = 0; i < g.size(); ++i) l += d[i] * silu(g[i]) * u[i];
    return l;
  };
  EXPECT_TRUE(all_close(to_double(dgate.to_vector()), test::numeric_gradient(&g, loss), {1e-5, 1e-4}));
  EXPECT_TRUE(all_close(to_double(dup.to_vector()), test::numeric_gradient(&u, loss), {1e-5, 1e-4}));
}

// The bf16 copies (the GEMMs' operands on a card: ops/linear.h x_bf16, dy_bf16): each value the
// nearest-even rounding of the f32 output beside it, above the parallel threshold; the f32
// outputs unchanged by asking for them; a copy of another shape is refused.
TEST(SwiGLU, Bf16CopiesAreTheRoundedOutputs) {
  const int64_t T = 37, F = 1031;  // 38147 values: several parallel chunks, a partial last one
  Tensor gate = random_tensor({T, F}, 6, -6.0f, 6.0f), up = random_tensor({T, F}, 7), dh = random_tensor({T, F}, 8);
  Tensor h16, dg16, du16;
  const Tensor h = swiglu_forward(gate, up, &h16);
  Tensor dgate = Tensor::empty({T, F}), dup = Tensor::empty({T, F});
  Tensor dgate_alone = Tensor::empty({T, F}), dup_alone = Tensor::empty({T, F});
  swiglu_backward(dh, gate, up, dgate, dup, &dg16, &du16);
  swiglu_backward(dh, gate, up, dgate_alone, dup_alone);
  EXPECT_EQ(h.to_vector(), swiglu_forward(gate, up).to_vector());
  EXPECT_EQ(dgate.to_vector(), dgate_alone.to_vector());
  EXPECT_EQ(dup.to_vector(), dup_alone.to_vector());
  test::expect_bf16_copy_of(h16, h, "h");
  test::expect_bf16_copy_of(dg16, dgate, "dgate");
  test::expect_bf16_copy_of(du16, dup, "dup");
  Tensor wrong = Tensor::empty({T, F + 1}, DType::BF16);
  test::expect_op_error([&] { swiglu_forward(gate, up, &wrong); }, ErrorCode::RUNTIME_INTERNAL, {"[swiglu]", "h_bf16"});
}

// torch.nn.functional.gelu(approximate="tanh"), written from its definition in double.
double gelu_tanh(double g) {
  return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
}

TEST(GeGLU, ForwardMatchesReferenceAndBackwardFiniteDifferences) {
  const int64_t T = 33, F = 31;
  Tensor gate = random_tensor({T, F}, 9, -8.0f, 8.0f), up = random_tensor({T, F}, 10), dh = random_tensor({T, F}, 11);
  Tensor h16;
  const Tensor h = geglu_forward(gate, up, &h16);
  Tensor dgate = Tensor::empty({T, F}), dup = Tensor::empty({T, F});
  dgate.fill(5.0f);  // garbage: = semantics
  geglu_backward(dh, gate, up, dgate, dup);
  std::vector<double> g = to_double(gate.to_vector()), u = to_double(up.to_vector());
  const std::vector<double> d = to_double(dh.to_vector());
  std::vector<double> rh(g.size());
  for (size_t i = 0; i < g.size(); ++i) rh[i] = gelu_tanh(g[i]) * u[i];
  EXPECT_TRUE(all_close(to_double(h.to_vector()), rh, {1e-6, 1e-5}));
  test::expect_bf16_copy_of(h16, h, "h");
  auto loss = [&] {
    double l = 0;
    for (size_t i = 0; i < g.size(); ++i) l += d[i] * gelu_tanh(g[i]) * u[i];
    return l;
  };
  EXPECT_TRUE(all_close(to_double(dgate.to_vector()), test::numeric_gradient(&g, loss), {1e-5, 1e-4}));
  EXPECT_TRUE(all_close(to_double(dup.to_vector()), test::numeric_gradient(&u, loss), {1e-5, 1e-4}));
  Tensor wrong = random_tensor({T, F + 1}, 12);
  test::expect_op_error([&] { geglu_forward(gate, wrong); }, ErrorCode::RUNTIME_INTERNAL, {"[geglu]"});
}

TEST(SwiGLU, ShapeMismatchIsAnInternalError) {
  Tensor gate = random_tensor({4, 8}, 1), up = random_tensor({4, 9}, 2);
  test::expect_op_error([&] { swiglu_forward(gate, up); }, ErrorCode::RUNTIME_INTERNAL,
                        {"[swiglu]", "[4, 9]", "[4, 8]"});
}

}  // namespace
}  // namespace bp
