// Frozen weights beyond f16's range on a Turing card (compute capability 7.5, simulated): the GEMMs
// against frozen weights take f16 panels there, and f16 rounds every |w| >= 65520 to Inf. A weight
// holding such a value (found once by a max |w| reduction on the card, ops/held_range.h) takes f32
// panels and f32 GEMMs instead; every other weight keeps the f16 path. Checked here: the card's
// reduction is the CPU's dequantized maximum, bit for bit, for every held type; the f16 path on
// such a weight really gives Inf (the failure the fallback prevents); the fallback layer matches
// the CPU's f32 layer; the threshold sits where f16 overflows; the answer is cached per weight
// (one reduction) and a new weight at a freed weight's address is checked again; the workspace is
// what cuda_workspace counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/device_workspace.h"
#include "backend/cuda/sim/gemm_sim.h"
#include "model/held_weights.h"
#include "op_parity.h"
#include "ops/dispatch.h"
#include "ops/held_range.h"
#include "sim_device.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

using parity::gpu;
using parity::kGpu;
using parity::kSmallPanelValues;
using parity::ScopedHeldPanelValues;

constexpr int64_t kT = 37, kIn = 256, kOut = 45;  // kIn: whole blocks of every type (q4_K's 256)

// A random [kOut, kIn] weight (values in [-1, 1)) with w[3, 5] = `outlier`, held as `held`.
Tensor weight_with(float outlier, DType held, uint64_t seed = 2) {
  Tensor w = random_tensor({kOut, kIn}, seed);
  w.data<float>()[3 * kIn + 5] = outlier;
  return w.to(held);
}

bool all_f32_gemms(const std::vector<gemm::GemmDesc>& descs) {
  return std::all_of(descs.begin(), descs.end(), [](const gemm::GemmDesc& d) {
    return d.a_type == gemm::DType::F32 && d.b_type == gemm::DType::F32;
  });
}

// The card's max |w| over the dequantized values is the CPU kernel's (core's dequantizers), bit for
// bit, for every held type, at an odd row count; and both are the largest |value| of the weight
// widened to f32.
TEST(CudaF16Range, AbsMaxOnTheCardIsTheCpusDequantizedMaximum) {
  SimulatedCudaDevice card;
  for (DType held : {DType::BF16, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q5_1, DType::Q4_K,
                     DType::Q5_K, DType::Q6_K}) {
    const Tensor w = weight_with(held == DType::F16 ? -3000.0f : -1.25e5f, held);
    const float cpu = ops::held_abs_max(w), dev = ops::held_abs_max(gpu(w));
    EXPECT_EQ(f32_bits(dev), f32_bits(cpu)) << dtype_name(held) << ": " << dev << " vs " << cpu;
    float widened = 0;
    for (float v : w.to(DType::F32).to_vector()) widened = std::max(widened, std::fabs(v));
    EXPECT_EQ(cpu, widened) << dtype_name(held);
    EXPECT_GT(cpu, 1000.0f) << dtype_name(held);
  }
}

