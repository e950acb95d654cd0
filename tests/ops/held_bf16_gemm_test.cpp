// The CPU's GEMMs against frozen weights held in bf16 (backend/cpu/gemm_engine.h, linear.h
// held_linear_forward / held_linear_backward): under the bf16 numerics the activation operand is
// rounded to nearest-even bf16, the bf16·bf16 products are exact in f32 and summed in f32, so each
// output is within the f32 sum bound (tests/support/f32_bound.h: 2·K·2⁻²⁴·Σ|terms|, K + 1 terms
// with the accumulated C) of a plain reference: the operand rounded, then double-precision sums.
// The OpenBLAS path (x rounded, widened back, f32 sgemm) and oneDNN's bf16 matmul meet that bound
// on the same inputs, so they agree with each other within it too; `openblas` is today's f32 path
// bit for bit. Sizes are odd (1, 31, 32, 33, 257), inputs random and never zero.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "backend/cpu/cross_entropy.h"
#include "backend/cpu/gemm_engine.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/quant_gemm.h"
#include "core/dtype.h"
#include "core/sysinfo.h"
#include "support/expect_error.h"
#include "support/f32_bound.h"
#include "support/test_util.h"

namespace bp {
namespace {

using cpu::HeldBf16Path;

// Forces a GEMM path for the test and puts `auto` back after it.
struct ForcePath {
  explicit ForcePath(HeldBf16Path p) {
    CpuIsa isa = cpu_isa();
    switch (p) {
      case HeldBf16Path::F32: cpu::select_cpu_gemm("openblas", isa, cpu::onednn_built()); break;
      case HeldBf16Path::Bf16Sgemm:  // auto on a CPU without bf16 dot products
        isa.avx512_bf16 = isa.amx_bf16 = false;
        cpu::select_cpu_gemm("auto", isa, cpu::onednn_built());
        break;
      case HeldBf16Path::OneDnn: cpu::select_cpu_gemm("onednn", isa, cpu::onednn_built()); break;
    }
    EXPECT_EQ(cpu::cpu_gemm_choice().held_bf16, p);
  }
  ~ForcePath() { cpu::select_cpu_gemm("auto"); }
};

// Whether oneDNN can make a bf16 matmul here (linked, and a CPU with AVX-512 at least).
bool onednn_runs_here() {
  if (!cpu::onednn_built()) return false;
  try {
    const uint16_t x[32] = {}, w[32] = {};
    float y[1] = {};
    cpu::onednn_bf16_gemm_xwt(x, w, 0.0f, y, 1, 1, 32);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::vector<HeldBf16Path> bf16_paths() {
  std::vector<HeldBf16Path> p{HeldBf16Path::Bf16Sgemm};
  if (onednn_runs_here()) p.push_back(HeldBf16Path::OneDnn);
  return p;
}

std::vector<float> random_vec(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  return test::random_tensor({n}, seed, lo, hi).to_vector();
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
  return b;
}

struct Ref {
  std::vector<float> value, magnitude;
};

// C = round(X)[M, K]·W[N, K]ᵀ (+ C0) in double; round_x false keeps X f32 (the f32 path's reference).
Ref ref_xwt(const std::vector<float>& X, const std::vector<uint16_t>& W, const std::vector<float>* C0, int64_t M,
            int64_t N, int64_t K, bool round_x = true) {
  Ref r{std::vector<float>(M * N), std::vector<float>(M * N)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = C0 ? (*C0)[m * N + n] : 0.0, a = C0 ? std::fabs((*C0)[m * N + n]) : 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const float x = round_x ? bf16_to_f32(f32_to_bf16(X[m * K + k])) : X[m * K + k];
        const double p = static_cast<double>(x) * bf16_to_f32(W[n * K + k]);
        s += p;
        a += std::fabs(p);
      }
      r.value[m * N + n] = static_cast<float>(s);
      r.magnitude[m * N + n] = static_cast<float>(a);
    }
  return r;
}

// C = round(dY)[M, N]·W[N, K] (+ C0) in double.
Ref ref_xw(const std::vector<float>& dY, const std::vector<uint16_t>& W, const std::vector<float>* C0, int64_t M,
           int64_t N, int64_t K) {
  Ref r{std::vector<float>(M * K), std::vector<float>(M * K)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      double s = C0 ? (*C0)[m * K + k] : 0.0, a = C0 ? std::fabs((*C0)[m * K + k]) : 0.0;
      for (int64_t n = 0; n < N; ++n) {
        const double p = static_cast<double>(bf16_to_f32(f32_to_bf16(dY[m * N + n]))) * bf16_to_f32(W[n * K + k]);
        s += p;
        a += std::fabs(p);
      }
      r.value[m * K + k] = static_cast<float>(s);
      r.magnitude[m * K + k] = static_cast<float>(a);
    }
  return r;
}

struct Shape {
  int64_t T, in, out;
};

std::vector<Shape> shapes() {
  return {{1, 31, 33}, {33, 32, 1}, {31, 257, 33}, {32, 33, 257}, {257, 31, 32}, {5, 1, 31}};
}

cpu::HeldMatrix held(const std::vector<uint16_t>& W, int64_t out, int64_t in) {
  return cpu::HeldMatrix{W.data(), DType::BF16, out, in};
}

TEST(CpuGemmEngine, ChoiceFollowsTheSettingTheCpuAndTheBuild) {
  CpuIsa plain;  // no bf16 dot products
  plain.avx2_fma = plain.avx512 = true;
  CpuIsa bf16 = plain;
  bf16.avx512_bf16 = true;
  CpuIsa amx = plain;
  amx.amx_bf16 = true;
  struct Row {
    const char* name;
    const CpuIsa* isa;
    bool onednn;
    HeldBf16Path want;
  };
  for (const Row& r :
       {Row{"auto", &bf16, true, HeldBf16Path::OneDnn}, Row{"auto", &amx, true, HeldBf16Path::OneDnn},
        Row{"auto", &plain, true, HeldBf16Path::Bf16Sgemm}, Row{"auto", &bf16, false, HeldBf16Path::Bf16Sgemm},
        Row{"openblas", &bf16, true, HeldBf16Path::F32}, Row{"onednn", &plain, true, HeldBf16Path::OneDnn}}) {
    cpu::select_cpu_gemm(r.name, *r.isa, r.onednn);
    EXPECT_EQ(cpu::cpu_gemm_choice().held_bf16, r.want) << r.name << " onednn " << r.onednn;
    EXPECT_EQ(cpu::cpu_gemm_choice().setting, r.name);
  }
  test::expect_error([&] { cpu::select_cpu_gemm("onednn", bf16, false); }, ErrorCode::DEP_CPU_GEMM_UNAVAILABLE,
                     {"runtime.cpu_gemm = onednn", "no oneDNN"});
  test::expect_error([&] { cpu::select_cpu_gemm("mkl", bf16, true); }, ErrorCode::CONFIG_INVALID_SETTING,
                     {"'mkl'", "auto, openblas, onednn"});
  cpu::select_cpu_gemm("auto");
  // This build and CPU: auto takes oneDNN exactly where both are there.
  const bool both = cpu::onednn_built() && cpu::cpu_has_bf16_dot(cpu_isa());
  EXPECT_EQ(cpu::cpu_gemm_choice().held_bf16, both ? HeldBf16Path::OneDnn : HeldBf16Path::Bf16Sgemm);
}

TEST(CpuGemmEngine, OnednnAskedForWithoutItIsACatalogErrorAndWithItRuns) {
  if (cpu::onednn_built()) {
    if (onednn_runs_here()) {
      cpu::select_cpu_gemm("onednn");
      EXPECT_EQ(cpu::cpu_gemm_choice().held_bf16, HeldBf16Path::OneDnn);
    }
  } else {
    test::expect_error([] { cpu::select_cpu_gemm("onednn"); }, ErrorCode::DEP_CPU_GEMM_UNAVAILABLE, {"no oneDNN"});
    const uint16_t x[32] = {}, w[32] = {};
    float y[1] = {};
    test::expect_error([&] { cpu::onednn_bf16_gemm_xwt(x, w, 0.0f, y, 1, 1, 32); }, ErrorCode::DEP_CPU_GEMM_UNAVAILABLE,
                       {"no oneDNN"});
  }
  cpu::select_cpu_gemm("auto");
}

TEST(HeldBf16Gemm, ForwardAndDxAreTheRoundedOperandsProductWithinTheF32SumBound) {
  for (HeldBf16Path path : bf16_paths()) {
    ForcePath force(path);
    uint64_t seed = 10;
    for (const Shape& s : shapes()) {
      SCOPED_TRACE(::testing::Message() << cpu::held_bf16_path_name(path) << " T " << s.T << " in " << s.in << " out "
                                        << s.out);
      const std::vector<float> x = random_vec(s.T * s.in, ++seed, -2.0f, 2.0f);
      const std::vector<uint16_t> W = to_bf16(random_vec(s.out * s.in, ++seed));
      const std::vector<float> res = random_vec(s.T * s.out, ++seed);
      const cpu::HeldMatrix Wm = held(W, s.out, s.in);
      // y = x·Wᵀ, and y = x·Wᵀ + residual (beta 1, the residual given apart).
      std::vector<float> y(s.T * s.out, 7.0f), y_res(s.T * s.out);
      cpu::held_linear_forward(x.data(), nullptr, Wm, 0.0f, nullptr, y.data(), s.T);
      cpu::held_linear_forward(x.data(), nullptr, Wm, 1.0f, res.data(), y_res.data(), s.T);
      const Ref r = ref_xwt(x, W, nullptr, s.T, s.out, s.in), rr = ref_xwt(x, W, &res, s.T, s.out, s.in);
      EXPECT_TRUE(test::within_f32_sum_bound(y, r.value, r.magnitude, s.in + 1));
      EXPECT_TRUE(test::within_f32_sum_bound(y_res, rr.value, rr.magnitude, s.in + 1));
      // dx = dy·W, overwritten (beta 0) and accumulated (beta 1).
      const std::vector<float> dy = random_vec(s.T * s.out, ++seed, -3.0f, 3.0f);
      const std::vector<float> dx0 = random_vec(s.T * s.in, ++seed);
      std::vector<float> dx(s.T * s.in, 7.0f), dx_acc = dx0;
      cpu::held_linear_backward(dy.data(), nullptr, nullptr, nullptr, Wm, 0.0f, dx.data(), nullptr, s.T);
      cpu::held_linear_backward(dy.data(), nullptr, nullptr, nullptr, Wm, 1.0f, dx_acc.data(), nullptr, s.T);
      const Ref d = ref_xw(dy, W, nullptr, s.T, s.out, s.in), da = ref_xw(dy, W, &dx0, s.T, s.out, s.in);
      EXPECT_TRUE(test::within_f32_sum_bound(dx, d.value, d.magnitude, s.out + 1));
      EXPECT_TRUE(test::within_f32_sum_bound(dx_acc, da.value, da.magnitude, s.out + 1));
    }
  }
}

TEST(HeldBf16Gemm, TheBoundSeesTheRounding) {
  // The same check against the unrounded x's product fails: the bound is tight enough to tell
  // whether the operand was rounded (a test of the test), on every bf16 path.
  const Shape s{31, 257, 33};
  const std::vector<float> x = random_vec(s.T * s.in, 3, -2.0f, 2.0f);
  const std::vector<uint16_t> W = to_bf16(random_vec(s.out * s.in, 4));
  const Ref unrounded = ref_xwt(x, W, nullptr, s.T, s.out, s.in, false);
  for (HeldBf16Path path : bf16_paths()) {
    ForcePath force(path);
    std::vector<float> y(s.T * s.out);
    cpu::held_linear_forward(x.data(), nullptr, held(W, s.out, s.in), 0.0f, nullptr, y.data(), s.T);
    EXPECT_FALSE(test::within_f32_sum_bound(y, unrounded.value, unrounded.magnitude, s.in + 1))
        << cpu::held_bf16_path_name(path);
  }
  // ... and the f32 path (openblas) meets it against the unrounded product, not the rounded one.
  ForcePath force(HeldBf16Path::F32);
  std::vector<float> y(s.T * s.out);
  cpu::held_linear_forward(x.data(), nullptr, held(W, s.out, s.in), 0.0f, nullptr, y.data(), s.T);
  EXPECT_TRUE(test::within_f32_sum_bound(y, unrounded.value, unrounded.magnitude, s.in + 1));
  const Ref rounded = ref_xwt(x, W, nullptr, s.T, s.out, s.in);
  EXPECT_FALSE(test::within_f32_sum_bound(y, rounded.value, rounded.magnitude, s.in + 1));
}

TEST(HeldBf16Gemm, OnednnAndTheOpenblasFallbackAgreeOnTheSameInputs) {
  if (!onednn_runs_here()) GTEST_SKIP() << "oneDNN is not linked or cannot make a bf16 matmul on this CPU";
  uint64_t seed = 100;
  for (const Shape& s : shapes()) {
    SCOPED_TRACE(::testing::Message() << "T " << s.T << " in " << s.in << " out " << s.out);
    const std::vector<float> x = random_vec(s.T * s.in, ++seed, -2.0f, 2.0f);
    const std::vector<float> dy = random_vec(s.T * s.out, ++seed);
    const std::vector<uint16_t> W = to_bf16(random_vec(s.out * s.in, ++seed));
    const cpu::HeldMatrix Wm = held(W, s.out, s.in);
    std::vector<float> y[2], dx[2];
    int i = 0;
    for (HeldBf16Path path : {HeldBf16Path::Bf16Sgemm, HeldBf16Path::OneDnn}) {
      ForcePath force(path);
      y[i].resize(s.T * s.out);
      dx[i].resize(s.T * s.in);
      cpu::held_linear_forward(x.data(), nullptr, Wm, 0.0f, nullptr, y[i].data(), s.T);
      cpu::held_linear_backward(dy.data(), nullptr, nullptr, nullptr, Wm, 0.0f, dx[i].data(), nullptr, s.T);
      ++i;
    }
    // Two f32 sums of the same exact products: within 2·K·2⁻²⁴·Σ|products| of each other.
    const Ref r = ref_xwt(x, W, nullptr, s.T, s.out, s.in), d = ref_xw(dy, W, nullptr, s.T, s.out, s.in);
    EXPECT_TRUE(test::within_f32_sum_bound(y[1], y[0], r.magnitude, s.in));
    EXPECT_TRUE(test::within_f32_sum_bound(dx[1], dx[0], d.magnitude, s.out));
  }
}

TEST(HeldBf16Gemm, OpenblasIsTheF32PathBitForBit) {
  // --cpu-gemm openblas: held_linear_forward/backward are held_gemm_xwt/xw on the f32 x, as before
  // the engines existed (x kept f32, the weight widened tile by tile).
  ForcePath force(HeldBf16Path::F32);
  const Shape s{33, 257, 31};
  const std::vector<float> x = random_vec(s.T * s.in, 7), dy = random_vec(s.T * s.out, 8);
  const std::vector<uint16_t> W = to_bf16(random_vec(s.out * s.in, 9));
  const cpu::HeldMatrix Wm = held(W, s.out, s.in);
  std::vector<float> y(s.T * s.out), y_ref(s.T * s.out), dx(s.T * s.in), dx_ref(s.T * s.in);
  cpu::held_linear_forward(x.data(), nullptr, Wm, 0.0f, nullptr, y.data(), s.T);
  cpu::held_gemm_xwt(x.data(), Wm, 0.0f, y_ref.data(), s.T);
  cpu::held_linear_backward(dy.data(), nullptr, nullptr, nullptr, Wm, 0.0f, dx.data(), nullptr, s.T);
  cpu::held_gemm_xw(dy.data(), Wm, 0.0f, dx_ref.data(), s.T);
  EXPECT_EQ(y, y_ref);
  EXPECT_EQ(dx, dx_ref);
}

TEST(HeldBf16Gemm, AProducersBf16CopyGivesTheSameBitsAsRoundingHere) {
  const Shape s{32, 33, 31};
  const std::vector<float> x = random_vec(s.T * s.in, 21), dy = random_vec(s.T * s.out, 22);
  const std::vector<uint16_t> xb = to_bf16(x), dyb = to_bf16(dy), W = to_bf16(random_vec(s.out * s.in, 23));
  const cpu::HeldMatrix Wm = held(W, s.out, s.in);
  for (HeldBf16Path path : bf16_paths()) {
    ForcePath force(path);
    std::vector<float> y(s.T * s.out), y16(s.T * s.out), dx(s.T * s.in), dx16(s.T * s.in);
    cpu::held_linear_forward(x.data(), nullptr, Wm, 0.0f, nullptr, y.data(), s.T);
    cpu::held_linear_forward(x.data(), xb.data(), Wm, 0.0f, nullptr, y16.data(), s.T);
    cpu::held_linear_backward(dy.data(), nullptr, nullptr, nullptr, Wm, 0.0f, dx.data(), nullptr, s.T);
    cpu::held_linear_backward(dy.data(), dyb.data(), nullptr, nullptr, Wm, 0.0f, dx16.data(), nullptr, s.T);
    EXPECT_EQ(y, y16) << cpu::held_bf16_path_name(path);
    EXPECT_EQ(dx, dx16) << cpu::held_bf16_path_name(path);
  }
}

TEST(HeldBf16Gemm, OtherHeldTypesKeepTheF32Path) {
  // Only bf16 weights take the bf16 numerics in this milestone: f16 keeps x f32 on every path.
  const Shape s{5, 31, 33};
  const std::vector<float> x = random_vec(s.T * s.in, 31);
  const Tensor w16 = test::random_tensor({s.out, s.in}, 32).to(DType::F16);
  const cpu::HeldMatrix Wm{w16.data<uint16_t>(), DType::F16, s.out, s.in};
  std::vector<float> y_ref(s.T * s.out);
  cpu::held_gemm_xwt(x.data(), Wm, 0.0f, y_ref.data(), s.T);
  for (HeldBf16Path path : bf16_paths()) {
    ForcePath force(path);
    std::vector<float> y(s.T * s.out);
    cpu::held_linear_forward(x.data(), nullptr, Wm, 0.0f, nullptr, y.data(), s.T);
    EXPECT_EQ(y, y_ref) << cpu::held_bf16_path_name(path);
  }
}

TEST(HeldBf16Gemm, OnednnPrimitivesAreMadeOncePerShapeAndRunOnSeveralThreads) {
  if (!onednn_runs_here()) GTEST_SKIP() << "oneDNN is not linked or cannot make a bf16 matmul on this CPU";
  ForcePath force(HeldBf16Path::OneDnn);
  const Shape s{17, 45, 23};  // a shape no other test uses
  const std::vector<float> x = random_vec(s.T * s.in, 41);
  const std::vector<uint16_t> W = to_bf16(random_vec(s.out * s.in, 42));
  const cpu::HeldMatrix Wm = held(W, s.out, s.in);
  std::vector<float> y(s.T * s.out);
  const int64_t before = cpu::onednn_primitives_made();
  cpu::held_linear_forward(x.data(), nullptr, Wm, 0.0f, nullptr, y.data(), s.T);
  EXPECT_EQ(cpu::onednn_primitives_made(), before + 1);
  EXPECT_FALSE(cpu::onednn_last_impl().empty());
  std::vector<float> again(s.T * s.out);
  cpu::held_linear_forward(x.data(), nullptr, Wm, 0.0f, nullptr, again.data(), s.T);
  EXPECT_EQ(cpu::onednn_primitives_made(), before + 1) << "the cached primitive is reused";
  EXPECT_EQ(again, y);
  // Four threads at once on the one cached primitive (each with its own scratchpad): the same bits.
  std::vector<std::vector<float>> outs(4, std::vector<float>(s.T * s.out));
  std::vector<std::thread> threads;
  for (auto& o : outs)
    threads.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep) cpu::held_linear_forward(x.data(), nullptr, Wm, 0.0f, nullptr, o.data(), s.T);
    });
  for (auto& t : threads) t.join();
  for (const auto& o : outs) EXPECT_EQ(o, y);
  EXPECT_EQ(cpu::onednn_primitives_made(), before + 1);
}

