// Mixture-of-Experts: the experts' grouped GEMMs (ops/moe.h: per expert, one GEMM over its
// contiguous block of routed rows) against one dense GEMM of the same FLOPs, in the same run
// (CONVENTIONS.md "Performance method": only ratios hold on a noisy machine). Issue 42 asks the
// grouped rate to be at least 70% of the dense one.
//
// Shape: Qwen3-MoE-like, D 2048, expert width F 768, E 128 experts, k 8, T tokens (the last arg:
// 512, the issue's, 4096 routed rows, 32 per expert on average; and 2048, 128 per expert). Per
// expert e with n_e rows, the three products of each pass (the SwiGLU between them is not timed:
// the same elementwise work in both):
//   forward  gate, up [n_e, D]·[F, D]ᵀ, down [n_e, F]·[D, F]ᵀ    (backend/cpu/linear.cpp linear_forward)
//   dX       dgate·Wg + dup·Wu [n_e, F]·[F, D], dys·Wd [n_e, D]·[D, F]   (linear_dx, backward's input grads)
//   dW       dgateᵀ·x, dupᵀ·x [F, n_e]·[n_e, D], dysᵀ·m [D, n_e]·[n_e, F] (linear_dW_accumulate, full FT)
// Dense: the same three products with all T·k rows against one weight each. Routing (arg 0): 0
// balanced (T·k / E rows per expert), 1 a random router's top-8 (moe_route_forward over random
// logits, then moe_sort: uneven blocks, as a real batch has). Arg 1: the forward's path, 0 as the
// model runs it (cpu::sgemm_weight_nt: the few-rows kernel streaming each expert's weight at up to
// kFewRowsMax rows, OpenBLAS above), 1 plain OpenBLAS sgemm per expert (before issue 42's speed-up).
// Counter: GFLOP/s, 2·M·N·K per GEMM.
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

enum Pass { kForward = 0, kDx = 1, kDw = 2 };

// The three products of one pass over rows [r0, r0 + n) against expert e's weights (e 0 and all
// rows: the dense comparison). blas_forward: plain sgemm for the forward instead of sgemm_weight_nt.
struct Experts {
  std::vector<float> xs, wg, wu, wd, g, u, y, dwg, dwu, dwd;
  Experts(int64_t rows, int64_t experts)
      : xs(values(rows * kD, 1)),
        wg(values(experts * kF * kD, 2)),
        wu(values(experts * kF * kD, 3)),
        wd(values(experts * kD * kF, 4)),
        g(values(rows * kF, 5)),
        u(values(rows * kF, 6)),
        y(values(rows * kD, 8)) {}
  void grads(int64_t experts) {
    dwg.assign(static_cast<size_t>(experts * kF * kD), 0.0f);
    dwu.assign(dwg.size(), 0.0f);
    dwd.assign(dwg.size(), 0.0f);
  }
  void run(Pass pass, bool blas_forward, int64_t e, int64_t r0, int64_t n) {
    float* x = xs.data() + r0 * kD;
    float *ge = g.data() + r0 * kF, *ue = u.data() + r0 * kF, *ye = y.data() + r0 * kD;
    const float *Wg = wg.data() + e * kF * kD, *Wu = wu.data() + e * kF * kD, *Wd = wd.data() + e * kD * kF;
    switch (pass) {
      case kForward:
        if (blas_forward) {
          bp::cpu::sgemm(false, true, n, kF, kD, 1.0f, x, kD, Wg, kD, 0.0f, ge, kF);
          bp::cpu::sgemm(false, true, n, kF, kD, 1.0f, x, kD, Wu, kD, 0.0f, ue, kF);
          bp::cpu::sgemm(false, true, n, kD, kF, 1.0f, ge, kF, Wd, kF, 0.0f, ye, kD);
        } else {
          bp::cpu::sgemm_weight_nt(n, kF, kD, 1.0f, x, kD, Wg, kD, 0.0f, ge, kF);
          bp::cpu::sgemm_weight_nt(n, kF, kD, 1.0f, x, kD, Wu, kD, 0.0f, ue, kF);
          bp::cpu::sgemm_weight_nt(n, kD, kF, 1.0f, ge, kF, Wd, kF, 0.0f, ye, kD);
        }
        break;
      case kDx:  // dxs = dgate·Wg + dup·Wu; dm = dys·Wd (g, u, y stand for dgate, dup, dys)
        bp::cpu::sgemm(false, false, n, kD, kF, 1.0f, ge, kF, Wg, kD, 0.0f, x, kD);
        bp::cpu::sgemm(false, false, n, kD, kF, 1.0f, ue, kF, Wu, kD, 1.0f, x, kD);
        bp::cpu::sgemm(false, false, n, kF, kD, 1.0f, ye, kD, Wd, kF, 0.0f, ge, kF);
        break;
      case kDw:
        bp::cpu::sgemm(true, false, kF, kD, n, 1.0f, ge, kF, x, kD, 1.0f, dwg.data() + e * kF * kD, kD);
        bp::cpu::sgemm(true, false, kF, kD, n, 1.0f, ue, kF, x, kD, 1.0f, dwu.data() + e * kF * kD, kD);
        bp::cpu::sgemm(true, false, kD, kF, n, 1.0f, ye, kD, ge, kF, 1.0f, dwd.data() + e * kD * kF, kF);
        break;
    }
  }
};