// f16 overflows from 65520 on: a bf16 weight whose largest value is 65280 (an f16 value) keeps the
// f16 path; 65536 (the next bf16 value past 65504 but one) takes f32 panels, as does Inf. On a bf16
// card, on the CPU and for f32 weights nothing is checked.
TEST(CudaF16Range, TheThresholdIsWhereF16Overflows) {
  SimulatedCudaDevice card;
  SimulatedComputeCapability turing(7, 5);
  EXPECT_EQ(f32_to_f16(ops::kF16OverflowThreshold), f32_to_f16(INFINITY));
  EXPECT_NE(f32_to_f16(std::nextafter(ops::kF16OverflowThreshold, 0.0f)), f32_to_f16(INFINITY));
  EXPECT_FALSE(ops::held_outside_f16(gpu(weight_with(65280.0f, DType::BF16))));
  EXPECT_FALSE(ops::held_outside_f16(gpu(weight_with(-65280.0f, DType::BF16))));
  EXPECT_TRUE(ops::held_outside_f16(gpu(weight_with(65536.0f, DType::BF16))));
  EXPECT_TRUE(ops::held_outside_f16(gpu(weight_with(-65536.0f, DType::BF16))));
  EXPECT_TRUE(ops::held_outside_f16(gpu(weight_with(INFINITY, DType::BF16))));
  EXPECT_TRUE(ops::held_outside_f16(gpu(weight_with(1e5f, DType::Q8_0))));
  EXPECT_FALSE(ops::held_outside_f16(gpu(weight_with(6e4f, DType::Q8_0))));
  EXPECT_FALSE(ops::held_outside_f16(weight_with(1e5f, DType::BF16))) << "the CPU reads f32";
  EXPECT_FALSE(ops::held_outside_f16(gpu(weight_with(1e5f, DType::F32)))) << "f32 GEMMs already";
  sim::set_compute_capability(8, 0);
  EXPECT_FALSE(ops::held_outside_f16(gpu(weight_with(1e5f, DType::BF16)))) << "bf16 spans f32's range";
}

// A layer over a bf16 (and a q8_0) weight holding 1e5 on a Turing card. Through f16 panels (the path
// without the check: the same kernel, the flag unset) the output has Inf: the run would die on the
// NaN guard. With the check, forward and dx are f32 GEMMs over f32 panels and match the CPU's f32
// layer over the same held weight within f32 tolerance.
TEST(CudaF16Range, LayerOverAWeightBeyondF16MatchesTheCpu) {
  SimulatedCudaDevice card;
  SimulatedComputeCapability turing(7, 5);
  for (DType held : {DType::BF16, DType::Q8_0}) {
    const std::string at = dtype_name(held);
    const Tensor x = random_tensor({kT, kIn}, 1), W = weight_with(1e5f, held), dy = random_tensor({kT, kOut}, 3);
    const Tensor xg = gpu(x), Wg = gpu(W), dyg = gpu(dy);

    Tensor naive = Tensor::empty({kT, kOut}, DType::F32, kGpu);
    ops::kernels(xg).held_gemm_xwt(xg.kernel_data<float>(), ops::held_matrix(Wg), 0.0f, naive.kernel_data<float>(), kT);
    const auto nv = naive.to_vector();
    EXPECT_TRUE(std::any_of(nv.begin(), nv.end(), [](float v) { return !std::isfinite(v); }))
        << at << ": the f16 panel should have turned 1e5 into Inf";

    sim::GemmRecorder rec;
    const Tensor y = linear_forward(xg, Wg, nullptr, nullptr, nullptr);
    Tensor dxg = Tensor::empty({kT, kIn}, DType::F32, kGpu), dx = Tensor::empty({kT, kIn});
    linear_backward(dyg, xg, Wg, nullptr, nullptr, LinearGrads{&dxg});
    ASSERT_FALSE(rec.descs().empty());
    EXPECT_TRUE(all_f32_gemms(rec.descs())) << at;
    const Tensor W32 = W.to(DType::F32);
    const Tensor y_ref = linear_forward(x, W32, nullptr, nullptr, nullptr);
    linear_backward(dy, x, W32, nullptr, nullptr, LinearGrads{&dx});
    for (float v : y.to_vector()) ASSERT_TRUE(std::isfinite(v)) << at;
    EXPECT_TRUE(all_close(y.to_vector(), y_ref.to_vector(), Tolerance{1e-5, 1e-5})) << at << " y";
    EXPECT_TRUE(all_close(dxg.to_vector(), dx.to_vector(), Tolerance{1e-5, 1e-5})) << at << " dx";
  }
}

