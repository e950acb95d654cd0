// A Turing card (compute capability 7.5, the T4: tensor cores without bf16) on the simulation: the
// GEMMs against frozen weights take f16 inputs with f32 accumulation (backend/cuda/kernel_wrappers.h):
// every held type, bf16 included, read through f16 panels, and the f32 activation operand scaled
// by a power of two into f16's range before it is rounded, the GEMM's alpha undoing the scale.
// Checked here: the descriptions handed to cuBLASLt are f16 (recorded, sim/gemm_sim.h) and carry
// alpha = 2^-s, read from device memory (device pointer mode: the scale is chosen on the device,
// the host never reads it); results agree with the CPU's f32 layer within the f16 bound, also for activations
// of 1e5 and gradients of 1e-9, where plain rounding to f16 gives inf and zeros (shown by running
// the same description on the naively rounded operand); the workspace is what cuda_workspace
// counts for an f16 card; the fused LM head over a bf16 head takes f32 panels; the simulation's
// f16 rounding is core's, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/cuda/compute_precision.h"
#include "backend/cuda/device_workspace.h"
#include "backend/cuda/sim/gemm_reference.h"
#include "backend/cuda/sim/gemm_sim.h"
#include "core/dtype.h"
#include "op_parity.h"
#include "ops/device_compute.h"
#include "sim_device.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

using parity::gpu;
using parity::kGpu;

constexpr int64_t kT = 37, kIn = 71, kOut = 45;  // odd sizes

Tensor abs_of(const Tensor& t) {
  std::vector<float> v = t.to(DType::F32).to_vector();
  for (float& e : v) e = std::fabs(e);
  return Tensor::from_vector(v, t.shape());
}
Tensor scaled(const Tensor& t, float s) {
  std::vector<float> v = t.to_vector();
  for (float& e : v) e *= s;
  return Tensor::from_vector(v, t.shape());
}

// |got − ref| ≤ 2⁻¹⁰·bound + atol element by element, bound = Σ|a|·|b|: rounding the activation to
// f16 (unit roundoff 2⁻¹¹, the scale being a power of two) moves each product by at most 2⁻¹¹ of
// itself; bf16 weights are f16 values exactly (8 significant bits of 11); factor 2 for f32 sums in
// another order.
void expect_within_f16_bound(const Tensor& got, const Tensor& ref, const Tensor& bound, float atol,
                             const std::string& what) {
  const auto g = got.to_vector(), r = ref.to_vector(), b = bound.to_vector();
  ASSERT_EQ(g.size(), r.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - r[i]) <= std::ldexp(b[i], -10) + atol)) ++bad;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << g.size() << " values outside the f16 bound";
}

bool is_f16_gemm(const gemm::GemmDesc& d) {
  return d.a_type == gemm::DType::F16 && d.b_type == gemm::DType::F16 && d.c_type == gemm::DType::F32;
}

// sim's __float2half is core's f32_to_f16 (round to nearest even, inf from 65520 on, subnormals
// down to 2^-24, NaN kept), on edge cases and 20000 random bit patterns; __half2float inverts it.
TEST(CudaF16Gemm, SimulatedF16RoundingIsCores) {
  std::vector<float> x = {65504.0f,
                          65519.0f,
                          65520.0f,
                          1e5f,
                          6.1035156e-5f,
                          5.9604645e-8f,
                          2.9802322e-8f,
                          2.9802326e-8f,
                          1e-9f,
                          -0.0f,
                          1.0f + std::ldexp(1.0f, -11),
                          1.0f + 3 * std::ldexp(1.0f, -11),
                          std::numeric_limits<float>::infinity(),
                          -65520.0f};
  uint32_t state = 99;
  for (int i = 0; i < 20000; ++i) {
    state = state * 1664525u + 1013904223u;
    x.push_back(f32_from_bits((state & 0x8fffffffu) | ((state >> 3) & 0x30000000u)));  // exponents around f16's
  }
  for (float v : x) {
    EXPECT_EQ(sim::__float2half(v).bits, f32_to_f16(v)) << v;
    EXPECT_EQ(sim::__half2float(sim::__float2half(v)), f16_to_f32(f32_to_f16(v))) << v;
  }
  EXPECT_TRUE(std::isnan(sim::__half2float(sim::__float2half(std::numeric_limits<float>::quiet_NaN()))));
}

