// The CPU kernel variants (backend/cpu/kernel_variants.h): every variant this CPU runs against
// plain double references at sizes around every vector width (tails of 1..15 lanes), the run-time
// choice (detected, forced, refused with DEP_CPU_KERNELS_UNSUPPORTED on a CPU without the
// instructions) and that the variants are distinct compiled code, not one function three times.
#include "backend/cpu/kernel_variants.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "backend/cpu/gemm.h"
#include "backend/cpu/linear.h"
#include "core/dtype.h"
#include "core/sysinfo.h"
#include "op_test_util.h"
#include "support/finite_diff.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::all_close;
using test::to_double;

const std::vector<int64_t> kSizes = {1, 3, 4, 7, 8, 15, 16, 17, 31, 33, 100, 257};

class KernelEveryCpuVariant : public test::PerKernelVariant {
 protected:
  const cpu::KernelTable& k() const { return cpu::cpu_kernels(); }
};

TEST_P(KernelEveryCpuVariant, TheForcedVariantIsTheOneInUse) {
  EXPECT_EQ(&cpu::cpu_kernels(), &cpu::kernel_table(GetParam()));
  const cpu::KernelChoice c = cpu::cpu_kernel_choice();
  EXPECT_EQ(c.variant, GetParam());
  EXPECT_EQ(c.reason, "forced by runtime.cpu_kernels");
}

TEST_P(KernelEveryCpuVariant, SoftmaxRowPiecesMatchDoubleReference) {
  for (int64_t n : kSizes) {
    auto x = test::random_vector(static_cast<size_t>(n), 7 + n, -30.0f, 10.0f);
    x[static_cast<size_t>(n / 2)] = 12.5f;  // the max somewhere in the middle
    double mx = -INFINITY;
    for (float v : x) mx = std::max(mx, double(v));
    EXPECT_EQ(k().row_max(x.data(), n), float(mx)) << n;
    std::vector<double> e(x.size());
    double sum = 0;
    for (size_t i = 0; i < x.size(); ++i) sum += (e[i] = std::exp(double(x[i]) - mx));
    auto row = x;
    const float s = k().exp_shifted_sum(row.data(), n, float(mx));
    EXPECT_NEAR(s, sum, 1e-6 * sum) << n;
    EXPECT_TRUE(all_close(to_double(row), e, {1e-7, 1e-6})) << n;
    k().scale(row.data(), n, 0.5f);
    for (auto& v : e) v *= 0.5;
    EXPECT_TRUE(all_close(to_double(row), e, {1e-7, 1e-6})) << n;

    // Attention backward rows: p = exp(s − lse), ds = scale·p·(dp − delta).
    auto p = test::random_vector(static_cast<size_t>(n), 9 + n, -8.0f, 0.0f);
    auto ds = test::random_vector(static_cast<size_t>(n), 11 + n);
    std::vector<double> rp(p.size()), rds(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      rp[i] = std::exp(double(p[i]) - 0.25);
      rds[i] = 0.125 * rp[i] * (double(ds[i]) - 0.5);
    }
    k().probs_and_score_grads(p.data(), ds.data(), n, 0.25f, 0.5f, 0.125f);
    EXPECT_TRUE(all_close(to_double(p), rp, {1e-7, 1e-6})) << n;
    EXPECT_TRUE(all_close(to_double(ds), rds, {1e-7, 1e-6})) << n;
  }
}

TEST_P(KernelEveryCpuVariant, ExpClampsInsteadOfOverflowing) {
  std::vector<float> x = {-200.0f, -88.0f, 0.0f,  87.0f, 100.0f, -1.0f,  -2.0f,  -3.0f,  -4.0f,
                          -5.0f,   -6.0f,  -7.0f, -8.0f, -9.0f,  -10.0f, -11.0f, -500.0f};
  const float s = k().exp_shifted_sum(x.data(), int64_t(x.size()), 0.0f);
  EXPECT_TRUE(std::isfinite(s));
  for (float v : x) EXPECT_TRUE(std::isfinite(v) && v > 0.0f) << v;
}

