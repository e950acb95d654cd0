// GEMMs against frozen weights on the simulated CUDA device take bf16 inputs with f32
// accumulation (src/backend/cuda/kernel_wrappers.h): the descriptions handed to cuBLASLt are
// recorded (sim/gemm_sim.h) and checked for their types and shapes, the activation operand's bf16
// copy is shown to come from the CUDA allocator and go back to it, and the linear layer (base
// weight held in bf16, LoRA on top, odd sizes) agrees with the CPU backend within the bound bf16
// rounding of the activation allows, while GEMMs against f32 weights stay f32 GEMMs and agree
// within f32 tolerance. The rounding kernel itself is checked bit for bit against core's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cuda/device_workspace.h"
#include "backend/cuda/sim/gemm_sim.h"
#include "core/dtype.h"
#include "op_parity.h"
#include "ops/elementwise.h"
#include "sim_device.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

using parity::bf16_rounded;
using parity::gpu;
using parity::kGpu;
using parity::kSmallPanelValues;
using parity::ScopedHeldPanelValues;

constexpr int64_t kT = 37, kIn = 71, kOut = 45, kRank = 3;  // odd sizes, no multiple of 8

Tensor abs_of(const Tensor& t) {
  std::vector<float> v = t.to(DType::F32).to_vector();
  for (float& e : v) e = std::fabs(e);
  return Tensor::from_vector(v, t.shape());
}

// |got − ref| ≤ 2⁻⁸·bound + tol.atol element by element, where bound = |a|·|b| (the sum of the
// absolute products): rounding one operand to bf16 moves each product by at most 2⁻⁹ of its size,
// so the sum moves by at most 2⁻⁹·bound; the factor 2 leaves room for f32 sums in another order.
void expect_within_bf16_bound(const Tensor& got, const Tensor& ref, const Tensor& bound, Tolerance tol,
                              const std::string& what) {
  const auto g = got.to_vector(), r = ref.to_vector(), b = bound.to_vector();
  ASSERT_EQ(g.size(), r.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - r[i]) <= std::ldexp(b[i], -8) + tol.atol)) ++bad;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << g.size() << " values outside the bf16 bound";
}

// kT labels for a head of V rows: every `period`-th token ignored (−100), the others t·step mod V.
Tensor head_labels(int64_t V, int64_t period, int64_t step) {
  std::vector<int32_t> lab(static_cast<size_t>(kT));
  for (int64_t t = 0; t < kT; ++t)
    lab[static_cast<size_t>(t)] = t % period == period - 1 ? -100 : static_cast<int32_t>(t * step % V);
  return Tensor::from_vector(lab, {kT});
}

bool is_bf16_gemm(const gemm::GemmDesc& d) {
  return d.a_type == gemm::DType::BF16 && d.b_type == gemm::DType::BF16 && d.c_type == gemm::DType::F32;
}
bool is_f32_gemm(const gemm::GemmDesc& d) {
  return d.a_type == gemm::DType::F32 && d.b_type == gemm::DType::F32 && d.c_type == gemm::DType::F32;
}

// Ties go to the even neighbour, just above a tie rounds up, the largest finite f32 overflows to
// inf, NaN stays NaN, signed zero and subnormals keep their bits; random values agree with core's
// f32_to_bf16 (the host conversion the CPU side uses).
TEST(CudaBf16Gemm, ActivationRoundingKernelRoundsToNearestEven) {
  const std::vector<std::pair<uint32_t, uint16_t>> known = {
      {0x3f808000u, 0x3f80}, {0x3f818000u, 0x3f82}, {0x3f808001u, 0x3f81}, {0xbf808000u, 0xbf80},
      {0x7f7fffffu, 0x7f80}, {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80}, {0x80000000u, 0x8000},
      {0x00018000u, 0x0002}, {0x3f800000u, 0x3f80}};
  std::vector<float> x;
  for (const auto& [bits, _] : known) x.push_back(f32_from_bits(bits));
  const size_t n_known = x.size();
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> r = random_tensor({1001}, 3, -300.0f, 300.0f).to_vector();
  x.insert(x.end(), r.begin(), r.end());
  std::vector<sim::bf16> got(x.size());
  sim::convert_f32_to_bf16(x.data(), got.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < n_known; ++i) EXPECT_EQ(got[i].bits, known[i].second) << std::hex << known[i].first;
  EXPECT_TRUE(std::isnan(bf16_to_f32(got[n_known].bits)));
  for (size_t i = n_known + 1; i < x.size(); ++i) EXPECT_EQ(got[i].bits, f32_to_bf16(x[i])) << x[i];
}

