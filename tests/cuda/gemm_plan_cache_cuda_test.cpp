// The cache of cuBLASLt plans (src/backend/cuda/gemm_plan_cache.h): its key holds every field the
// heuristic's answer depends on (and not alpha/beta, which it never sees); the LRU cache keeps at
// most `capacity` plans, evicting the least recently used, and keeps nothing when the query
// throws; the simulated GEMM (sim/gemm_sim.cpp) asks the simulated heuristic once per distinct call
// and again for another shape, pointer alignment or workspace. The whole-step check (a step's
// second run asks nothing) is in model_cuda_test.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <vector>

#include "backend/cuda/gemm.cuh"
#include "backend/cuda/gemm_plan_cache.h"
#include "backend/cuda/sim/gemm_sim.h"
#include "core/error.h"

namespace bp::sim {
namespace {

using gemm::gemm_plan_key;
using gemm::GemmAlignments;
using gemm::GemmDesc;

GemmDesc some_gemm() {
  GemmDesc d = gemm::linear_forward_gemm(33, 72, 24, gemm::DType::BF16, gemm::DType::F32);
  return d;
}

TEST(GemmPlanCache, KeyHoldsEveryFieldTheHeuristicSeesAndNotTheScalars) {
  const GemmDesc d = some_gemm();
  const GemmAlignments al;
  const auto base = gemm_plan_key(d, al, 4096, 0);
  // Each of these changes what cuBLASLt is asked (a descriptor, a layout or a preference).
  std::vector<std::function<void(GemmDesc&, GemmAlignments&, size_t&, int&)>> changes = {
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) { g.trans_a = !g.trans_a; },
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) { g.trans_b = !g.trans_b; },
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) { g.m += 1; },
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) { g.n += 1; },
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) { g.k += 1; },
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) { g.lda += 1; },
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) { g.ldb += 1; },
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) { g.ldc += 1; },
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) { g.batch = 2; },
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) { g.a_type = gemm::DType::F16; },
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) { g.b_type = gemm::DType::F32; },
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) { g.c_type = gemm::DType::BF16; },
      [](GemmDesc&, GemmAlignments& a, size_t&, int&) { a.a = 4; },
      [](GemmDesc&, GemmAlignments& a, size_t&, int&) { a.b = 16; },
      [](GemmDesc&, GemmAlignments& a, size_t&, int&) { a.c = 8; },
      [](GemmDesc&, GemmAlignments& a, size_t&, int&) { a.d = 8; },
      [](GemmDesc&, GemmAlignments&, size_t& ws, int&) { ws = 0; },
      [](GemmDesc&, GemmAlignments&, size_t&, int& device) { device = 1; },
      // device pointer mode: an attribute of the plan's matmul descriptor
      [](GemmDesc& g, GemmAlignments&, size_t&, int&) {
        static const float pair[2] = {1, 0};
        g.alpha_beta_on_device = pair;
      }};
  for (size_t i = 0; i < changes.size(); ++i) {
    GemmDesc g = d;
    GemmAlignments a = al;
    size_t ws = 4096;
    int device = 0;
    changes[i](g, a, ws, device);
    EXPECT_FALSE(gemm_plan_key(g, a, ws, device) == base) << "change " << i << " kept the key";
  }
  // Strides are layout attributes only with a batch; alpha and beta go to cublasLtMatmul only.
  GemmDesc same = d;
  same.alpha = 0.25f;
  same.beta = 1.0f;
  same.stride_a = 999;
  EXPECT_TRUE(gemm_plan_key(same, al, 4096, 0) == base);
  // In device pointer mode the mode is in the key, not where alpha and beta are.
  static const float pair_a[2] = {1, 0}, pair_b[2] = {2, 1};
  GemmDesc on_device_a = d, on_device_b = d;
  on_device_a.alpha_beta_on_device = pair_a;
  on_device_b.alpha_beta_on_device = pair_b;
  EXPECT_TRUE(gemm_plan_key(on_device_a, al, 4096, 0) == gemm_plan_key(on_device_b, al, 4096, 0));
  GemmDesc batched = d, other_stride = d;
  batched.batch = other_stride.batch = 3;
  batched.stride_c = 100;
  other_stride.stride_c = 200;
  EXPECT_FALSE(gemm_plan_key(batched, al, 4096, 0) == gemm_plan_key(other_stride, al, 4096, 0));
}

gemm::GemmPlanKey key_of_m(int64_t m) {
  GemmDesc d = some_gemm();
  d.m = m;
  d.ldc = std::max<int64_t>(d.ldc, m);
  return gemm_plan_key(d, GemmAlignments{}, 0, 0);
}

