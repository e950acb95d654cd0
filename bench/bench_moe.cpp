// Mixture-of-Experts: the experts' grouped GEMMs (ops/moe.h: per expert, one GEMM over its
// contiguous block of routed rows) against one dense GEMM of the same FLOPs, in the same run
// (CONVENTIONS.md "Performance method": only ratios hold on a noisy machine). Issue 42 asks the
// grouped rate to be at least 70% of the dense one.
//
// Shape: Qwen3-MoE-like, D 2048, expert width F 768, E 128 experts, k 8, T tokens (arg 2 of the
// grouped runs, arg 0 of the dense: 512, the issue's, 4096 routed rows, 32 per expert on average;
// and 2048, 128 per expert). Per expert e with n_e rows: gate and up [n_e, D]·[F, D]ᵀ, down [n_e, F]·[D, F]ᵀ (the
// SwiGLU between them is not timed: the same elementwise work in both). Dense: the same three products with all 4096
// rows against one [F, D] / [D, F] weight. Routing (arg 0): 0 balanced (32 rows per expert), 1 a random router's top-8
// (moe_route_forward over random logits, then moe_sort: uneven blocks, as a real batch has); arg 1 below. Counter:
// GFLOP/s, 2·M·N·K per GEMM.
//
// Threads: BP_BENCH_THREADS=n (default: all cores); with one thread the rates use CPU time.
// Run: BP_BENCH_THREADS=1 ./build/bench/bench_moe --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <vector>

#include "backend/cpu/gemm.h"
#include "core/threads.h"
#include "ops/moe.h"

namespace {

// Deterministic values in [-1, 1) (no RNG needed: the GEMMs' speed does not depend on them).
std::vector<float> values(int64_t n, int64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = static_cast<float>(((i + seed) * 7919) % 1000 - 500) / 500.0f;
  return v;
}

constexpr int64_t kD = 2048, kF = 768, kE = 128, kK = 8;

// The routed rows' expert blocks: offsets [E + 1].
std::vector<int32_t> expert_offsets(int routing, int64_t T) {
  const int64_t rows = T * kK;
  std::vector<int32_t> off(kE + 1);
  if (routing == 0) {
    for (int64_t e = 0; e <= kE; ++e) off[static_cast<size_t>(e)] = static_cast<int32_t>(e * rows / kE);
    return off;
  }
  std::vector<float> l = values(T * kE, 7);
  for (size_t i = 0; i < l.size(); ++i) l[i] *= static_cast<float>((i * 2654435761u) % 97) / 24.0f;  // uneven
  const bp::Tensor logits = bp::Tensor::from_vector(l, bp::Shape{T, kE});
  const bp::MoeRouting r = bp::moe_route_forward(logits, kK, true);
  return bp::moe_sort(r.expert_ids, kE).host_offsets;
}

void set_counters(benchmark::State& state, int64_t rows) {
  const double flops = 3.0 * 2.0 * static_cast<double>(rows) * kF * kD;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// The three GEMMs of expert e over its rows [r0, r0 + n).
struct Experts {
  std::vector<float> xs, wg, wu, wd, g, u, y;
  explicit Experts(int64_t rows)
      : xs(values(rows * kD, 1)),
        wg(values(kE * kF * kD, 2)),
        wu(values(kE * kF * kD, 3)),
        wd(values(kE * kD * kF, 4)),
        g(rows * kF),
        u(rows * kF),
        y(rows * kD) {}
  void run(int64_t e, int64_t r0, int64_t n) {
    bp::cpu::sgemm(false, true, n, kF, kD, 1.0f, xs.data() + r0 * kD, kD, wg.data() + e * kF * kD, kD, 0.0f,
                   g.data() + r0 * kF, kF);
    bp::cpu::sgemm(false, true, n, kF, kD, 1.0f, xs.data() + r0 * kD, kD, wu.data() + e * kF * kD, kD, 0.0f,
                   u.data() + r0 * kF, kF);
    bp::cpu::sgemm(false, true, n, kD, kF, 1.0f, g.data() + r0 * kF, kF, wd.data() + e * kD * kF, kF, 0.0f,
                   y.data() + r0 * kD, kD);
  }
};

// Arg 1: 0 the experts one after another (each GEMM on BLAS's threads, as model/transformer_moe.cpp
// runs them), 1 the experts spread over OpenMP threads (each GEMM on its calling thread: the OpenMP
// build of OpenBLAS, as backend/cpu/attention.cpp relies on).
void BM_grouped_experts(benchmark::State& state) {
  const int64_t T = state.range(2);
  const std::vector<int32_t> off = expert_offsets(static_cast<int>(state.range(0)), T);
  const bool spread = state.range(1) == 1;
  Experts x(T * kK);
  for (auto _ : state) {
    if (spread) {
#pragma omp parallel for schedule(dynamic, 1)
      for (int64_t e = 0; e < kE; ++e) {
        const int64_t r0 = off[static_cast<size_t>(e)], n = off[static_cast<size_t>(e) + 1] - r0;
        if (n > 0) x.run(e, r0, n);
      }
    } else {
      for (int64_t e = 0; e < kE; ++e) {
        const int64_t r0 = off[static_cast<size_t>(e)], n = off[static_cast<size_t>(e) + 1] - r0;
        if (n > 0) x.run(e, r0, n);
      }
    }
    benchmark::DoNotOptimize(x.y.data());
  }
  set_counters(state, T * kK);
}

void BM_dense_same_flops(benchmark::State& state) {
  const int64_t rows = state.range(0) * kK;
  const std::vector<float> xs = values(rows * kD, 1), wg = values(kF * kD, 2), wu = values(kF * kD, 3),
                           wd = values(kD * kF, 4);
  std::vector<float> g(rows * kF), u(rows * kF), y(rows * kD);
  for (auto _ : state) {
    bp::cpu::sgemm(false, true, rows, kF, kD, 1.0f, xs.data(), kD, wg.data(), kD, 0.0f, g.data(), kF);
    bp::cpu::sgemm(false, true, rows, kF, kD, 1.0f, xs.data(), kD, wu.data(), kD, 0.0f, u.data(), kF);
    bp::cpu::sgemm(false, true, rows, kD, kF, 1.0f, g.data(), kF, wd.data(), kF, 0.0f, y.data(), kD);
    benchmark::DoNotOptimize(y.data());
  }
  set_counters(state, rows);
}

int bench_threads() {
  const char* env = std::getenv("BP_BENCH_THREADS");
  return env ? std::atoi(env) : 0;  // 0: all cores
}

BENCHMARK(BM_dense_same_flops)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_grouped_experts)
    ->Args({0, 0, 512})
    ->Args({1, 0, 512})
    ->Args({0, 1, 512})
    ->Args({1, 1, 512})
    ->Args({0, 0, 2048})
    ->Args({1, 0, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  bp::set_num_threads(bench_threads());
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