// A base weight held in bf16: forward y = x·Wᵀ and dx = dy·W are one cuBLASLt call each, with bf16
// A and B and an f32 C; the result is the CPU's f32 product of the bf16-rounded operand, and not
// the product of the unrounded one.
TEST(CudaBf16Gemm, HeldWeightGemmsTakeBf16InputsWithF32Accumulation) {
  SimulatedCudaDevice card;
  const Tensor x = random_tensor({kT, kIn}, 1), W = random_tensor({kOut, kIn}, 2).to(DType::BF16);
  const Tensor dy = random_tensor({kT, kOut}, 3);
  const Tensor xg = gpu(x), Wg = gpu(W), dyg = gpu(dy);
  sim::GemmRecorder rec;
  const Tensor y = linear_forward(xg, Wg, nullptr, nullptr, nullptr);
  ASSERT_EQ(rec.descs().size(), 1u);
  const gemm::GemmDesc f = rec.descs()[0];
  EXPECT_TRUE(is_bf16_gemm(f));
  EXPECT_EQ(f.alpha, 1.0f);
  EXPECT_EQ(f.beta, 0.0f);
  EXPECT_TRUE(f.trans_a && !f.trans_b);  // column-major yᵀ = W·xᵀ
  EXPECT_EQ(f.m, kOut);
  EXPECT_EQ(f.n, kT);
  EXPECT_EQ(f.k, kIn);
  parity::expect_same(y, linear_forward(bf16_rounded(x), W, nullptr, nullptr, nullptr), "y", kTolF32);
  EXPECT_FALSE(all_close(y.to_vector(), linear_forward(x, W, nullptr, nullptr, nullptr).to_vector(), kTolF32));

  Tensor dxg = Tensor::empty({kT, kIn}, DType::F32, kGpu), dx = Tensor::empty({kT, kIn});
  Tensor dx_f32 = Tensor::empty({kT, kIn});
  linear_backward(dyg, xg, Wg, nullptr, nullptr, LinearGrads{&dxg});
  ASSERT_EQ(rec.descs().size(), 2u);
  const gemm::GemmDesc b = rec.descs()[1];
  EXPECT_TRUE(is_bf16_gemm(b));
  EXPECT_TRUE(!b.trans_a && !b.trans_b);  // column-major dxᵀ = Wᵀ·dyᵀ
  EXPECT_EQ(b.m, kIn);
  EXPECT_EQ(b.n, kT);
  EXPECT_EQ(b.k, kOut);
  linear_backward(bf16_rounded(dy), x, W, nullptr, nullptr, LinearGrads{&dx});
  linear_backward(dy, x, W, nullptr, nullptr, LinearGrads{&dx_f32});
  parity::expect_same(dxg, dx, "dx", kTolF32);
  EXPECT_FALSE(all_close(dxg.to_vector(), dx_f32.to_vector(), kTolF32));
}

// LoRA on a bf16 base (the LoRA training path): the base GEMMs are bf16, the rank-r LoRA GEMMs f32.
// y and dx agree with the CPU's all-f32 layer within the bf16 bound; dA and dB, computed from f32
// operands only, within f32 tolerance.
TEST(CudaBf16Gemm, LoraOnABf16BaseMatchesCpuWithinTheBf16Bound) {
  SimulatedCudaDevice card;
  const Tensor x = random_tensor({kT, kIn}, 11), W = random_tensor({kOut, kIn}, 12).to(DType::BF16);
  const Tensor A = random_tensor({kRank, kIn}, 13), B = random_tensor({kOut, kRank}, 14);
  const Tensor dy = random_tensor({kT, kOut}, 15);
  const Tensor xg = gpu(x), Wg = gpu(W), Ag = gpu(A), Bg = gpu(B), dyg = gpu(dy);
  LoraWeights lc{&A, &B, 0.5f, 0.1f, 7, true}, lg{&Ag, &Bg, 0.5f, 0.1f, 7, true};
  LinearSaved sc, sg;
  sim::GemmRecorder rec;
  const Tensor yg = linear_forward(xg, Wg, nullptr, &lg, &sg);
  const Tensor y = linear_forward(x, W, nullptr, &lc, &sc);
  const Tensor W32 = abs_of(W);
  expect_within_bf16_bound(yg, y, linear_forward(abs_of(x), W32, nullptr, nullptr, nullptr), kTolF32, "y");
  Tensor dx = Tensor::empty({kT, kIn}), dA = Tensor::zeros({kRank, kIn}), dB = Tensor::zeros({kOut, kRank});
  Tensor dxg = Tensor::empty({kT, kIn}, DType::F32, kGpu), dAg = gpu(dA), dBg = gpu(dB);
  linear_backward(dyg, xg, Wg, &lg, &sg, LinearGrads{&dxg, nullptr, nullptr, &dAg, &dBg});
  linear_backward(dy, x, W, &lc, &sc, LinearGrads{&dx, nullptr, nullptr, &dA, &dB});
  Tensor dx_bound = Tensor::empty({kT, kIn});
  linear_backward(abs_of(dy), x, W32, nullptr, nullptr, LinearGrads{&dx_bound});
  expect_within_bf16_bound(dxg, dx, dx_bound, kTolF32, "dx");
  parity::expect_same(dAg, dA, "dA", kTolF32);
  parity::expect_same(dBg, dB, "dB", kTolF32);
  int bf16_gemms = 0;
  for (const auto& d : rec.descs()) {
    if (is_bf16_gemm(d)) {
      ++bf16_gemms;
      EXPECT_TRUE(d.k == kIn || d.k == kOut) << "a bf16 GEMM that is not the base weight's, k=" << d.k;
    } else {
      EXPECT_TRUE(is_f32_gemm(d));
      EXPECT_TRUE(d.m == kRank || d.n == kRank || d.k == kRank) << "an f32 GEMM that is not LoRA's";
    }
  }
  EXPECT_EQ(bf16_gemms, 2);  // forward and dx of the base weight
  EXPECT_GT(rec.descs().size(), 2u);
}