// Args: routing, forward path (0 model's, 1 plain sgemm), T.
void grouped(benchmark::State& state, Pass pass) {
  const int64_t T = state.range(2);
  const std::vector<int32_t> off = expert_offsets(static_cast<int>(state.range(0)), T);
  const bool blas_forward = state.range(1) == 1;
  Experts x(T * kK, kE);
  if (pass == kDw) x.grads(kE);
  for (auto _ : state) {
    for (int64_t e = 0; e < kE; ++e) {
      const int64_t r0 = off[static_cast<size_t>(e)], n = off[static_cast<size_t>(e) + 1] - r0;
      if (n > 0) x.run(pass, blas_forward, e, r0, n);
    }
    benchmark::DoNotOptimize(x.y.data());
  }
  set_counters(state, T * kK);
}

void dense(benchmark::State& state, Pass pass) {
  const int64_t rows = state.range(0) * kK;
  Experts x(rows, 1);
  if (pass == kDw) x.grads(1);
  for (auto _ : state) {
    x.run(pass, true, 0, 0, rows);
    benchmark::DoNotOptimize(x.y.data());
  }
  set_counters(state, rows);
}

void BM_grouped_forward(benchmark::State& s) {
  grouped(s, kForward);
}
void BM_grouped_dx(benchmark::State& s) {
  grouped(s, kDx);
}
void BM_grouped_dw(benchmark::State& s) {
  grouped(s, kDw);
}
void BM_dense_forward(benchmark::State& s) {
  dense(s, kForward);
}
void BM_dense_dx(benchmark::State& s) {
  dense(s, kDx);
}
void BM_dense_dw(benchmark::State& s) {
  dense(s, kDw);
}

int bench_threads() {
  const char* env = std::getenv("BP_BENCH_THREADS");
  return env ? std::atoi(env) : 0;  // 0: all cores
}

BENCHMARK(BM_dense_forward)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_grouped_forward)
    ->Args({0, 0, 512})
    ->Args({1, 0, 512})
    ->Args({0, 1, 512})
    ->Args({1, 1, 512})
    ->Args({0, 0, 2048})
    ->Args({1, 0, 2048})
    ->Args({1, 1, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_dense_dx)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_grouped_dx)
    ->Args({0, 0, 512})
    ->Args({1, 0, 512})
    ->Args({1, 0, 2048})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_dense_dw)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_grouped_dw)
    ->Args({0, 0, 512})
    ->Args({1, 0, 512})
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