TEST_P(KernelEveryCpuVariant, SwigluMatchesDoubleReference) {
  for (int64_t n : kSizes) {
    auto g = test::random_vector(size_t(n), 3 + n, -12.0f, 12.0f), u = test::random_vector(size_t(n), 5 + n);
    auto d = test::random_vector(size_t(n), 6 + n);
    const size_t un = static_cast<size_t>(n);
    std::vector<float> h(un), dg(un), du(un);
    k().swiglu_forward(g.data(), u.data(), h.data(), n);
    k().swiglu_backward(d.data(), g.data(), u.data(), dg.data(), du.data(), n);
    std::vector<double> rh(un), rdg(un), rdu(un);
    for (size_t i = 0; i < un; ++i) {
      const double s = 1.0 / (1.0 + std::exp(-double(g[i])));
      rh[i] = g[i] * s * u[i];
      rdu[i] = double(d[i]) * g[i] * s;
      rdg[i] = double(d[i]) * u[i] * s * (1.0 + g[i] * (1.0 - s));
    }
    EXPECT_TRUE(all_close(to_double(h), rh, {1e-6, 1e-5})) << n;
    EXPECT_TRUE(all_close(to_double(dg), rdg, {1e-6, 1e-5})) << n;
    EXPECT_TRUE(all_close(to_double(du), rdu, {1e-6, 1e-5})) << n;
  }
}

// Gemma's tanh paths (tanh_approx_t in lanes and in the scalar tails) against std::tanh in double:
// soft-capping over scores from −300 to 300 (saturated, the exp branch and the Taylor branch around
// |x/cap| = 0.4), the capped attention backward row, GeGLU forward and backward.
TEST_P(KernelEveryCpuVariant, TanhKernelsMatchDoubleReference) {
  const float cap = 30.0f;
  for (int64_t n : kSizes) {
    const size_t un = static_cast<size_t>(n);
    auto x = test::random_vector(un, 21 + n, -300.0f, 300.0f);
    for (size_t i = 0; i < un; i += 3) x[i] *= 0.05f;  // |x/cap| near and below the branch point
    std::vector<float> y = x, th(un);
    k().softcap(y.data(), th.data(), n, cap);
    std::vector<double> ry(un), rth(un);
    for (size_t i = 0; i < un; ++i) ry[i] = cap * (rth[i] = std::tanh(double(x[i]) / cap));
    EXPECT_TRUE(all_close(to_double(th), rth, {1e-7, 1e-6})) << n;
    EXPECT_TRUE(all_close(to_double(y), ry, {cap * 1e-7, 1e-6})) << n;
    std::vector<float> y2 = x;
    k().softcap(y2.data(), nullptr, n, cap);  // th may be null: the same values
    EXPECT_EQ(std::memcmp(y2.data(), y.data(), un * sizeof(float)), 0) << n;

    // p = exp(c·tanh(s/c) − lse), ds = scale·p·(dp − delta)·(1 − tanh²).
    auto s = test::random_vector(un, 23 + n, -60.0f, 60.0f), dp = test::random_vector(un, 25 + n);
    const float lse = 31.0f, delta = 0.25f, scale = 0.125f;
    std::vector<float> p = s, ds = dp;
    k().capped_probs_and_score_grads(p.data(), ds.data(), n, lse, delta, scale, cap);
    std::vector<double> rp(un), rds(un);
    for (size_t i = 0; i < un; ++i) {
      const double t = std::tanh(double(s[i]) / cap);
      rp[i] = std::exp(cap * t - lse);
      rds[i] = scale * rp[i] * (double(dp[i]) - delta) * (1.0 - t * t);
    }
    EXPECT_TRUE(all_close(to_double(p), rp, {1e-7, 1e-5})) << n;
    EXPECT_TRUE(all_close(to_double(ds), rds, {1e-7, 1e-5})) << n;

    // GeGLU: h = gelu_tanh(g)·u.
    auto g = test::random_vector(un, 3 + n, -8.0f, 8.0f), u = test::random_vector(un, 5 + n);
    auto d = test::random_vector(un, 6 + n);
    std::vector<float> h(un), dg(un), du(un);
    k().geglu_forward(g.data(), u.data(), h.data(), n);
    k().geglu_backward(d.data(), g.data(), u.data(), dg.data(), du.data(), n);
    std::vector<double> rh(un), rdg(un), rdu(un);
    const double kk = std::sqrt(2.0 / M_PI), ka = 0.044715;
    for (size_t i = 0; i < un; ++i) {
      const double gi = g[i], t = std::tanh(kk * (gi + ka * gi * gi * gi));
      rh[i] = 0.5 * gi * (1.0 + t) * u[i];
      rdu[i] = double(d[i]) * 0.5 * gi * (1.0 + t);
      rdg[i] = double(d[i]) * u[i] * (0.5 * (1.0 + t) + 0.5 * gi * (1.0 - t * t) * kk * (1.0 + 3.0 * ka * gi * gi));
    }
    EXPECT_TRUE(all_close(to_double(h), rh, {1e-6, 1e-5})) << n;
    EXPECT_TRUE(all_close(to_double(dg), rdg, {1e-6, 1e-5})) << n;
    EXPECT_TRUE(all_close(to_double(du), rdu, {1e-6, 1e-5})) << n;
  }
}