// Trainable f32 weights (full fine-tuning): forward, dx and dW are f32 GEMMs (no bf16, no TF32 in
// the description) and agree with the CPU within f32 tolerance.
TEST(CudaBf16Gemm, TrainableF32WeightsStayF32Gemms) {
  SimulatedCudaDevice card;
  const Tensor x = random_tensor({kT, kIn}, 21), W = random_tensor({kOut, kIn}, 22), dy = random_tensor({kT, kOut}, 23);
  const Tensor xg = gpu(x), Wg = gpu(W), dyg = gpu(dy);
  sim::GemmRecorder rec;
  parity::expect_same(linear_forward(xg, Wg, nullptr, nullptr, nullptr),
                      linear_forward(x, W, nullptr, nullptr, nullptr), "y", kTolF32);
  Tensor dx = Tensor::empty({kT, kIn}), dW = random_tensor({kOut, kIn}, 24);
  Tensor dxg = Tensor::empty({kT, kIn}, DType::F32, kGpu), dWg = gpu(dW);
  linear_backward(dy, x, W, nullptr, nullptr, LinearGrads{&dx, &dW});
  linear_backward(dyg, xg, Wg, nullptr, nullptr, LinearGrads{&dxg, &dWg});
  parity::expect_same(dxg, dx, "dx", kTolF32);
  parity::expect_same(dWg, dW, "dW", kTolF32);
  ASSERT_EQ(rec.descs().size(), 3u);
  for (const auto& d : rec.descs()) EXPECT_TRUE(is_f32_gemm(d));
}

// Full fine-tuning with training.matmul_dtype bf16 (model/transformer.h): the layer reads the bf16
// GEMM copy of an f32 master, and dW (the master's f32 gradient, beta 1) is a bf16 GEMM too: both
// operands rounded, f32 accumulation, exactly the CPU's f32 product of the rounded operands and not
// the unrounded one. Its workspace is the two bf16 operands (cuda_workspace::narrow_dW_operand_bytes,
// what the memory plan counts). On a Turing card (no bf16 tensor cores; the trainer makes no copies
// there) the same call is the f32 GEMM.
TEST(CudaBf16Gemm, Bf16CopyOfATrainableWeightTakesBf16GemmsForItsGradient) {
  SimulatedCudaDevice card;
  const Tensor x = random_tensor({kT, kIn}, 51), W = random_tensor({kOut, kIn}, 52), dy = random_tensor({kT, kOut}, 53);
  const Tensor copy = W.to(DType::BF16), prior = random_tensor({kOut, kIn}, 54);
  const Tensor xg = gpu(x), copyg = gpu(copy), dyg = gpu(dy);
  Tensor dxg = Tensor::empty({kT, kIn}, DType::F32, kGpu), dWg = gpu(prior);
  {
    sim::GemmRecorder rec;
    const uint64_t launches = sim::launch_count();
    linear_backward(dyg, xg, copyg, nullptr, nullptr, LinearGrads{&dxg, &dWg});
    EXPECT_EQ(sim::launch_count() - launches, 2u) << "dy rounded once for dx and dW, x once";
    ASSERT_EQ(rec.descs().size(), 2u);
    for (const auto& d : rec.descs()) EXPECT_TRUE(is_bf16_gemm(d));
    const gemm::GemmDesc w = rec.descs()[1];
    EXPECT_EQ(w.k, kT) << "the dW GEMM sums over the tokens";
    EXPECT_EQ(w.beta, 1.0f) << "dW accumulates";
  }
  Tensor dW = prior.clone(), dW_unrounded = prior.clone();
  linear_backward(bf16_rounded(dy), bf16_rounded(x), W, nullptr, nullptr, LinearGrads{nullptr, &dW});
  linear_backward(dy, x, W, nullptr, nullptr, LinearGrads{nullptr, &dW_unrounded});
  parity::expect_same(dWg, dW, "dW", kTolF32);
  EXPECT_FALSE(all_close(dWg.to_vector(), dW_unrounded.to_vector(), kTolF32)) << "dW's operands were not rounded";
  for (Tensor* dx : {static_cast<Tensor*>(nullptr), &dxg})
    EXPECT_EQ(scratch_of(card,
                         [&] {
                           linear_backward(dyg, xg, copyg, nullptr, nullptr, LinearGrads{dx, &dWg});
                         }),
              cuda_workspace::narrow_dW_operand_bytes(kT, kIn, kOut));
  Tensor dx_ref = Tensor::empty({kT, kIn});
  linear_backward(bf16_rounded(dy), x, copy, nullptr, nullptr, LinearGrads{&dx_ref});
  parity::expect_same(dxg, dx_ref, "dx", kTolF32);

  SimulatedComputeCapability t4(7, 5);
  Tensor dWt = gpu(prior), dW_f32 = prior.clone();
  sim::GemmRecorder turing;
  linear_backward(dyg, xg, copyg, nullptr, nullptr, LinearGrads{nullptr, &dWt});
  ASSERT_EQ(turing.descs().size(), 1u);
  EXPECT_TRUE(is_f32_gemm(turing.descs()[0]));
  linear_backward(dy, x, W, nullptr, nullptr, LinearGrads{nullptr, &dW_f32});
  parity::expect_same(dWt, dW_f32, "dW on a Turing card", kTolF32);
}

