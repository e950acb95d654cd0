// Frozen weights held in their stored type (backend/cpu/quant_gemm.h through ops/linear.h,
// ops/embedding.h, ops/cross_entropy.h): every product that reads a held W equals dequantize-the-
// whole-W-then-sgemm (the plain reference) at odd sizes, for each held type, with tile splits
// that cut through the panels and the X rows; the results do not depend on the thread count; a
// held W refuses a weight gradient.
#include <gtest/gtest.h>
#include <omp.h>

#include "backend/cpu/gemm.h"
#include "backend/cpu/quant_gemm.h"
#include "core/quant_blocks.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/linear.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::all_close;
using test::random_tensor;

// A held copy of a random [rows, cols] f32 matrix, and its dequantized values (the reference).
struct Held {
  Tensor w;               // held
  std::vector<float> dq;  // dequantized, [rows, cols]
};

Held make_held(DType t, int64_t rows, int64_t cols, uint64_t seed) {
  const Tensor f = random_tensor({rows, cols}, seed);
  Held h;
  h.w = f.to(t);
  h.dq = h.w.to_vector();
  return h;
}

std::vector<float> ref_xwt(const std::vector<float>& x, const std::vector<float>& w, int64_t M, int64_t N, int64_t K) {
  std::vector<float> c(static_cast<size_t>(M * N));
  cpu::sgemm(false, true, M, N, K, 1.0f, x.data(), K, w.data(), K, 0.0f, c.data(), N);
  return c;
}
std::vector<float> ref_xw(const std::vector<float>& x, const std::vector<float>& w, int64_t M, int64_t N, int64_t K) {
  std::vector<float> c(static_cast<size_t>(M * K));
  cpu::sgemm(false, false, M, K, N, 1.0f, x.data(), N, w.data(), K, 0.0f, c.data(), K);
  return c;
}

struct Case {
  DType type;
  int64_t M, N, K;
};

// K a multiple of each type's block, everything else odd; N large enough for several panels and
// small enough that X's rows get split too.
std::vector<Case> cases() {
  return {{DType::Q8_0, 37, 45, 96},   {DType::Q8_0, 3, 301, 32},  {DType::Q4_K, 29, 19, 512},
          {DType::Q4_K, 65, 130, 256}, {DType::Q5_0, 17, 23, 160}, {DType::Q6_K, 11, 9, 256},
          {DType::BF16, 33, 27, 35},   {DType::F16, 5, 71, 13}};
}

TEST(HeldGemm, TilesEqualDequantizeThenSgemmForEveryHeldType) {
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    SCOPED_TRACE(::testing::Message() << dtype_name(c.type) << " M=" << c.M << " N=" << c.N << " K=" << c.K);
    const Held h = make_held(c.type, c.N, c.K, seed++);
    const cpu::HeldMatrix W{h.w.raw(), c.type, c.N, c.K};
    const std::vector<float> x = test::random_vector(static_cast<size_t>(c.M * c.K), seed++);
    std::vector<float> y(static_cast<size_t>(c.M * c.N), 0.0f);
    cpu::held_gemm_xwt(x.data(), W, 0.0f, y.data(), c.M);
    EXPECT_TRUE(all_close(y, ref_xwt(x, h.dq, c.M, c.N, c.K), test::kTolF32)) << "x·Wᵀ";
    // beta = 1 accumulates onto C.
    std::vector<float> y2 = y;
    cpu::held_gemm_xwt(x.data(), W, 1.0f, y2.data(), c.M);
    for (auto& v : y) v *= 2.0f;
    EXPECT_TRUE(all_close(y2, y, test::kTolF32)) << "beta 1";

    const std::vector<float> g = test::random_vector(static_cast<size_t>(c.M * c.N), seed++);
    std::vector<float> dx(static_cast<size_t>(c.M * c.K), 123.0f);  // overwritten
    cpu::held_gemm_xw(g.data(), W, dx.data(), c.M);
    EXPECT_TRUE(all_close(dx, ref_xw(g, h.dq, c.M, c.N, c.K), test::kTolF32)) << "dy·W";
  }
}

