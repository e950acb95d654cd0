// CUDA AdamW, sum of squares and the non-finite check (src/backend/cuda/optim.cuh) on the CPU
// simulation against the CPU backend.
#include <limits>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/kernel_variants.h"
#include "backend/cpu/optim.h"
#include "backend/cuda/optim.cuh"
#include "core/dtype.h"
#include "sim_test_util.h"
#include "support/cpu_kernels_env.h"

namespace bp::sim {
namespace {

// Against the generic CPU variant: the AVX2/AVX-512 variants are compiled with -mfma and GCC
// contracts a·b + c into FMAs there (C++ mode defaults to -ffp-contract=fast), which rounds
// differently; the generic one and the CUDA kernel (__fmul_rn/__fadd_rn) both round every step.
TEST(CudaAdamw, ThreeStepsMatchCpuBitForBit) {
  cpu::select_cpu_kernels("generic");
  for (int64_t n : {1, 31, 257, 5000}) {
    auto p_ref = test::random_floats(n, 40 + n), g = test::random_floats(n, 41 + n);
    std::vector<float> m_ref(n, 0.0f), v_ref(n, 0.0f);
    auto p = p_ref, m = m_ref, v = v_ref;
    for (int64_t step = 1; step <= 3; ++step) {
      for (auto& e : g) e *= -0.7f;  // changing gradients
      cpu::adamw_step(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, step);
      adamw_step(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, step);
    }
    // Same float operations in the same order (no FMA contraction on either side): identical.
    EXPECT_EQ(p, p_ref) << "n=" << n;
    EXPECT_EQ(m, m_ref) << "n=" << n;
    EXPECT_EQ(v, v_ref) << "n=" << n;
  }
  cpu::select_cpu_kernels(bp::test::test_cpu_kernels());
}

TEST(CudaGlobalNorm, SumOfSquaresMatchesCpuAndIsDeterministic) {
  for (int64_t n : {1, 31, 33, 257, 70001, 300001}) {  // 274 blocks; 1,024 blocks that stride
    const auto x = test::random_floats(n, 50 + n, -3, 3);
    std::vector<unsigned char> scratch(optim_scratch_bytes(n));
    const double got = sum_squares<float>(x.data(), n, scratch.data());
    EXPECT_NEAR(got, cpu::sum_squares(x.data(), n), 1e-12 * n) << "n=" << n;
    EXPECT_EQ(got, sum_squares<float>(x.data(), n, scratch.data()));
    auto xb = test::to_bf16(x);
    const auto xr = test::to_f32(xb);
    EXPECT_NEAR(sum_squares<bf16>(xb.data(), n, scratch.data()), cpu::sum_squares(xr.data(), n), 1e-12 * n);
  }
}

// The global norm's sum over many tensors in one call (one copy back): each tensor reduced as
// sum_squares does and the sums added in order in double, so the result is bit for bit what the
// host loop over sum_squares gave (the trainer's norm before the sum moved to the device), and
// the CPU's sum_squares_total within f64 rounding. An empty tensor adds 0.
TEST(CudaGlobalNorm, SumOverTensorsEqualsTheHostLoopBitForBit) {
  const std::vector<int64_t> sizes{257, 0, 1, 70001, 33, 300001};
  std::vector<std::vector<float>> xs;
  std::vector<const float*> ptrs;
  for (size_t i = 0; i < sizes.size(); ++i) xs.push_back(test::random_floats(sizes[i], 70 + i, -2, 2));
  for (const auto& x : xs) ptrs.push_back(x.data());
  double host_loop = 0.0, cpu_ref = 0.0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<unsigned char> scratch(optim_scratch_bytes(sizes[i]));
    host_loop += sum_squares<float>(ptrs[i], sizes[i], scratch.data());
    cpu_ref += cpu::sum_squares(ptrs[i], sizes[i]);
  }
  std::vector<unsigned char> scratch(sum_squares_total_scratch_bytes(300001, 6));
  const double got = sum_squares_total<float>(ptrs.data(), sizes.data(), 6, scratch.data());
  EXPECT_EQ(got, host_loop);
  EXPECT_EQ(cpu::sum_squares_total(ptrs.data(), sizes.data(), 6), cpu_ref);
  EXPECT_NEAR(got, cpu_ref, 1e-12 * cpu_ref);
  EXPECT_EQ(sum_squares_total<float>(ptrs.data(), sizes.data(), 0, scratch.data()), 0.0);
}

// The list kernels (a LoRA of Qwen2.5-0.5B trains 336 tensors): 100 tensors of mixed sizes, empty
// ones included, take ceil(100 / kTensorsPerLaunch) launches for AdamW and for the clipping scale, two
// per group plus one for the norm's sum, and give each tensor exactly what its own call gives.
TEST(CudaOptimizerLists, HundredTensorsTakeAFewLaunchesAndMatchOneCallPerTensorBitForBit) {
  cpu::select_cpu_kernels("generic");  // no FMA contraction on the CPU side (CudaAdamw above)
  constexpr int64_t kCount = 100;
  const int64_t groups = (kCount + kTensorsPerLaunch - 1) / kTensorsPerLaunch;
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < kCount; ++i) sizes.push_back(i % 17 == 5 ? 0 : i == 50 ? 300001 : 1 + (i * 37) % 700);
  std::vector<std::vector<float>> p, g, m, v;
  for (int64_t i = 0; i < kCount; ++i) {
    p.push_back(test::random_floats(sizes[i], 200 + i));
    g.push_back(test::random_floats(sizes[i], 400 + i));
    m.push_back(std::vector<float>(sizes[i], 0.01f));
    v.push_back(std::vector<float>(sizes[i], 0.02f));
  }
  auto p_ref = p, m_ref = m, v_ref = v, g_ref = g;
  std::vector<float*> pp, mp, vp, gp;
  std::vector<const float*> gc;
  for (int64_t i = 0; i < kCount; ++i) {
    pp.push_back(p[i].data()), mp.push_back(m[i].data()), vp.push_back(v[i].data()), gp.push_back(g[i].data());
    gc.push_back(g[i].data());
  }