// The scale exponent puts max|x| in [2^13, 2^14) for maxima across f32's range; zero, Inf and NaN
// get 2^0.
TEST(CudaF16Gemm, ScaleExponentPutsTheMaximumJustBelow2To14) {
  for (float m : {1e-30f, 1e-9f, 3e-5f, 0.7f, 1.0f, 8191.9f, 8192.0f, 16383.0f, 1e5f, 3e30f}) {
    const float s = std::ldexp(m, sim::f16_scale_exponent(m));
    EXPECT_GE(s, 8192.0f) << m;
    EXPECT_LT(s, 16384.0f) << m;
  }
  EXPECT_EQ(sim::f16_scale_exponent(0.0f), 0);
  EXPECT_EQ(sim::f16_scale_exponent(std::numeric_limits<float>::infinity()), 0);
  EXPECT_EQ(sim::f16_scale_exponent(std::numeric_limits<float>::quiet_NaN()), 0);
  // The exponent comes from max|x|'s bits (integer arithmetic, the same on the device): it is
  // frexp's, clamped, for every power of two and its neighbours, subnormals included.
  for (int p = -149; p <= 127; ++p)
    for (float m : {std::ldexp(1.0f, p), std::nextafter(std::ldexp(1.0f, p), 0.0f),
                    std::nextafter(std::ldexp(1.0f, p), std::numeric_limits<float>::infinity())}) {
      if (!(m > 0.0f) || !std::isfinite(m)) continue;
      int e = 0;
      std::frexp(m, &e);
      EXPECT_EQ(sim::f16_scale_exponent(m), std::clamp(14 - e, -120, 120)) << m;
    }
}

// Device pointer mode: the simulated cuBLASLt reads alpha and beta from the card when the GEMM
// runs (the values there, not the description's), and an address outside the card's memory faults.
TEST(CudaF16Gemm, DevicePointerModeReadsAlphaAndBetaFromTheCard) {
  SimulatedCudaDevice card;
  const std::vector<float> a{1, 2, 3, 4}, b{5, 6, 7, 8};  // 2x2 column-major
  Tensor A = Tensor::from_vector(a, {4}).to(kGpu), B = Tensor::from_vector(b, {4}).to(kGpu);
  Tensor C = Tensor::from_vector(std::vector<float>{1, 1, 1, 1}, {4}).to(kGpu);
  Tensor pair = Tensor::from_vector(std::vector<float>{0.5f, 2.0f}, {2}).to(kGpu);
  gemm::GemmDesc d;
  d.m = d.n = d.k = 2;
  d.lda = d.ldb = d.ldc = 2;
  d.alpha = 100.0f;  // ignored in device pointer mode
  d.alpha_beta_on_device = pair.kernel_data<float>();
  sim::gemm(d, A.kernel_raw(), B.kernel_raw(), C.kernel_raw(), nullptr, 0, nullptr);
  // C = 0.5·A·B + 2·C; A·B column-major = [[23, 31], [34, 46]] (rows), stored [23, 34, 31, 46].
  EXPECT_EQ(C.to_vector(), (std::vector<float>{13.5f, 19.0f, 17.5f, 25.0f}));
  float host_pair[2] = {1.0f, 0.0f};
  d.alpha_beta_on_device = host_pair;
  EXPECT_EQ(parity::code_of([&] { sim::gemm(d, A.kernel_raw(), B.kernel_raw(), C.kernel_raw(), nullptr, 0, nullptr); }),
            ErrorCode::RUNTIME_GPU_KERNEL_FAULT);
}

// A bf16 base weight on a Turing card: forward and dx are one f16 GEMM each (f16 A and B, f32 C;
// the bf16 weight read through an f16 panel), alpha = 2^-s of the activation's scale; both agree
// with the CPU's f32 layer within the f16 bound. The same calls on the default 8.0 card are bf16.
TEST(CudaF16Gemm, HeldWeightGemmsOnATuringCardTakeF16Inputs) {
  SimulatedCudaDevice card;
  SimulatedComputeCapability turing(7, 5);
  EXPECT_TRUE(ops::cuda_frozen_gemms_in_f16());
  const Tensor x = random_tensor({kT, kIn}, 1), W = random_tensor({kOut, kIn}, 2).to(DType::BF16);
  const Tensor dy = random_tensor({kT, kOut}, 3);
  sim::GemmRecorder rec;
  const Tensor y = linear_forward(gpu(x), gpu(W), nullptr, nullptr, nullptr);
  Tensor dxg = Tensor::empty({kT, kIn}, DType::F32, kGpu), dx = Tensor::empty({kT, kIn});
  linear_backward(gpu(dy), gpu(x), gpu(W), nullptr, nullptr, LinearGrads{&dxg});
  ASSERT_EQ(rec.descs().size(), 2u);
  for (const auto& d : rec.descs()) {
    EXPECT_TRUE(is_f16_gemm(d));
    // The scale was chosen on the device: the GEMM reads (alpha, beta) from device memory (what
    // the recorder shows is what it read there), so the host never waited for max|x|.
    EXPECT_NE(d.alpha_beta_on_device, nullptr) << "alpha came from the host";
    EXPECT_EQ(d.beta, 0.0f);
    int e = 0;
    EXPECT_EQ(std::frexp(d.alpha, &e), 0.5f) << "alpha is not a power of two: " << d.alpha;
  }
  // random_tensor's values lie in [-1, 1): max|x| just below 1 is scaled by 2^14, so alpha = 2^-14.
  EXPECT_EQ(rec.descs()[0].alpha, std::ldexp(1.0f, -14));
  const Tensor W32 = W.to(DType::F32), Wabs = abs_of(W);
  expect_within_f16_bound(y, linear_forward(x, W32, nullptr, nullptr, nullptr),
                          linear_forward(abs_of(x), Wabs, nullptr, nullptr, nullptr), 1e-6f, "y");
  linear_backward(dy, x, W32, nullptr, nullptr, LinearGrads{&dx});
  Tensor bound = Tensor::empty({kT, kIn});
  linear_backward(abs_of(dy), x, Wabs, nullptr, nullptr, LinearGrads{&bound});
  expect_within_f16_bound(dxg, dx, bound, 1e-6f, "dx");
  EXPECT_FALSE(
      all_close(y.to_vector(), linear_forward(x, W32, nullptr, nullptr, nullptr).to_vector(), Tolerance{1e-7, 0}))
      << "the f16 rounding left no trace: was the GEMM really f16?";

  sim::set_compute_capability(8, 0);
  EXPECT_FALSE(ops::cuda_frozen_gemms_in_f16());
  (void)linear_forward(gpu(x), gpu(W), nullptr, nullptr, nullptr);
  ASSERT_EQ(rec.descs().size(), 3u);
  EXPECT_EQ(rec.descs()[2].a_type, gemm::DType::BF16);
}