// A producer's bf16 copy of the GEMM input (ops/linear.h x_bf16, dy_bf16: RMSNorm's and SwiGLU's
// bf16 outputs) is read instead of rounding the f32 tensor: the same bits out, one launch and the
// operand's workspace fewer per call, over a held bf16 weight and a trainable one's GEMM copy (dx
// and dW share it). GEMMs that do not take bf16 (an f32 weight, a Turing card's f16) read the f32
// tensor as before. A copy of another shape is refused.
TEST(CudaBf16Gemm, AProducersBf16CopyIsReadInsteadOfRoundingWithTheSameBits) {
  SimulatedCudaDevice card;
  const Tensor xg = gpu(random_tensor({kT, kIn}, 81)), dyg = gpu(random_tensor({kT, kOut}, 82));
  const Tensor W = gpu(random_tensor({kOut, kIn}, 83).to(DType::BF16));
  Tensor x16 = Tensor::empty({kT, kIn}, DType::BF16, kGpu), dy16 = Tensor::empty({kT, kOut}, DType::BF16, kGpu);
  round_to_bf16(xg, x16);
  round_to_bf16(dyg, dy16);
  EXPECT_TRUE(held_gemms_read_bf16(W));
  const auto same_bits = [](const Tensor& a, const Tensor& b, const std::string& what) {
    EXPECT_EQ(a.to_vector(), b.to_vector()) << what;
  };
  // Forward.
  uint64_t before = sim::launch_count();
  const Tensor y = linear_forward(xg, W, nullptr, nullptr, nullptr);
  const uint64_t rounding = sim::launch_count() - before;
  before = sim::launch_count();
  const Tensor y_given = linear_forward(xg, W, nullptr, nullptr, nullptr, &x16);
  EXPECT_EQ(sim::launch_count() - before, rounding - 1) << "x is not rounded again";
  same_bits(y_given, y, "y");
  EXPECT_EQ(scratch_of(card, [&] { linear_forward(xg, W, nullptr, nullptr, nullptr, &x16); }),
            static_cast<size_t>(kT * kOut) * 4)
      << "only y: no operand workspace";
  // Backward: dx over a held weight, dx and dW over a trainable weight's GEMM copy.
  Tensor dx = Tensor::empty({kT, kIn}, DType::F32, kGpu), dx_given = Tensor::empty({kT, kIn}, DType::F32, kGpu);
  linear_backward(dyg, xg, W, nullptr, nullptr, LinearGrads{&dx});
  before = sim::launch_count();
  linear_backward(dyg, xg, W, nullptr, nullptr, LinearGrads{&dx_given}, &dy16);
  EXPECT_EQ(sim::launch_count() - before, 0u) << "nothing rounded for dx";
  same_bits(dx_given, dx, "dx");
  const Tensor prior = random_tensor({kOut, kIn}, 84);
  Tensor dW = gpu(prior), dW_given = gpu(prior);
  linear_backward(dyg, xg, W, nullptr, nullptr, LinearGrads{&dx, &dW});
  before = sim::launch_count();
  linear_backward(dyg, xg, W, nullptr, nullptr, LinearGrads{&dx_given, &dW_given}, &dy16);
  EXPECT_EQ(sim::launch_count() - before, 1u) << "x rounded for dW, dy not";
  same_bits(dx_given, dx, "dx beside dW");
  same_bits(dW_given, dW, "dW");
  EXPECT_EQ(scratch_of(card,
                       [&] {
                         linear_backward(dyg, xg, W, nullptr, nullptr, LinearGrads{&dx, &dW_given}, &dy16);
                       }),
            cuda_workspace::narrow_dW_operand_bytes(kT, kIn, kOut, true));
  // x's copy as the forward kept it (full fine-tuning): dW rounds nothing either, same bits, and
  // the dW GEMM needs no workspace for its operands.
  Tensor dW_both = gpu(prior), dx_both = Tensor::empty({kT, kIn}, DType::F32, kGpu);
  before = sim::launch_count();
  linear_backward(dyg, xg, W, nullptr, nullptr, LinearGrads{&dx_both, &dW_both}, &dy16, &x16);
  EXPECT_EQ(sim::launch_count() - before, 0u) << "neither x nor dy rounded";
  same_bits(dx_both, dx, "dx beside dW, both copies given");
  same_bits(dW_both, dW, "dW, both copies given");
  EXPECT_EQ(cuda_workspace::narrow_dW_operand_bytes(kT, kIn, kOut, true, true), 0u);
  EXPECT_EQ(scratch_of(card,
                       [&] {
                         linear_backward(dyg, xg, W, nullptr, nullptr, LinearGrads{&dx, &dW_both}, &dy16, &x16);
                       }),
            0u);
  EXPECT_EQ(scratch_of(card,
                       [&] {
                         linear_backward(dyg, xg, W, nullptr, nullptr, LinearGrads{&dx, &dW_both}, nullptr, &x16);
                       }),
            cuda_workspace::narrow_dW_operand_bytes(kT, kIn, kOut, false, true))
      << "dy rounded, x given";
  // x's copy alone, x itself undefined (full fine-tuning drops the f32 xn, hn and m once their
  // copies exist): the same bits. Refused where something would read the f32 x: no copy given, an
  // f32 weight, LoRA, an f16 card.
  Tensor dW_alone = gpu(prior), dx_alone = Tensor::empty({kT, kIn}, DType::F32, kGpu);
  linear_backward(dyg, Tensor(), W, nullptr, nullptr, LinearGrads{&dx_alone, &dW_alone}, &dy16, &x16);
  same_bits(dx_alone, dx, "dx from x's copy alone");
  same_bits(dW_alone, dW, "dW from x's copy alone");
  const Tensor W32_ = gpu(random_tensor({kOut, kIn}, 86));
  const Tensor A = gpu(random_tensor({4, kIn}, 87)), B = gpu(random_tensor({kOut, 4}, 88));
  const LoraWeights lora{&A, &B, 2.0f};
  const auto refused = [&](const std::string& what, auto&& call) {
    try {
      call();
      ADD_FAILURE() << what << ": backward without x was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::RUNTIME_INTERNAL) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("without x"), std::string::npos) << e.what();
    }
  };
  refused("no copy", [&] { linear_backward(dyg, Tensor(), W, nullptr, nullptr, LinearGrads{&dx_alone}, &dy16); });
  refused("an f32 weight",
          [&] { linear_backward(dyg, Tensor(), W32_, nullptr, nullptr, LinearGrads{&dx_alone}, nullptr, &x16); });
  refused("LoRA", [&] { linear_backward(dyg, Tensor(), W, &lora, nullptr, LinearGrads{&dx_alone}, &dy16, &x16); });
  {
    SimulatedComputeCapability t4(7, 5);
    refused("an f16 card",
            [&] { linear_backward(dyg, Tensor(), W, nullptr, nullptr, LinearGrads{&dx_alone}, &dy16, &x16); });
  }
  // An f32 weight, and an f16 card: the copy is not what their GEMMs read.
  const Tensor W32 = gpu(random_tensor({kOut, kIn}, 85));
  EXPECT_FALSE(held_gemms_read_bf16(W32));
  same_bits(linear_forward(xg, W32, nullptr, nullptr, nullptr, &x16),
            linear_forward(xg, W32, nullptr, nullptr, nullptr), "y over an f32 weight");
  {
    SimulatedComputeCapability t4(7, 5);
    EXPECT_FALSE(held_gemms_read_bf16(W));
    sim::GemmRecorder rec;
    same_bits(linear_forward(xg, W, nullptr, nullptr, nullptr, &x16), linear_forward(xg, W, nullptr, nullptr, nullptr),
              "y on an f16 card");
    for (const auto& d : rec.descs()) EXPECT_EQ(d.b_type, gemm::DType::F16) << "the f16 card's GEMMs took the copy";
  }
  const Tensor wrong = Tensor::empty({kT, kOut}, DType::BF16, kGpu);
  for (const Tensor* bad : {&wrong, &xg}) {  // another shape; f32, not bf16
    for (const bool backward : {false, true}) {
      try {
        if (backward)
          linear_backward(dyg, xg, W, nullptr, nullptr, LinearGrads{&dx, &dW_both}, nullptr, bad);
        else
          linear_forward(xg, W, nullptr, nullptr, nullptr, bad);
        ADD_FAILURE() << "a wrong x_bf16 was taken: " << bad->describe();
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::RUNTIME_INTERNAL) << e.what();
        EXPECT_NE(std::string(e.what()).find("x_bf16"), std::string::npos) << e.what();
      }
    }
  }
}

