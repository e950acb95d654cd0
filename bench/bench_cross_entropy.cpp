// Fused linear + cross-entropy (with dx and dW) at 512 tokens × 576 × 49152 (SmolLM-135M's head),
// next to the three raw GEMMs of the same work (logits, dx, dW on a full [T × V] buffer) timed in
// the same iterations, so the ratio fused / GEMMs is measured under the same machine load.
//
//   ./build/bench/bench_cross_entropy --benchmark_min_time=2
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "backend/cpu/gemm.h"
#include "core/threads.h"
#include "ops/cross_entropy.h"

namespace {

using bp::Tensor;
using Clock = std::chrono::steady_clock;

Tensor random(bp::Shape s, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(static_cast<size_t>(s.numel()));
  for (auto& x : v) x = d(rng);
  return Tensor::from_vector(v, s);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
// CPU seconds of the whole process (all threads): on a loaded machine this tracks the work done
// better than wall time, which includes time the threads spent descheduled.
double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// range(0): chunk tokens; range(1): 1 = trainable head (dW), 0 = frozen (dx only).
void BM_FusedCrossEntropyVsGemms(benchmark::State& state) {
  const int64_t T = 512, D = 576, V = 49152, chunk = state.range(0);
  const bool with_dW = state.range(1) != 0;
  Tensor x = random({T, D}, 1, 1.0f), W = random({V, D}, 2, 0.05f);
  std::vector<int32_t> labels(T);
  for (int64_t t = 0; t < T; ++t) labels[t] = static_cast<int32_t>((t * 7919) % V);
  Tensor lab = Tensor::from_vector(labels, {T});
  Tensor dx = Tensor::empty({T, D}), dW = Tensor::zeros({V, D}), logits = Tensor::empty({T, V});
  double fused_s = 0, gemm_s = 0, fused_cpu = 0, gemm_cpu = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    double c0 = process_cpu_s();
    auto r = bp::linear_cross_entropy_forward_backward(x, W, lab, 1.0f / T, dx, with_dW ? &dW : nullptr, chunk);
    benchmark::DoNotOptimize(r.loss_sum);
    fused_s += seconds_since(t0);
    fused_cpu += process_cpu_s() - c0;
    state.PauseTiming();
    t0 = Clock::now();
    c0 = process_cpu_s();
    bp::cpu::sgemm(false, true, T, V, D, 1.0f, x.data<float>(), D, W.data<float>(), D, 0.0f, logits.data<float>(), V);
    bp::cpu::sgemm(false, false, T, D, V, 1.0f, logits.data<float>(), V, W.data<float>(), D, 0.0f, dx.data<float>(), D);
    if (with_dW)
      bp::cpu::sgemm(true, false, V, D, T, 1.0f, logits.data<float>(), V, x.data<float>(), D, 1.0f, dW.data<float>(),
                     D);
    gemm_s += seconds_since(t0);
    gemm_cpu += process_cpu_s() - c0;
    state.ResumeTiming();
  }
  const double n = double(state.iterations());
  const double gemm_flops = 2.0 * T * V * D * (with_dW ? 3 : 2);
  state.counters["fused_ms"] = fused_s / n * 1e3;
  state.counters["gemms_ms"] = gemm_s / n * 1e3;
  state.counters["ratio"] = fused_s / gemm_s;
  state.counters["ratio_cpu"] = fused_cpu / gemm_cpu;
  state.counters["gemm_GFLOP/s"] = gemm_flops * n / gemm_s * 1e-9;
  state.counters["fused_GFLOP/s"] = gemm_flops * n / fused_s * 1e-9;
  state.counters["tokens/s"] = T * n / fused_s;
}

BENCHMARK(BM_FusedCrossEntropyVsGemms)
    ->Args({256, 1})
    ->Args({512, 1})
    ->Args({256, 0})
    ->ArgNames({"chunk", "dW"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  // All cores unless OMP_NUM_THREADS pins a count (e.g. 1 to measure per-core efficiency).
  const char* env = std::getenv("OMP_NUM_THREADS");
  bp::set_num_threads(env ? std::atoi(env) : 0);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