TEST(HeldBf16Gemm, OnednnCacheHoldsAtMostItsBoundAndRemakesAnEvictedShape) {
  if (!onednn_runs_here()) GTEST_SKIP() << "oneDNN is not linked or cannot make a bf16 matmul on this CPU";
  ForcePath force(HeldBf16Path::OneDnn);
  // A new token count per call, as packed micro-batches bring: more shapes than the cache holds.
  const int64_t in = 32, out = 16;
  const std::vector<uint16_t> W = to_bf16(random_vec(out * in, 51));
  const std::vector<float> x = random_vec((cpu::kOnednnCachedPrimitives + 20) * in, 52);
  std::vector<float> y((cpu::kOnednnCachedPrimitives + 20) * out);
  const int64_t before = cpu::onednn_primitives_made();
  for (int64_t T = 1; T <= cpu::kOnednnCachedPrimitives + 20; ++T)
    cpu::held_linear_forward(x.data(), nullptr, held(W, out, in), 0.0f, nullptr, y.data(), T);
  EXPECT_EQ(cpu::onednn_primitives_made(), before + cpu::kOnednnCachedPrimitives + 20);
  EXPECT_LE(cpu::onednn_cached_primitives(), cpu::kOnednnCachedPrimitives);
  // T = 1 was evicted: it is made again, and computes what the reference says.
  std::vector<float> y1(out);
  cpu::held_linear_forward(x.data(), nullptr, held(W, out, in), 0.0f, nullptr, y1.data(), 1);
  EXPECT_EQ(cpu::onednn_primitives_made(), before + cpu::kOnednnCachedPrimitives + 21);
  const Ref r = ref_xwt(x, W, nullptr, 1, out, in);
  EXPECT_TRUE(test::within_f32_sum_bound(y1, r.value, r.magnitude, in + 1));
}

