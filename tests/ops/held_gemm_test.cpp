// Frozen weights held in their stored type (backend/cpu/quant_gemm.h through ops/linear.h,
// ops/embedding.h, ops/cross_entropy.h): every product that reads a held W equals dequantize-the-
// whole-W-then-sgemm (the plain reference) at odd sizes, for each held type, with tile splits
// that cut through the panels and the X rows; the results do not depend on the thread count; a
// held W refuses a weight gradient. The vector dequantizers of every CPU kernel variant equal the
// scalar reference of core/quant_blocks.cpp.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/gemm.h"
#include "backend/cpu/quant_gemm.h"
#include "core/quant_blocks.h"
#include "op_test_util.h"
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

// K a multiple of each type's block, everything else odd; N large enough for several panels. The
// last three cut X's rows into several chunks (M past the chunk) and W's rows or columns into
// several slices and tiles (checked in SplitsCoverChunksSlicesAndTiles).
std::vector<Case> cases() {
  return {{DType::Q8_0, 37, 45, 96},   {DType::Q8_0, 3, 301, 32},  {DType::Q4_K, 29, 19, 512},
          {DType::Q4_K, 65, 130, 256}, {DType::Q5_0, 17, 23, 160}, {DType::Q6_K, 11, 9, 256},
          {DType::BF16, 33, 27, 35},   {DType::F16, 5, 71, 13},    {DType::Q8_0, 515, 45, 96},
          {DType::Q5_0, 301, 7, 64},   {DType::Q4_K, 3, 300, 4096}};
}

TEST(HeldGemm, SplitsCoverChunksSlicesAndTiles) {
  // M = 515 and 301 rows of X come in several chunks when W has few rows ...
  const cpu::HeldSplit a = cpu::held_xwt_split(515, 45, 96, DType::Q8_0);
  EXPECT_LT(a.chunk, 515);
  EXPECT_LT(cpu::held_xw_split(515, 45, 96, DType::Q8_0).chunk, 515);
  EXPECT_LT(cpu::held_xwt_split(301, 7, 64, DType::Q5_0).chunk, 301);
  // ... a wide W is dequantized in column slices of whole blocks (x·Wᵀ) and row tiles (dy·W) ...
  const cpu::HeldSplit b = cpu::held_xwt_split(3, 300, 4096, DType::Q4_K);
  EXPECT_LT(b.step, 4096);
  EXPECT_EQ(b.step % 256, 0);
  EXPECT_LE(b.piece * b.step, cpu::kHeldTileFloats);
  const cpu::HeldSplit c = cpu::held_xw_split(3, 300, 4096, DType::Q4_K);
  EXPECT_LT(c.step, 300);
  EXPECT_EQ(c.piece % 256, 0);
  // ... and a model-sized product is one chunk of X (each tile dequantized once).
  EXPECT_EQ(cpu::held_xwt_split(512, 1536, 576, DType::Q8_0).chunk, 512);
  EXPECT_EQ(cpu::held_xw_split(512, 576, 1536, DType::Q8_0).chunk, 512);
}