// The copy itself: round_to_bf16 on the card gives the CPU's bits (core's f32_to_bf16), NaN included.
TEST(CudaBf16Gemm, GemmCopyRoundingMatchesTheCpuBitForBit) {
  SimulatedCudaDevice card;
  std::vector<float> v = random_tensor({777}, 61, -5.0f, 5.0f).to_vector();
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  v.push_back(3.4028235e38f);
  const Tensor src = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  Tensor cpu = Tensor::empty(src.shape(), DType::BF16), dev = Tensor::empty(src.shape(), DType::BF16, kGpu);
  round_to_bf16(src, cpu);
  round_to_bf16(gpu(src), dev);
  const Tensor back = dev.to(Device{});
  ASSERT_EQ(back.nbytes(), cpu.nbytes());
  EXPECT_EQ(std::memcmp(back.raw(), cpu.raw(), cpu.nbytes()), 0);
}

// A trainable head through its bf16 copy: the fused loss's bf16 instantiation gives dW too (bf16
// inputs, the logits' gradient stored bf16, f32 accumulation into the master's gradient), within
// the bound the gradient's rounding allows of the CPU's product over the rounded x and head; the
// f32-panel path of a card whose GEMMs take f16 refuses a gradient rather than dropping it.
TEST(CudaBf16Gemm, CrossEntropyOverABf16CopyOfATrainableHeadGivesItsGradient) {
  SimulatedCudaDevice card;
  const int64_t V = 101, chunk = 8;
  const Tensor x = random_tensor({kT, kIn}, 71, -2.0f, 2.0f), W = random_tensor({V, kIn}, 72).to(DType::BF16);
  const Tensor labels = head_labels(V, 5, 7);
  const float scale = 1.0f / 30.0f;
  const Tensor prior = random_tensor({V, kIn}, 73);
  Tensor dxg = Tensor::empty({kT, kIn}, DType::F32, kGpu), dWg = gpu(prior);
  Tensor dx = Tensor::empty({kT, kIn}), dW = prior.clone();
  sim::GemmRecorder rec;
  linear_cross_entropy_forward_backward(gpu(x), gpu(W), gpu(labels), scale, dxg, &dWg, chunk);
  int dW_gemms = 0;
  for (const auto& d : rec.descs()) {
    EXPECT_TRUE(d.a_type == gemm::DType::BF16 && d.b_type == gemm::DType::BF16);
    dW_gemms += d.beta == 1.0f;
  }
  EXPECT_GT(dW_gemms, 0) << "no dW GEMM ran";
  linear_cross_entropy_forward_backward(bf16_rounded(x), W, labels, scale, dx, &dW, chunk);
  // dW[v, d] = Σ_t g[t, v]·x[t, d] with each g rounded (2⁻⁹ of itself, |g| ≤ scale): within
  // 2⁻⁸·scale·Σ_t |x[t, d]| ≤ 2⁻⁸·scale·T·2.
  const Tolerance bound{std::ldexp(scale * kT * 2.0, -8) + 1e-6, 0};
  EXPECT_TRUE(all_close(dWg.to_vector(), dW.to_vector(), bound));
  EXPECT_FALSE(all_close(dWg.to_vector(), prior.to_vector(), bound)) << "dW moved";

  SimulatedComputeCapability t4(7, 5);
  Tensor dWt = gpu(prior);
  try {
    linear_cross_entropy_forward_backward(gpu(x), gpu(W), gpu(labels), scale, dxg, &dWt, chunk);
    ADD_FAILURE() << "a bf16 head on an f16 card took a gradient request it cannot serve";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_INTERNAL) << e.what();
  }
}