TEST_P(KernelEveryCpuVariant, AdamwMatchesDoubleReference) {
  for (int64_t n : kSizes) {
    auto p = test::random_vector(size_t(n), 1 + n), g = test::random_vector(size_t(n), 2 + n);
    auto m = test::random_vector(size_t(n), 4 + n, -0.1f, 0.1f), v = test::random_vector(size_t(n), 8 + n, 0.0f, 0.01f);
    const auto p0 = p, m0 = m, v0 = v;
    k().adamw(p.data(), g.data(), m.data(), v.data(), n, 0.999f, 0.9f, 0.95f, 0.1f, 0.05f, 0.01f, 0.5f, 1e-8f);
    for (size_t i = 0; i < size_t(n); ++i) {
      const double mi = 0.9 * m0[i] + 0.1 * g[i], vi = 0.95 * v0[i] + 0.05 * double(g[i]) * g[i];
      const double pi = 0.999 * p0[i] - 0.01 * mi / (std::sqrt(vi) / 0.5 + 1e-8);
      EXPECT_NEAR(m[i], mi, 1e-6) << n;
      EXPECT_NEAR(v[i], vi, 1e-8) << n;
      EXPECT_NEAR(p[i], pi, 1e-5 * std::max(1.0, std::abs(pi))) << n;
    }
  }
}

TEST_P(KernelEveryCpuVariant, F16ConversionRoundsLikeTheScalarOne) {
  // Halfway cases, subnormals, overflow to inf, NaN and ordinary values.
  std::vector<float> x = {
      1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 65504.0f,  65520.0f, 1e-7f,    -6e-8f,    0.0f,   -0.0f, INFINITY,
      -INFINITY,          3.14159f,           -2.71828f, 1e5f,     5.96e-8f, 0.333333f, -1e-3f, 42.0f};
  for (int i = 0; i < 40; ++i) x.push_back(std::ldexp(1.0f + i / 64.0f, i - 20) * (i % 2 ? -1.0f : 1.0f));
  std::vector<uint16_t> out(x.size(), 0xFFFF);
  const int64_t done = k().f32_to_f16_prefix(x.data(), out.data(), int64_t(x.size()));
  ASSERT_GE(done, 0);
  ASSERT_LE(done, int64_t(x.size()));
  if (GetParam() != cpu::KernelVariant::Generic) {
    EXPECT_EQ(done, int64_t(x.size()) / 8 * 8);  // F16C: 8 at a time
  }
  for (int64_t i = 0; i < done; ++i) EXPECT_EQ(out[size_t(i)], f32_to_f16(x[size_t(i)])) << x[size_t(i)];
}

// The LoRA dropout mask in vector lanes is dropout_keep's, element for element: every size around
// the vector widths, at offsets into the input (first, odd and past 2^32), for p at 0, values
// with and without an exact p·2^24 (1/16, 0.05), 0.5 and next to 1; kept values scaled exactly
// (x·inv_keep), dropped ones +0.0 (even where x is negative).
TEST_P(KernelEveryCpuVariant, DropoutMaskIsTheScalarRuleBitForBit) {
  const uint64_t seed = 0xd00d;
  const uint64_t mixed = cpu::dropout_mixed_seed(seed);
  for (float p : {0.0f, 0.0625f, 0.05f, 0.1f, 0.5f, 0.999f})
    for (uint64_t first : {uint64_t{0}, uint64_t{13}, (uint64_t{1} << 32) + 5})
      for (int64_t n : kSizes) {
        auto x = test::random_vector(size_t(n), 3 + n, -2.0f, 2.0f);
        std::vector<float> xd(size_t(n), NAN);
        const float inv_keep = 1.0f / (1.0f - p);
        k().dropout_apply(x.data(), xd.data(), n, first, mixed, cpu::dropout_keep_threshold(p), inv_keep);
        for (int64_t i = 0; i < n; ++i) {
          const bool keep = cpu::dropout_keep(seed, first + uint64_t(i), p);
          const float want = keep ? x[size_t(i)] * inv_keep : 0.0f;
          ASSERT_EQ(std::memcmp(&xd[size_t(i)], &want, sizeof want), 0)
              << "p=" << p << " first=" << first << " n=" << n << " i=" << i << " keep=" << keep;
        }
      }
  // The threshold's edges: k / 2^24 >= p exactly when k >= threshold.
  for (float p : {0.05f, 0.0625f, 0.3f, 0.999f}) {
    const uint64_t t = cpu::dropout_keep_threshold(p);
    EXPECT_GE(static_cast<float>(t) * (1.0f / 16777216.0f), p) << p;
    EXPECT_LT(static_cast<float>(t - 1) * (1.0f / 16777216.0f), p) << p;
  }
  EXPECT_EQ(cpu::dropout_keep_threshold(0.0f), 0u);
}