TEST(HeldGemm, TilesEqualDequantizeThenSgemmForEveryHeldType) {
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    SCOPED_TRACE(::testing::Message() << dtype_name(c.type) << " M=" << c.M << " N=" << c.N << " K=" << c.K);
    const Held h = make_held(c.type, c.N, c.K, seed++);
    const cpu::HeldMatrix W{h.w.raw(), c.type, c.N, c.K};
    const std::vector<float> x = test::random_vector(static_cast<size_t>(c.M * c.K), seed++);
    std::vector<float> y(static_cast<size_t>(c.M * c.N), 0.0f);
    // Slices sum a long dot product in another order: f32 rounding grows with its length.
    const test::Tolerance tol{1e-5 * std::max<double>(1.0, double(c.K) / 512), 1e-5};
    cpu::held_gemm_xwt(x.data(), W, 0.0f, y.data(), c.M);
    EXPECT_TRUE(all_close(y, ref_xwt(x, h.dq, c.M, c.N, c.K), tol)) << "x·Wᵀ";
    // beta = 1 accumulates onto C.
    std::vector<float> y2 = y;
    cpu::held_gemm_xwt(x.data(), W, 1.0f, y2.data(), c.M);
    for (auto& v : y) v *= 2.0f;
    EXPECT_TRUE(all_close(y2, y, tol)) << "beta 1";

    const std::vector<float> g = test::random_vector(static_cast<size_t>(c.M * c.N), seed++);
    std::vector<float> dx(static_cast<size_t>(c.M * c.K), 123.0f);  // overwritten
    cpu::held_gemm_xw(g.data(), W, 0.0f, dx.data(), c.M);
    EXPECT_TRUE(all_close(dx, ref_xw(g, h.dq, c.M, c.N, c.K), test::kTolF32)) << "dy·W";
    // beta = 1 adds onto what C holds (a second projection's dx summed in place).
    std::vector<float> dx2(dx.size());
    for (size_t i = 0; i < dx2.size(); ++i) dx2[i] = 0.5f - static_cast<float>(i % 7);
    const std::vector<float> before = dx2;
    cpu::held_gemm_xw(g.data(), W, 1.0f, dx2.data(), c.M);
    for (size_t i = 0; i < dx.size(); ++i) dx[i] += before[i];
    EXPECT_TRUE(all_close(dx2, dx, test::kTolF32)) << "dy·W, beta 1";
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
    cpu::held_gemm_xw(g.data(), W, 0.0f, dx.data(), 41);
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

// ---- vector dequantizers, per CPU kernel variant ------------------------------------------------

using VariantDequantFn = void (*)(const uint8_t*, float*, int64_t);

// Random blocks of `t`: half quantized from random values (realistic scales), half random bytes
// (every bit pattern of the quants and packed scales) with finite f16 scales patched in.
std::vector<uint8_t> random_blocks(DType t, int64_t blocks, uint64_t seed) {
  const int64_t bs = dtype_block_size(t), bb = static_cast<int64_t>(dtype_block_bytes(t));
  std::vector<uint8_t> out(static_cast<size_t>(blocks * bb));
  const std::vector<float> x = test::random_vector(static_cast<size_t>(blocks * bs), seed, -3.0f, 2.0f);
  quantize_span(t, x.data(), out.data(), blocks * bs);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> scale(-0.5f, 0.5f);
  for (int64_t b = 1; b < blocks; b += 2) {
    uint8_t* blk = out.data() + b * bb;
    for (int64_t i = 0; i < bb; ++i) blk[i] = static_cast<uint8_t>(rng());
    const int halves = t == DType::Q4_K ? 2 : 1;  // d (and dmin) lead every format here
    for (int h = 0; h < halves; ++h) {
      const uint16_t v = f32_to_f16(h == 1 ? std::fabs(scale(rng)) : scale(rng));
      std::memcpy(blk + 2 * h, &v, 2);
    }
  }
  return out;
}

class HeldDequantEveryCpuVariant : public test::PerKernelVariant {};

TEST_P(HeldDequantEveryCpuVariant, VectorDequantizersEqualTheScalarReference) {
  const cpu::KernelTable& k = cpu::kernel_table(GetParam());
  const std::pair<DType, VariantDequantFn> formats[] = {{DType::Q8_0, k.dequantize_q8_0},
                                                        {DType::Q4_0, k.dequantize_q4_0},
                                                        {DType::Q5_0, k.dequantize_q5_0},
                                                        {DType::Q4_K, k.dequantize_q4_k}};
  for (const auto& [t, fn] : formats) {
    for (int64_t blocks : {1, 2, 3, 8, 17}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " blocks=" << blocks);
      const int64_t bs = dtype_block_size(t), n = blocks * bs;
      const std::vector<uint8_t> q = random_blocks(t, blocks, static_cast<uint64_t>(blocks) * 31 + bs);
      std::vector<float> ref(static_cast<size_t>(n)), got(static_cast<size_t>(n), NAN);
      dequantize_span(t, q.data(), ref.data(), n);
      fn(q.data(), got.data(), blocks);
      if (t != DType::Q4_K) {
        EXPECT_EQ(got, ref);  // one product per value: bit-identical
        continue;
      }
      // y = (d·sc)·q − dmin·m: FMA may round the product and offset once instead of twice, so
      // allow one rounding of the largest product and offset the block can form (2⁻²³ relative).
      // A wrong nibble, scale or sub-block is off by at least one step d·sc, far beyond that.
      const int64_t bb = static_cast<int64_t>(dtype_block_bytes(t));
      for (int64_t b = 0; b < blocks; ++b) {
        uint16_t dh, dminh;
        std::memcpy(&dh, q.data() + b * bb, 2);
        std::memcpy(&dminh, q.data() + b * bb + 2, 2);
        const double bound = std::ldexp(std::fabs(f16_to_f32(dh)) * 63 * 15 + std::fabs(f16_to_f32(dminh)) * 63, -23);
        for (int64_t i = b * bs; i < (b + 1) * bs; ++i)
          ASSERT_LE(std::fabs(double(got[size_t(i)]) - ref[size_t(i)]), bound) << "element " << i;
      }
    }
  }
}

BP_PER_KERNEL_VARIANT(HeldDequantEveryCpuVariant);

// The dequantizer in use is the forced variant's: a product through every variant equals the
// dequantize-then-sgemm reference (each variant's vector code runs inside the tiles).
TEST_P(HeldDequantEveryCpuVariant, HeldGemmUsesTheVariantAndMatchesTheReference) {
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q4_K}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t M = 7, N = 33, K = 512;
    const Held h = make_held(t, N, K, 40);
    const cpu::HeldMatrix W{h.w.raw(), t, N, K};
    const std::vector<float> x = test::random_vector(static_cast<size_t>(M * K), 41);
    std::vector<float> y(static_cast<size_t>(M * N));
    cpu::held_gemm_xwt(x.data(), W, 0.0f, y.data(), M);
    EXPECT_TRUE(all_close(y, ref_xwt(x, h.dq, M, N, K), test::kTolF32));
    const std::vector<float> g = test::random_vector(static_cast<size_t>(M * N), 42);
    std::vector<float> dx(static_cast<size_t>(M * K));
    cpu::held_gemm_xw(g.data(), W, 0.0f, dx.data(), M);
    EXPECT_TRUE(all_close(dx, ref_xw(g, h.dq, M, N, K), test::kTolF32));
    std::vector<float> acc(dx.size(), 0.75f);  // beta 1: added onto what dx holds
    cpu::held_gemm_xw(g.data(), W, 1.0f, acc.data(), M);
    for (float& v : dx) v += 0.75f;
    EXPECT_TRUE(all_close(acc, dx, test::kTolF32)) << "beta 1";
  }
}

}  // namespace
}  // namespace bp