// The LM head over a weight held in bf16 (a frozen tied embedding over a bf16 base, or full
// training's bf16 copy of the head): the fused cross-entropy's two products against W take the
// engine's bf16 numerics, as the CUDA head's bf16 instantiation does. The reference, in double:
// logits from the rounded x, the loss and G = scale·(softmax − onehot) from them, dx = round(G)·W.
// The f32 path (--cpu-gemm openblas) multiplies the unrounded x and G, and is far from it.
TEST(HeldBf16Head, TheLmHeadOverABf16WeightTakesTheBf16Numerics) {
  const int64_t T = 37, D = 65, V = 301, chunk = 16;
  const float scale = 0.5f;
  const std::vector<float> x = random_vec(T * D, 61, -4.0f, 4.0f);
  const std::vector<uint16_t> W = to_bf16(random_vec(V * D, 62));
  std::vector<int32_t> labels(T);
  for (int64_t t = 0; t < T; ++t) labels[t] = t % 7 == 3 ? -100 : static_cast<int32_t>((t * 37 + 11) % V);
  // The reference.
  const Ref logits = ref_xwt(x, W, nullptr, T, V, D);
  double loss_ref = 0.0;
  std::vector<float> G(T * V, 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] < 0) continue;
    double mx = -1e300, sum = 0.0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(logits.value[t * V + v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logits.value[t * V + v] - mx);
    loss_ref += mx + std::log(sum) - logits.value[t * V + labels[t]];
    for (int64_t v = 0; v < V; ++v)
      G[t * V + v] = static_cast<float>(scale * (std::exp(logits.value[t * V + v] - mx) / sum - (v == labels[t])));
  }
  const Ref dx_ref = ref_xw(G, W, nullptr, T, V, D);
  const auto rel_norm = [&](const std::vector<float>& a) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (static_cast<double>(a[i]) - dx_ref.value[i]) * (static_cast<double>(a[i]) - dx_ref.value[i]);
      den += static_cast<double>(dx_ref.value[i]) * dx_ref.value[i];
    }
    return std::sqrt(num / den);
  };
  const cpu::HeldMatrix Wm = held(W, V, D);
  const auto run = [&](std::vector<float>& dx) {
    std::vector<float> ws(static_cast<size_t>(cpu::cross_entropy_max_window(labels.data(), T, chunk) * V));
    dx.assign(T * D, 7.0f);
    return cpu::linear_cross_entropy(x.data(), Wm, labels.data(), T, D, V, chunk, ws.data(), scale, dx.data(), nullptr);
  };
  for (HeldBf16Path path : bf16_paths()) {
    SCOPED_TRACE(cpu::held_bf16_path_name(path));
    ForcePath force(path);
    const int64_t made = cpu::onednn_primitives_made();
    std::vector<float> dx;
    const cpu::CrossEntropyTotals r = run(dx);
    EXPECT_EQ(r.n_counted, T - (T + 3) / 7);
    EXPECT_NEAR(r.loss_sum, loss_ref, 1e-5 * loss_ref);
    // G's rounding to bf16 may differ where the kernel's softmax (exp_approx) and the reference's
    // straddle a rounding boundary: rare, one bf16 ulp each.
    EXPECT_LT(rel_norm(dx), std::ldexp(1.0, -12));
    if (path == HeldBf16Path::OneDnn) {
      EXPECT_GT(cpu::onednn_primitives_made(), made) << "oneDNN ran the head";
    }
  }
  ForcePath force(HeldBf16Path::F32);
  std::vector<float> dx;
  run(dx);
  EXPECT_GT(rel_norm(dx), std::ldexp(1.0, -10)) << "the f32 path does not round G";
}

}  // namespace
}  // namespace bp
