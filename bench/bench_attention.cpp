// Attention forward/backward throughput, head_dim 64: 512 packed tokens as 4×128 and 1×512 with 9
// query heads over 3 KV heads (SmolLM-135M), and 1×512 with 14 over 2 (Qwen2.5-0.5B). Reports
// tokens/s and GFLOP/s.
//
// FLOPs counted as useful work over the causal pairs (i, j <= i) of each sample:
//   forward 4·d per pair and head (q·k and p·v), backward 8·d (dp, dv, dk, dq) — the backward's
//   recomputation of q·k and the masked halves of diagonal blocks are not counted, so GFLOP/s is
//   comparable to FA2's.
//
//   ./build/bench/bench_attention --benchmark_min_time=0.5
//   BACKPROPAGATE_RUNTIME__CPU_KERNELS=avx2 ./build/bench/bench_attention   (one kernel variant)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "bench_kernels.h"
#include "core/threads.h"
#include "ops/attention.h"

namespace {

using bp::Tensor;

struct Setup {
  bp::AttentionShape shape;
  Tensor q, k, v, dout, cu, o, lse, dq, dk, dv;
  double pairs = 0;  // causal (query, key) pairs per head
};

Tensor random(bp::Shape s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (auto& x : v) x = d(rng);
  return Tensor::from_vector(v, s);
}

Setup make(int n_samples, int len, int hq, int hkv) {
  Setup s;
  s.shape = {hq, hkv, 64};
  const int64_t T = int64_t{n_samples} * len, cq = int64_t{hq} * 64, ckv = int64_t{hkv} * 64;
  s.q = random({T, cq}, 1);
  s.k = random({T, ckv}, 2);
  s.v = random({T, ckv}, 3);
  s.dout = random({T, cq}, 4);
  std::vector<int32_t> cu{0};
  for (int i = 0; i < n_samples; ++i) cu.push_back(cu.back() + len);
  s.cu = Tensor::from_vector(cu, {n_samples + 1});
  s.o = bp::attention_forward(s.q, s.k, s.v, s.cu, s.shape, &s.lse);
  s.dq = Tensor::empty({T, cq});
  s.dk = Tensor::empty({T, ckv});
  s.dv = Tensor::empty({T, ckv});
  s.pairs = double(n_samples) * len * (len + 1) / 2.0;
  return s;
}

// CPU seconds of the whole process (all threads). On a shared, loaded machine wall time includes
// time the threads spent descheduled; GFLOP per CPU-second tracks the kernel's own efficiency.
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

void report(benchmark::State& state, const Setup& s, double flops_per_pair_head, double cpu_s) {
  const double T = double(s.q.dim(0));
  state.counters["GFLOP/cpu_s"] =
      s.pairs * s.shape.n_heads * flops_per_pair_head * 1e-9 * double(state.iterations()) / cpu_s;
  state.counters["tokens/s"] = benchmark::Counter(T, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(s.pairs * s.shape.n_heads * flops_per_pair_head * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AttentionForward(benchmark::State& state) {
  Setup s = make(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), static_cast<int>(state.range(2)),
                 static_cast<int>(state.range(3)));
  const double c0 = process_cpu_s();
  for (auto _ : state) {
    Tensor o = bp::attention_forward(s.q, s.k, s.v, s.cu, s.shape, &s.lse);
    benchmark::DoNotOptimize(o.raw());
  }
  report(state, s, 4.0 * 64, process_cpu_s() - c0);
}

void BM_AttentionBackward(benchmark::State& state) {
  Setup s = make(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), static_cast<int>(state.range(2)),
                 static_cast<int>(state.range(3)));
  const double c0 = process_cpu_s();
  for (auto _ : state) {
    bp::attention_backward(s.dout, s.q, s.k, s.v, s.o, s.lse, s.cu, s.shape, s.dq, s.dk, s.dv);
    benchmark::DoNotOptimize(s.dq.raw());
  }
  report(state, s, 8.0 * 64, process_cpu_s() - c0);
}

BENCHMARK(BM_AttentionForward)
    ->Args({4, 128, 9, 3})
    ->Args({1, 512, 9, 3})
    ->Args({1, 512, 14, 2})
    ->ArgNames({"samples", "len", "hq", "hkv"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_AttentionBackward)
    ->Args({4, 128, 9, 3})
    ->Args({1, 512, 9, 3})
    ->Args({1, 512, 14, 2})
    ->ArgNames({"samples", "len", "hq", "hkv"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  // All cores unless OMP_NUM_THREADS pins a count (e.g. 1 to measure per-core efficiency).
  const char* env = std::getenv("OMP_NUM_THREADS");
  bp::set_num_threads(env ? std::atoi(env) : 0);
  bp::bench::select_kernels_from_environment();  // BACKPROPAGATE_RUNTIME__CPU_KERNELS=avx2 etc.
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