// The bf16 copy of the activation is device memory from the CUDA allocator, exactly the bytes
// cuda_workspace (backend/cuda/device_workspace.h, what a device memory plan counts) says:
// forward, dx, and the fused LM head + loss with and without dx, over bf16 and over f32 weights.
TEST(CudaBf16Gemm, WorkspaceIsCountedAndMatchesTheDeviceWorkspaceFormulas) {
  SimulatedCudaDevice card;
  const int64_t V = 101, chunk = 8;
  const Tensor x = gpu(random_tensor({kT, kIn}, 31)), dy = gpu(random_tensor({kT, kOut}, 33));
  std::vector<int32_t> lab(static_cast<size_t>(kT), 5);
  const Tensor labels = gpu(Tensor::from_vector(lab, {kT}));
  for (DType held : {DType::BF16, DType::F32}) {
    const std::string at = dtype_name(held);
    const Tensor W = gpu(random_tensor({kOut, kIn}, 32).to(held)), head = gpu(random_tensor({V, kIn}, 34).to(held));
    Tensor dx = Tensor::empty({kT, kIn}, DType::F32, kGpu);
    // y is the front-end's output: allocated inside the call, so it is part of the forward's peak.
    EXPECT_EQ(scratch_of(card, [&] { linear_forward(x, W, nullptr, nullptr, nullptr); }),
              static_cast<size_t>(kT * kOut) * 4 + cuda_workspace::held_gemm_operand_bytes(held, kT, kIn))
        << at;
    EXPECT_EQ(scratch_of(card, [&] { linear_backward(dy, x, W, nullptr, nullptr, LinearGrads{&dx}); }),
              cuda_workspace::held_gemm_operand_bytes(held, kT, kOut))
        << at;
    EXPECT_EQ(
        scratch_of(card, [&] { linear_cross_entropy_forward_backward(x, head, labels, 0.5f, dx, nullptr, chunk); }),
        cuda_workspace::cross_entropy_bytes(held, kT, kIn, V, chunk, true))
        << at;
    EXPECT_EQ(scratch_of(card, [&] { linear_cross_entropy_forward(x, head, labels, chunk); }),
              cuda_workspace::cross_entropy_bytes(held, kT, kIn, V, chunk, false))
        << at;
  }
  EXPECT_GT(cuda_workspace::held_gemm_operand_bytes(DType::BF16, kT, kIn), 0u);  // the bf16 cases had a copy
}