TEST(GemmPlanCache, KeepsTheMostRecentlyUsedPlansUpToItsCapacity) {
  gemm::GemmPlanCache<int> cache(3);
  int made = 0;
  auto plan_of = [&](int64_t m) { return cache.find_or_make(key_of_m(m), [&](int& p) { p = ++made * 10; }); };
  EXPECT_EQ(plan_of(1), 10);
  EXPECT_EQ(plan_of(2), 20);
  EXPECT_EQ(plan_of(3), 30);
  EXPECT_EQ(plan_of(1), 10) << "cached: no new query";
  EXPECT_EQ(made, 3);
  EXPECT_EQ(plan_of(4), 40) << "a fourth plan evicts the least recently used (m=2, not m=1)";
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.evictions(), 1u);
  EXPECT_EQ(plan_of(1), 10);
  EXPECT_EQ(plan_of(3), 30);
  EXPECT_EQ(made, 4);
  EXPECT_EQ(plan_of(2), 50) << "m=2 was evicted: asked again";
  EXPECT_EQ(cache.hits(), 3u);
  EXPECT_EQ(cache.misses(), 5u);
}

TEST(GemmPlanCache, AQueryThatThrowsKeepsNothing) {
  gemm::GemmPlanCache<int> cache;
  EXPECT_THROW(cache.find_or_make(key_of_m(5), [](int&) { throw std::runtime_error("heuristic failed"); }),
               std::runtime_error);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.find_or_make(key_of_m(5), [](int& p) { p = 7; }), 7) << "the next call asks again";
}

// The simulated GEMM on device memory: the same call asks the heuristic once; another shape,
// another pointer alignment (the panel pointers `C + n0` of the chunked GEMMs) or another workspace
// asks again, and coming back to the first call asks nothing.
TEST(GemmPlanCache, SimulatedGemmAsksTheHeuristicOncePerDistinctCall) {
  const int64_t M = 5, N = 37, K = 8;
  void *x_mem = nullptr, *w_mem = nullptr, *y_mem = nullptr, *ws_mem = nullptr;
  ASSERT_EQ(cudaMalloc(&x_mem, M * K * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&w_mem, N * K * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&y_mem, M * N * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ws_mem, 4096), cudaSuccess);
  auto* X = static_cast<float*>(x_mem);
  auto* W = static_cast<float*>(w_mem);
  auto* Y = static_cast<float*>(y_mem);
  std::fill(X, X + M * K, 0.5f);
  std::fill(W, W + N * K, 0.25f);
  const GemmDesc full = gemm::row_major_gemm(false, true, M, N, K, 1.0f, K, K, 0.0f, N);
  const GemmDesc panel = gemm::row_major_gemm(false, true, M, 7, K, 1.0f, K, K, 0.0f, N);
  auto queries_of = [&](const std::function<void()>& calls) {
    const uint64_t before = gemm_heuristic_queries();
    calls();
    return gemm_heuristic_queries() - before;
  };
  // A shape no other test uses, so this thread's cache cannot hold it yet.
  EXPECT_EQ(queries_of([&] {
              for (int i = 0; i < 3; ++i) gemm(full, W, X, Y, ws_mem, 4096, nullptr);
            }),
            1u);
  EXPECT_FLOAT_EQ(Y[0], 0.5f * 0.25f * K);
  EXPECT_EQ(queries_of([&] { gemm(full, W, X, Y, ws_mem, 1024, nullptr); }), 1u) << "another workspace";
  EXPECT_EQ(queries_of([&] { gemm(panel, W, X, Y, ws_mem, 4096, nullptr); }), 1u) << "another shape";
  // The same shape with C and A four bytes past a 256-byte boundary: another alignment class.
  EXPECT_EQ(queries_of([&] { gemm(panel, W + 9 * K, X, Y + 9, ws_mem, 4096, nullptr); }), 1u);
  EXPECT_EQ(queries_of([&] { gemm(panel, W + 11 * K, X, Y + 11, ws_mem, 4096, nullptr); }), 0u)
      << "Y + 11 floats is 4-byte aligned too: the same class";
  EXPECT_EQ(queries_of([&] {
              gemm(full, W, X, Y, ws_mem, 4096, nullptr);
              gemm(panel, W, X, Y, ws_mem, 4096, nullptr);
            }),
            0u);
  EXPECT_GE(gemm_plans_cached(), 4u);
  for (void* p : {x_mem, w_mem, y_mem, ws_mem}) cudaFree(p);
}

}  // namespace
}  // namespace bp::sim
