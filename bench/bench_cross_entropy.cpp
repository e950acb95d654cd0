// Fused linear + cross-entropy (with dx and dW) at 512 tokens × 576 × 49152 (SmolLM-135M's head),
// next to the three raw GEMMs of the same work (logits, dx, dW on a full [T × V] buffer) timed in
// the same iterations, so the ratio fused / GEMMs is measured under the same machine load; and the
// frozen head held in bf16 (a tied embedding over a bf16 base: the engine's bf16 path, oneDNN where
// the CPU has bf16 dot products) against the same head in f32, alternating in each iteration.
//
//   ./build/bench/bench_cross_entropy --benchmark_min_time=2
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_engine.h"
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

// Runs f once, adding its wall and process CPU seconds.
template <class F>
void timed(F&& f, double& wall_s, double& cpu_s) {
  const auto t0 = Clock::now();
  const double c0 = process_cpu_s();
  f();
  wall_s += seconds_since(t0);
  cpu_s += process_cpu_s() - c0;
}

// Counters of two alternatives a and b timed in the same iterations: each one's ms and GFLOP/s for
// `flops` of work, and a / b in wall time (`ratio`) and process CPU time (`ratio` + "_cpu").
void pair_counters(benchmark::State& state, const std::string& a, double a_s, double a_cpu, const std::string& b,
                   double b_s, double b_cpu, double flops, const std::string& ratio) {
  const double n = double(state.iterations());
  state.counters[a + "_ms"] = a_s / n * 1e3;
  state.counters[b + "_ms"] = b_s / n * 1e3;
  state.counters[ratio] = a_s / b_s;
  state.counters[ratio + "_cpu"] = a_cpu / b_cpu;
  state.counters[a + "_GFLOP/s"] = flops * n / a_s * 1e-9;
  state.counters[b + "_GFLOP/s"] = flops * n / b_s * 1e-9;
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
    timed(
        [&] {
          auto r = bp::linear_cross_entropy_forward_backward(x, W, lab, 1.0f / T, dx, with_dW ? &dW : nullptr, chunk);
          benchmark::DoNotOptimize(r.loss_sum);
        },
        fused_s, fused_cpu);
    state.PauseTiming();
    timed(
        [&] {
          bp::cpu::sgemm(false, true, T, V, D, 1.0f, x.data<float>(), D, W.data<float>(), D, 0.0f, logits.data<float>(),
                         V);
          bp::cpu::sgemm(false, false, T, D, V, 1.0f, logits.data<float>(), V, W.data<float>(), D, 0.0f,
                         dx.data<float>(), D);
          if (with_dW)
            bp::cpu::sgemm(true, false, V, D, T, 1.0f, logits.data<float>(), V, x.data<float>(), D, 1.0f,
                           dW.data<float>(), D);
        },
        gemm_s, gemm_cpu);
    state.ResumeTiming();
  }
  pair_counters(state, "fused", fused_s, fused_cpu, "gemms", gemm_s, gemm_cpu, 2.0 * T * V * D * (with_dW ? 3 : 2),
                "ratio");
  state.counters["tokens/s"] = T * double(state.iterations()) / fused_s;
}

BENCHMARK(BM_FusedCrossEntropyVsGemms)
    ->Args({256, 1})
    ->Args({512, 1})
    ->Args({256, 0})
    ->ArgNames({"chunk", "dW"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A frozen head (loss + dx) held in bf16 against the same values in f32, timed alternately in each
// iteration; the engine is runtime.cpu_gemm's auto choice (printed as `engine` in the label).
void BM_FrozenHeadBf16VsF32(benchmark::State& state) {
  const int64_t T = 512, D = 576, V = 49152, chunk = 256;
  Tensor x = random({T, D}, 1, 1.0f), W16 = random({V, D}, 2, 0.05f).to(bp::DType::BF16);
  Tensor W32 = W16.to(bp::DType::F32);  // the same values
  std::vector<int32_t> labels(T);
  for (int64_t t = 0; t < T; ++t) labels[t] = static_cast<int32_t>((t * 7919) % V);
  Tensor lab = Tensor::from_vector(labels, {T});
  Tensor dx = Tensor::empty({T, D});
  double s16 = 0, s32 = 0, c16 = 0, c32 = 0;
  const auto head = [&](const Tensor& W) {
    auto r = bp::linear_cross_entropy_forward_backward(x, W, lab, 1.0f / T, dx, nullptr, chunk);
    benchmark::DoNotOptimize(r.loss_sum);
  };
  for (auto _ : state) {
    timed([&] { head(W16); }, s16, c16);
    state.PauseTiming();
    timed([&] { head(W32); }, s32, c32);
    state.ResumeTiming();
  }
  pair_counters(state, "f32", s32, c32, "bf16", s16, c16, 2.0 * T * V * D * 2, "speedup");
  state.SetLabel(bp::cpu::held_bf16_path_name(bp::cpu::cpu_gemm_choice().held_bf16));
}

BENCHMARK(BM_FrozenHeadBf16VsF32)->Unit(benchmark::kMillisecond)->UseRealTime();

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