// A quantized weight's GEMMs: the activation's bf16 copy and one reused bf16 panel, both counted.
// 768 columns (whole q8_0 and q4_K blocks) and 257 rows: with 2^17-value panels, a panel of 168
// rows, so two panels.
TEST(CudaBf16Gemm, QuantizedWeightsPanelsAreCountedWorkspace) {
  SimulatedCudaDevice card;
  const ScopedHeldPanelValues small_panels(kSmallPanelValues);
  const int64_t in = 768, out = 257;
  const Tensor x = gpu(random_tensor({kT, in}, 35)), dy = gpu(random_tensor({kT, out}, 36));
  for (DType held : {DType::Q8_0, DType::Q4_K, DType::F16}) {
    const std::string at = dtype_name(held);
    const Tensor W = gpu(random_tensor({out, in}, 37).to(held));
    Tensor dx = Tensor::empty({kT, in}, DType::F32, kGpu);
    EXPECT_EQ(scratch_of(card, [&] { linear_forward(x, W, nullptr, nullptr, nullptr); }),
              static_cast<size_t>(kT * out) * 4 + cuda_workspace::held_gemm_operand_bytes(held, kT, in) +
                  cuda_workspace::held_gemm_panel_bytes(held, out, in))
        << at;
    EXPECT_EQ(
        scratch_of(card, [&] { linear_backward(dy, x, W, nullptr, nullptr, LinearGrads{&dx}); }),
        cuda_workspace::held_gemm_operand_bytes(held, kT, out) + cuda_workspace::held_gemm_panel_bytes(held, out, in))
        << at;
  }
  // 2^17 / 768 = 170 whole rows, rounded down to a multiple of 8 (the other operands stay aligned).
  EXPECT_EQ(cuda_workspace::held_gemm_panel_bytes(DType::Q8_0, 257, 768), size_t{168} * 768 * 2);
}