// f16's range: activations of 1e5 overflow it (max 65504) and gradients of 1e-9 vanish in it
// (smallest subnormal 6e-8). The scaled operand gives the f32 result within the f16 bound; the same
// GEMM description run over the plainly rounded operand (alpha 1) gives inf and zeros.
TEST(CudaF16Gemm, ScaledOperandsSurviveValuesOutsideF16sRange) {
  SimulatedCudaDevice card;
  SimulatedComputeCapability turing(7, 5);
  const Tensor x = scaled(random_tensor({kT, kIn}, 5), 1.5e5f), W = random_tensor({kOut, kIn}, 6).to(DType::BF16);
  const Tensor dy = scaled(random_tensor({kT, kOut}, 7), 2e-9f);
  const Tensor W32 = W.to(DType::F32), Wabs = abs_of(W);
  sim::GemmRecorder rec;
  const Tensor y = linear_forward(gpu(x), gpu(W), nullptr, nullptr, nullptr);
  const Tensor y_ref = linear_forward(x, W32, nullptr, nullptr, nullptr);
  const Tensor y_bound = linear_forward(abs_of(x), Wabs, nullptr, nullptr, nullptr);
  expect_within_f16_bound(y, y_ref, y_bound, 0.0f, "y (activations up to 1.5e5)");
  Tensor dxg = Tensor::empty({kT, kIn}, DType::F32, kGpu), dx = Tensor::empty({kT, kIn});
  linear_backward(gpu(dy), gpu(x), gpu(W), nullptr, nullptr, LinearGrads{&dxg});
  linear_backward(dy, x, W32, nullptr, nullptr, LinearGrads{&dx});
  Tensor dx_bound = Tensor::empty({kT, kIn});
  linear_backward(abs_of(dy), x, Wabs, nullptr, nullptr, LinearGrads{&dx_bound});
  expect_within_f16_bound(dxg, dx, dx_bound, 0.0f, "dx (gradients around 1e-9)");
  ASSERT_EQ(rec.descs().size(), 2u);

  // Naive: the same descriptions with alpha 1 over operands rounded straight to f16.
  auto naive = [&](gemm::GemmDesc d, const Tensor& act, int64_t rows_out, int64_t cols_out) {
    d.alpha = 1.0f;
    std::vector<uint16_t> a16, w16;
    for (float v : act.to_vector()) a16.push_back(f32_to_f16(v));
    for (float v : W32.to_vector()) w16.push_back(f32_to_f16(v));
    std::vector<float> c(static_cast<size_t>(rows_out * cols_out));
    gemm::gemm_reference(d, w16.data(), a16.data(), c.data());
    return c;
  };
  const auto y_naive = naive(rec.descs()[0], x, kT, kOut);
  EXPECT_TRUE(std::any_of(y_naive.begin(), y_naive.end(), [](float v) { return !std::isfinite(v); }))
      << "plain f16 rounding of 1.5e5 should have overflowed";
  const auto dx_naive = naive(rec.descs()[1], dy, kT, kIn);
  size_t zeros = 0;
  for (float v : dx_naive) zeros += v == 0.0f;
  EXPECT_GT(zeros, dx_naive.size() / 2) << "plain f16 rounding of 1e-9 gradients should have flushed them to 0";
  for (float v : dx.to_vector()) ASSERT_NE(v, 0.0f);  // the reference has none
}