// Ordinary weights keep the fast path: f16 GEMMs (and alpha from the activation's scale).
TEST(CudaF16Range, OrdinaryWeightsKeepTheF16Gemms) {
  SimulatedCudaDevice card;
  SimulatedComputeCapability turing(7, 5);
  for (DType held : {DType::BF16, DType::Q8_0, DType::F16}) {
    const Tensor x = gpu(random_tensor({kT, kIn}, 1)), W = gpu(weight_with(2.5f, held));
    sim::GemmRecorder rec;
    (void)linear_forward(x, W, nullptr, nullptr, nullptr);
    ASSERT_EQ(rec.descs().size(), 1u);
    EXPECT_EQ(rec.descs()[0].a_type, gemm::DType::F16) << dtype_name(held);
    EXPECT_NE(rec.descs()[0].alpha_beta_on_device, nullptr) << dtype_name(held);
  }
}

// One reduction per weight: later GEMMs read the cached answer (no launch but the GEMM's own). A
// weight freed and another uploaded at the same address is checked again (the cache is keyed by the
// tensor's memory, not its address).
TEST(CudaF16Range, CheckedOncePerWeightAndNotFooledByAReusedAddress) {
  SimulatedCudaDevice card;
  SimulatedComputeCapability turing(7, 5);
  const void* address = nullptr;
  {
    const Tensor W = gpu(weight_with(1.0f, DType::BF16, 7));
    address = W.kernel_raw();
    EXPECT_FALSE(ops::held_outside_f16(W));
    const uint64_t launches = sim::launch_count();
    EXPECT_FALSE(ops::held_outside_f16(W));
    EXPECT_EQ(sim::launch_count(), launches) << "the second check launched a reduction";
  }
  const Tensor big = gpu(weight_with(1e5f, DType::BF16, 7));
  ASSERT_EQ(big.kernel_raw(), address) << "the allocator did not reuse the freed block: the case is not made";
  EXPECT_TRUE(ops::held_outside_f16(big)) << "a stale answer for the freed weight";
}

// The workspace of the f32-panel path is what cuda_workspace counts: no 16-bit operand, one f32 panel.
TEST(CudaF16Range, WorkspaceOfTheF32PanelsIsWhatThePlanCounts) {
  SimulatedCudaDevice card;
  SimulatedComputeCapability turing(7, 5);
  const ScopedHeldPanelValues small_panels(kSmallPanelValues);
  const int64_t out = 600;  // more rows than one panel holds (2^17 / 256 = 512)
  const Tensor x = gpu(random_tensor({kT, kIn}, 1)), dy = gpu(random_tensor({kT, out}, 4));
  Tensor w = random_tensor({out, kIn}, 5);
  w.data<float>()[7] = -2e5f;
  const Tensor W = gpu(w.to(DType::BF16));
  ASSERT_TRUE(ops::held_outside_f16(W));  // checked (and cached) before the measured calls
  Tensor dx = Tensor::empty({kT, kIn}, DType::F32, kGpu);
  EXPECT_EQ(scratch_of(card, [&] { linear_forward(x, W, nullptr, nullptr, nullptr); }),
            static_cast<size_t>(kT * out) * 4 + cuda_workspace::held_gemm_f32_panel_bytes(out, kIn));
  EXPECT_EQ(scratch_of(card, [&] { linear_backward(dy, x, W, nullptr, nullptr, LinearGrads{&dx}); }),
            cuda_workspace::held_gemm_f32_panel_bytes(out, kIn));
}

// The start event's line (model/held_weights.h): the count and the first three names.
TEST(CudaF16Range, TheStartEventNamesTheWeightsThatFellBack) {
  const std::string one = describe_f16_fallback({"model.layers.0.mlp.down_proj.weight"});
  EXPECT_NE(one.find("1 frozen weight hold"), std::string::npos) << one;
  EXPECT_NE(one.find("model.layers.0.mlp.down_proj.weight"), std::string::npos) << one;
  const std::string five = describe_f16_fallback({"a", "b", "c", "d", "e"});
  EXPECT_NE(five.find("5 frozen weights"), std::string::npos) << five;
  EXPECT_NE(five.find("a, b, c and 2 more"), std::string::npos) << five;
  EXPECT_NE(five.find("f32 GEMMs"), std::string::npos) << five;
}

}  // namespace
}  // namespace bp::test