// How many panels (a dequantize launch and a GEMM each) a quantized weight's GEMMs take: one for a
// weight within the card's panel budget, however wide; ceil(rows / panel rows) past it. At the
// CPU's tile size (2^17 values) a [1024, 512] q8_0 weight was 4 panels; with the card's default it
// is one. And the layer shapes of Qwen2.5-0.5B are whole panels, the 1.5B's MLP two.
TEST(CudaBf16Gemm, AQuantizedWeightWithinThePanelBudgetIsOnePanel) {
  SimulatedCudaDevice card;
  const int64_t in = 512, out = 1024;
  const Tensor x = gpu(random_tensor({kT, in}, 51)), dy = gpu(random_tensor({kT, out}, 52));
  const Tensor W = gpu(random_tensor({out, in}, 53).to(DType::Q8_0));
  Tensor dx = Tensor::empty({kT, in}, DType::F32, kGpu);
  auto counts_of = [&](const std::function<void()>& f) {
    const sim::RuntimeCounts before = sim::runtime_counts();
    f();
    return sim::runtime_counts() - before;
  };
  auto forward = [&] { linear_forward(x, W, nullptr, nullptr, nullptr); };
  auto backward = [&] { linear_backward(dy, x, W, nullptr, nullptr, LinearGrads{&dx}); };
  // One launch rounds the activation to bf16; then a dequantize launch and a GEMM per panel.
  for (const auto& [values, panels] :
       {std::pair<int64_t, uint64_t>{cuda_workspace::kDefaultHeldPanelValues, 1}, {kSmallPanelValues, 4}}) {
    const ScopedHeldPanelValues budget(values);
    const std::string at = "panel budget " + std::to_string(values);
    for (const auto& pass : {std::function<void()>(forward), std::function<void()>(backward)}) {
      const sim::RuntimeCounts c = counts_of(pass);
      EXPECT_EQ(c.gemms, panels) << at;
      EXPECT_EQ(c.kernel_launches, 1 + panels) << at;
    }
  }
  EXPECT_EQ(cuda_workspace::held_panel_values(), cuda_workspace::kDefaultHeldPanelValues) << "the guard restores";
  // Qwen2.5-0.5B (D 896, F 4864, kv 128) and -1.5B (D 1536, F 8960) at the card's default.
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{896, 896}, {128, 896}, {4864, 896}, {896, 4864}})
    EXPECT_EQ(cuda_workspace::held_panel_rows(rows, cols), rows) << rows << "x" << cols;
  EXPECT_EQ((8960 + cuda_workspace::held_panel_rows(8960, 1536) - 1) / cuda_workspace::held_panel_rows(8960, 1536), 2);
}

// The fused LM head + loss over a head held in bf16 (tied embeddings in LoRA training): its GEMMs
// are bf16 in, f32 out, so the loss is the CPU's over the bf16-rounded x (logits are f32 on both
// sides) and not the one over x itself. dx = G·W with the logits' gradient G stored as bf16, and dx
// rounded to bf16 before it is widened: each G element moves by at most u = 2⁻⁹ of itself and a row
// of G sums to at most 2·grad_scale in absolute value, so both roundings together move dx by at most
// 2u·2·grad_scale·max|W| (checked with another factor 2 for f32 sums).
TEST(CudaBf16Gemm, CrossEntropyOverABf16HeadTakesBf16Inputs) {
  SimulatedCudaDevice card;
  const int64_t V = 101, chunk = 8;
  const Tensor x = random_tensor({kT, kIn}, 41, -2.0f, 2.0f), W = random_tensor({V, kIn}, 42).to(DType::BF16);
  const Tensor labels = head_labels(V, 4, 13);
  const float scale = 1.0f / 28.0f;
  Tensor dxg = Tensor::empty({kT, kIn}, DType::F32, kGpu), dx = Tensor::empty({kT, kIn});
  Tensor dx_f32 = Tensor::empty({kT, kIn});
  sim::GemmRecorder rec;
  const auto got = linear_cross_entropy_forward_backward(gpu(x), gpu(W), gpu(labels), scale, dxg, nullptr, chunk);
  // Per window with labels: logits (bf16 in, f32 out), then dx (bf16 in, bf16 out: widened after).
  ASSERT_FALSE(rec.descs().empty());
  int logits_gemms = 0;
  for (const auto& d : rec.descs()) {
    EXPECT_TRUE(d.a_type == gemm::DType::BF16 && d.b_type == gemm::DType::BF16);
    logits_gemms += is_bf16_gemm(d) && d.m == V;
  }
  EXPECT_EQ(logits_gemms * 2, static_cast<int>(rec.descs().size()));
  const auto ref = linear_cross_entropy_forward_backward(bf16_rounded(x), W, labels, scale, dx, nullptr, chunk);
  const auto unrounded = linear_cross_entropy_forward_backward(x, W, labels, scale, dx_f32, nullptr, chunk);
  EXPECT_EQ(got.n_counted, ref.n_counted);
  EXPECT_NEAR(got.loss_sum, ref.loss_sum, 1e-5 * std::abs(ref.loss_sum));
  EXPECT_GT(std::abs(got.loss_sum - unrounded.loss_sum), 1e-5 * std::abs(ref.loss_sum)) << "x was not rounded";
  float w_max = 0;
  for (float w : W.to(DType::F32).to_vector()) w_max = std::max(w_max, std::fabs(w));
  const Tolerance g_bound{std::ldexp(2.0 * scale * w_max, -6) + 1e-6, 0};
  EXPECT_TRUE(all_close(dxg.to_vector(), dx.to_vector(), g_bound));
  EXPECT_FALSE(all_close(dxg.to_vector(), dx.to_vector(), kTolF32)) << "the logits' gradient was not bf16";
}

}  // namespace
}  // namespace bp::test