// The f16 card's workspace, as the simulated allocator measures it, is cuda_workspace's count for
// an f16 card: the scaled operand (with its reduction's int) and, for bf16 and q8_0 weights alike,
// one f16 panel; the fused loss over a bf16 head takes the f32-panel path (f32 GEMMs only).
TEST(CudaF16Gemm, WorkspaceOnATuringCardIsWhatThePlanCounts) {
  SimulatedCudaDevice card;
  SimulatedComputeCapability turing(7, 5);
  const int64_t in = 768, out = 257, V = 101, chunk = 8;
  const Tensor x = gpu(random_tensor({kT, in}, 35)), dy = gpu(random_tensor({kT, out}, 36));
  for (DType held : {DType::BF16, DType::Q8_0, DType::F16}) {
    const std::string at = dtype_name(held);
    const Tensor W = gpu(random_tensor({out, in}, 37).to(held));
    Tensor dx = Tensor::empty({kT, in}, DType::F32, kGpu);
    EXPECT_EQ(scratch_of(card, [&] { linear_forward(x, W, nullptr, nullptr, nullptr); }),
              static_cast<size_t>(kT * out) * 4 + cuda_workspace::held_gemm_operand_bytes(held, kT, in, true) +
                  cuda_workspace::held_gemm_panel_bytes(held, out, in, true))
        << at;
    EXPECT_EQ(scratch_of(card, [&] { linear_backward(dy, x, W, nullptr, nullptr, LinearGrads{&dx}); }),
              cuda_workspace::held_gemm_operand_bytes(held, kT, out, true) +
                  cuda_workspace::held_gemm_panel_bytes(held, out, in, true))
        << at;
  }
  EXPECT_GT(cuda_workspace::held_gemm_panel_bytes(DType::BF16, out, in, true), 0u);

  std::vector<int32_t> lab(static_cast<size_t>(kT));
  for (int64_t t = 0; t < kT; ++t) lab[static_cast<size_t>(t)] = static_cast<int32_t>(t * 13 % V);
  const Tensor labels = Tensor::from_vector(lab, {kT});
  const Tensor xs = random_tensor({kT, in}, 41, -2.0f, 2.0f), head = random_tensor({V, in}, 42).to(DType::BF16);
  const Tensor xsg = gpu(xs), headg = gpu(head), labelsg = gpu(labels);
  Tensor dxg = Tensor::empty({kT, in}, DType::F32, kGpu), dx = Tensor::empty({kT, in});
  sim::GemmRecorder rec;
  CrossEntropyResult got;
  EXPECT_EQ(
      scratch_of(card,
                 [&] { got = linear_cross_entropy_forward_backward(xsg, headg, labelsg, 0.25f, dxg, nullptr, chunk); }),
      cuda_workspace::cross_entropy_head_bytes(DType::BF16, true, kT, in, V, chunk, true));
  ASSERT_FALSE(rec.descs().empty());
  for (const auto& d : rec.descs()) EXPECT_TRUE(d.a_type == gemm::DType::F32 && d.b_type == gemm::DType::F32);
  const auto ref = linear_cross_entropy_forward_backward(xs, head.to(DType::F32), labels, 0.25f, dx, nullptr, chunk);
  EXPECT_NEAR(got.loss_sum, ref.loss_sum, 1e-5 * std::abs(ref.loss_sum));
  EXPECT_TRUE(all_close(dxg.to_vector(), dx.to_vector(), kTolF32));
}

// What `backprop info` and the training start event say on such a card.
TEST(CudaF16Gemm, ComputeDescriptionNamesF16OnATuringCard) {
  const std::string turing = cuda_compute::describe_run(true, true), ampere = cuda_compute::describe_run(true, false);
  EXPECT_NE(turing.find("f16 inputs"), std::string::npos) << turing;
  EXPECT_NE(turing.find("7.5"), std::string::npos) << turing;
  EXPECT_EQ(turing.find("bf16 inputs"), std::string::npos) << turing;
  EXPECT_NE(ampere.find("bf16 inputs"), std::string::npos) << ampere;
  EXPECT_NE(turing.find("attention f32"), std::string::npos) << turing;  // the scalar kernels
  EXPECT_NE(ampere.find("attention products on tensor cores"), std::string::npos) << ampere;
  SimulatedCudaDevice card;
  SimulatedComputeCapability t4(7, 5);
  EXPECT_EQ(ops::cuda_compute_description(true), turing);
  sim::set_compute_capability(8, 6);
  EXPECT_EQ(ops::cuda_compute_description(true), ampere);
}

}  // namespace
}  // namespace bp::test