TEST(HeldGemm, ResultsDoNotDependOnTheThreadCount) {
  const Held h = make_held(DType::Q4_K, 67, 512, 5);
  const cpu::HeldMatrix W{h.w.raw(), DType::Q4_K, 67, 512};
  const std::vector<float> x = test::random_vector(41 * 512, 6), g = test::random_vector(41 * 67, 7);
  const int threads = omp_get_max_threads();
  std::vector<std::vector<float>> ys, dxs;
  for (int n : {1, 2, 3}) {
    omp_set_num_threads(n);
    std::vector<float> y(41 * 67), dx(41 * 512);
    cpu::held_gemm_xwt(x.data(), W, 0.0f, y.data(), 41);
    cpu::held_gemm_xw(g.data(), W, dx.data(), 41);
    ys.push_back(y);
    dxs.push_back(dx);
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(ys[0], ys[1]);
  EXPECT_EQ(ys[0], ys[2]);
  EXPECT_EQ(dxs[0], dxs[1]);
  EXPECT_EQ(dxs[0], dxs[2]);
}

// The op front-ends: linear (with bias and LoRA), embedding and the fused LM head + loss with a
// held weight equal the same ops on the dequantized f32 weight.
TEST(HeldGemm, OpsOnAHeldWeightEqualTheOpsOnItsDequantizedValues) {
  const int64_t T = 13, in = 64, out = 37, r = 3;
  const Held h = make_held(DType::Q8_0, out, in, 11);
  const Tensor Wf = Tensor::from_vector(h.dq, {out, in});
  const Tensor x = random_tensor({T, in}, 12), b = random_tensor({out}, 13);
  const Tensor A = random_tensor({r, in}, 14), B = random_tensor({out, r}, 15);
  LoraWeights lora{&A, &B, 0.5f};
  LinearSaved s_held, s_f32;
  const Tensor y_held = linear_forward(x, h.w, &b, &lora, &s_held);
  const Tensor y_f32 = linear_forward(x, Wf, &b, &lora, &s_f32);
  EXPECT_TRUE(all_close(y_held.to_vector(), y_f32.to_vector(), test::kTolF32));
  const Tensor dy = random_tensor({T, out}, 16);
  Tensor dx_h = Tensor::zeros({T, in}), dx_f = Tensor::zeros({T, in});
  Tensor dA_h = Tensor::zeros({r, in}), dA_f = Tensor::zeros({r, in}), dB_h = Tensor::zeros({out, r}),
         dB_f = Tensor::zeros({out, r});
  linear_backward(dy, x, h.w, &lora, &s_held, {&dx_h, nullptr, nullptr, &dA_h, &dB_h});
  linear_backward(dy, x, Wf, &lora, &s_f32, {&dx_f, nullptr, nullptr, &dA_f, &dB_f});
  EXPECT_TRUE(all_close(dx_h.to_vector(), dx_f.to_vector(), test::kTolF32)) << "dx";
  EXPECT_TRUE(all_close(dA_h.to_vector(), dA_f.to_vector(), test::kTolF32)) << "dA";
  EXPECT_TRUE(all_close(dB_h.to_vector(), dB_f.to_vector(), test::kTolF32)) << "dB";
  Tensor dW = Tensor::zeros({out, in});
  EXPECT_THROW(linear_backward(dy, x, h.w, nullptr, nullptr, {nullptr, &dW}), Error) << "held W has no gradient";

  // Embedding rows and the tied LM head read the same held table.
  const Held table = make_held(DType::Q4_K, 21, 256, 17);
  const Tensor tf = Tensor::from_vector(table.dq, {21, 256});
  const Tensor ids = Tensor::from_vector(std::vector<int32_t>{3, 0, 20, 3, 7}, {5});
  EXPECT_EQ(embedding_forward(ids, table.w).to_vector(), embedding_forward(ids, tf).to_vector());
  const Tensor h5 = random_tensor({5, 256}, 18);
  const Tensor labels = Tensor::from_vector(std::vector<int32_t>{1, -100, 4, 20, 0}, {5});
  Tensor dh_held = Tensor::zeros({5, 256}), dh_f32 = Tensor::zeros({5, 256});
  const auto l_held = linear_cross_entropy_forward_backward(h5, table.w, labels, 0.25f, dh_held, nullptr, 2);
  const auto l_f32 = linear_cross_entropy_forward_backward(h5, tf, labels, 0.25f, dh_f32, nullptr, 2);
  EXPECT_NEAR(l_held.loss_sum, l_f32.loss_sum, 1e-5 * std::fabs(l_f32.loss_sum));
  EXPECT_TRUE(all_close(dh_held.to_vector(), dh_f32.to_vector(), test::kTolF32));
  EXPECT_TRUE(all_close(lm_head_logits(h5, table.w).to_vector(), lm_head_logits(h5, tf).to_vector(), test::kTolF32));
}

}  // namespace
}  // namespace bp