// gemm_nt_few_rows: y = alpha·x·wᵀ + beta·y over rows [f0, f1) of w, against a double reference, at
// row counts around every panel width (1..2 vectors of 4, 8, 16 lanes), weight rows around the 6-row
// tile, K across the 256-long chunks, strides wider than the rows; y outside [f0, f1) untouched and
// not read when beta is 0 (NaN there stays out of the result). Tolerance: K·2⁻²⁴·Σ|x·w| per element
// (CONVENTIONS.md), plus the alpha/beta terms' roundings.
TEST_P(KernelEveryCpuVariant, FewRowsWeightGemmMatchesDoubleReference) {
  struct Case {
    int64_t n, F, K, f0, f1;
    float alpha, beta;
  };
  const Case cases[] = {{1, 7, 5, 0, 7, 1.0f, 0.0f},       {3, 13, 300, 0, 13, 1.0f, 0.0f},
                        {8, 6, 257, 0, 6, 0.5f, 1.0f},     {9, 12, 33, 6, 12, 1.0f, 0.0f},
                        {16, 19, 520, 0, 19, 1.0f, -0.5f}, {17, 5, 64, 1, 4, 2.0f, 0.0f},
                        {33, 31, 100, 6, 31, 1.0f, 1.0f},  {70, 8, 512, 0, 8, 1.0f, 0.0f}};
  for (const Case& c : cases) {
    const int64_t ldx = c.K + 3, ldw = c.K + 5, ldy = c.F + 2;
    const auto x = test::random_vector(size_t(c.n * ldx), 11 + c.n, -2.0f, 2.0f);
    const auto w = test::random_vector(size_t(c.F * ldw), 13 + c.F);
    auto y = test::random_vector(size_t(c.n * ldy), 17 + c.K);
    if (c.beta == 0.0f)
      for (int64_t i = 0; i < c.n; ++i)
        for (int64_t f = c.f0; f < c.f1; ++f) y[size_t(i * ldy + f)] = NAN;
    const auto y0 = y;
    std::vector<float> scratch(size_t(cpu::few_rows_scratch_floats(c.n, c.K)), NAN);
    k().gemm_nt_few_rows(x.data(), ldx, c.n, c.K, w.data(), ldw, c.f0, c.f1, c.alpha, c.beta, y.data(), ldy,
                         scratch.data());
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t f = 0; f < ldy; ++f) {
        const size_t at = size_t(i * ldy + f);
        if (f < c.f0 || f >= c.f1) {
          if (std::memcmp(&y[at], &y0[at], sizeof(float)) != 0) ADD_FAILURE() << "written outside: " << i << "," << f;
          continue;
        }
        double ref = 0, mag = 0;
        for (int64_t q = 0; q < c.K; ++q) {
          const double p = double(x[size_t(i * ldx + q)]) * double(w[size_t(f * ldw + q)]);
          ref += p;
          mag += std::fabs(p);
        }
        const double yin = c.beta == 0.0f ? 0.0 : double(y0[at]);
        const double want = double(c.alpha) * ref + double(c.beta) * yin;
        const double tol = double(c.K + 2) * 0x1p-24 * (std::fabs(c.alpha) * mag + std::fabs(c.beta * yin)) + 1e-30;
        if (!(std::fabs(double(y[at]) - want) <= tol))
          ADD_FAILURE() << "n " << c.n << " F " << c.F << " K " << c.K << " at " << i << "," << f << ": " << y[at]
                        << " vs " << want << " (tol " << tol << ")";
      }
  }
}