  uint64_t before = launch_count();
  std::vector<unsigned char> scratch(sum_squares_total_scratch_bytes(300001, kCount));
  const double norm_sq = sum_squares_total<float>(gc.data(), sizes.data(), kCount, scratch.data());
  EXPECT_EQ(launch_count() - before, static_cast<uint64_t>(2 * groups + 1)) << "sum_squares_total";
  double host_loop = 0.0;
  for (int64_t i = 0; i < kCount; ++i) {
    std::vector<unsigned char> one(optim_scratch_bytes(sizes[i]));
    host_loop += sum_squares<float>(g_ref[i].data(), sizes[i], one.data());
  }
  EXPECT_EQ(norm_sq, host_loop);

  before = launch_count();
  scale_all(gp.data(), sizes.data(), kCount, 0.37f);
  EXPECT_EQ(launch_count() - before, static_cast<uint64_t>(groups)) << "scale_all";
  for (int64_t i = 0; i < kCount; ++i) cpu::scale_inplace(g_ref[i].data(), 0.37f, sizes[i]);
  EXPECT_EQ(g, g_ref);

  // Every third tensor (the 300001-value one included) has a bf16 GEMM copy (full fine-tuning's
  // matrices), the others none (norms): written in the same launches as the update.
  std::vector<std::vector<bf16>> copies(kCount);
  std::vector<bf16*> cp;
  for (int64_t i = 0; i < kCount; ++i) {
    if (i % 3 == 2) copies[i].assign(static_cast<size_t>(sizes[i]), bf16{});
    cp.push_back(i % 3 == 2 ? copies[i].data() : nullptr);
  }
  before = launch_count();
  adamw_step_all(pp.data(), gc.data(), mp.data(), vp.data(), cp.data(), sizes.data(), kCount, 1e-3f, 0.9f, 0.999f,
                 1e-8f, 0.1f, 4);
  EXPECT_EQ(launch_count() - before, static_cast<uint64_t>(groups)) << "adamw_step_all";
  for (int64_t i = 0; i < kCount; ++i)
    cpu::adamw_step(p_ref[i].data(), g_ref[i].data(), m_ref[i].data(), v_ref[i].data(), sizes[i], 1e-3f, 0.9f, 0.999f,
                    1e-8f, 0.1f, 4);
  EXPECT_EQ(p, p_ref);
  EXPECT_EQ(m, m_ref);
  EXPECT_EQ(v, v_ref);
  int64_t wrong = 0, written = 0;
  for (int64_t i = 2; i < kCount; i += 3)
    for (int64_t j = 0; j < sizes[i]; ++j, ++written) wrong += copies[i][j].bits != f32_to_bf16(p_ref[i][j]);
  EXPECT_GT(written, 300001);
  EXPECT_EQ(wrong, 0) << "copy elements that are not the CPU's rounding of the updated parameter";
  cpu::select_cpu_kernels(bp::test::test_cpu_kernels());
}

TEST(CudaNonFinite, FindsOneInfOrNanAnywhere) {
  const int64_t n = 20011;  // 79 blocks
  auto x = test::random_floats(n, 60);
  std::vector<unsigned char> scratch(optim_scratch_bytes(n));
  EXPECT_TRUE(all_finite<float>(x.data(), n, scratch.data()));
  for (int64_t at : {int64_t{0}, int64_t{31}, n / 2, n - 1}) {
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), NAN}) {
      auto y = x;
      y[at] = bad;
      EXPECT_FALSE(all_finite<float>(y.data(), n, scratch.data())) << "at " << at;
      EXPECT_EQ(all_finite<float>(y.data(), n, scratch.data()), cpu::all_finite_f32(y.data(), n));
      auto yb = test::to_bf16(y);
      EXPECT_FALSE(all_finite<bf16>(yb.data(), n, scratch.data())) << "bf16 at " << at;
    }
  }
  auto xb = test::to_bf16(x);
  EXPECT_TRUE(all_finite<bf16>(xb.data(), n, scratch.data()));
}

}  // namespace
}  // namespace bp::sim