// sgemm_weight_nt (gemm.h) through the current variant with its thread split: the few-rows path
// gives what sgemm (OpenBLAS) gives, within the same bound, at a shape that takes it.
TEST_P(KernelEveryCpuVariant, WeightGemmFewRowsPathMatchesBlas) {
  const int64_t M = 20, N = 300, K = 260;
  ASSERT_TRUE(cpu::few_rows_path(M, N, K));
  ASSERT_FALSE(cpu::few_rows_path(cpu::kFewRowsMax + 1, N, K));
  const auto a = test::random_vector(size_t(M * K), 3), b = test::random_vector(size_t(N * K), 4);
  std::vector<float> y(size_t(M * N), NAN), ref(size_t(M * N), 0.0f);
  cpu::sgemm_weight_nt(M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, y.data(), N);
  cpu::sgemm(false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, ref.data(), N);
  for (size_t i = 0; i < y.size(); ++i)
    if (!(std::fabs(y[i] - ref[i]) <= 2.0 * K * 0x1p-24 * K)) ADD_FAILURE() << i << ": " << y[i] << " vs " << ref[i];
}

BP_PER_KERNEL_VARIANT(KernelEveryCpuVariant);

TEST(KernelVariants, EachVariantIsItsOwnCompiledCode) {
  const auto vs = cpu::supported_kernel_variants();
  ASSERT_FALSE(vs.empty());
  EXPECT_EQ(vs.front(), cpu::KernelVariant::Generic);
  std::set<const void*> fns;
  for (auto v : vs) fns.insert(reinterpret_cast<const void*>(cpu::kernel_table(v).exp_shifted_sum));
  EXPECT_EQ(fns.size(), vs.size());
}

TEST(KernelVariants, AutoPicksTheWidestThisCpuRuns) {
  cpu::select_cpu_kernels("auto");
  const CpuIsa isa = cpu_isa();
  const auto c = cpu::cpu_kernel_choice();
  EXPECT_EQ(c.variant, cpu::supported_kernel_variants().back());
  EXPECT_EQ(c.variant == cpu::KernelVariant::Avx512, isa.avx512);
  EXPECT_EQ(c.reason.rfind("detected:", 0), 0u) << c.reason;
}

TEST(KernelVariants, ForcingAVariantTheCpuLacksIsAClearError) {
  CpuIsa avx2_only;  // an AMD Zen 3: AVX2 + FMA, no AVX-512
  avx2_only.vendor = "AuthenticAMD";
  avx2_only.avx2_fma = true;
  CpuIsa old_cpu;  // SSE only
  old_cpu.vendor = "GenuineIntel";
#if defined(__x86_64__)
  test::expect_op_error([&] { cpu::select_cpu_kernels("avx512", avx2_only); }, ErrorCode::DEP_CPU_KERNELS_UNSUPPORTED,
                        {"avx512", "AuthenticAMD", "AVX-512", "this CPU runs: generic, avx2"});
  test::expect_op_error([&] { cpu::select_cpu_kernels("avx2", old_cpu); }, ErrorCode::DEP_CPU_KERNELS_UNSUPPORTED,
                        {"AVX2, FMA and F16C", "this CPU runs: generic"});
#else  // the x86 variants are not built on other architectures: refused all the same, with the code
  test::expect_op_error([&] { cpu::select_cpu_kernels("avx512", avx2_only); }, ErrorCode::DEP_CPU_KERNELS_UNSUPPORTED,
                        {"avx512"});
  test::expect_op_error([&] { cpu::select_cpu_kernels("avx2", old_cpu); }, ErrorCode::DEP_CPU_KERNELS_UNSUPPORTED,
                        {"avx2"});
#endif
  test::expect_op_error([&] { cpu::select_cpu_kernels("sse9"); }, ErrorCode::CONFIG_INVALID_SETTING, {"'sse9'"});
  // The refused choice left the previous one in place.
  cpu::select_cpu_kernels("generic");
  EXPECT_THROW(cpu::select_cpu_kernels("avx512", old_cpu), Error);
  EXPECT_EQ(cpu::cpu_kernel_choice().variant, cpu::KernelVariant::Generic);
  cpu::select_cpu_kernels("auto");
}

}  // namespace
}  // namespace bp
