// The GPU benchmark's measuring logic (train/train_benchmark.h, run by bench/bench_cuda.cpp on a
// card) on the simulated card: a tiny LoRA run through the Trainer with --device cuda (weights,
// adapter and optimizer in the card's memory, every op a simulated CUDA kernel) and the bf16 GEMM
// rate measured through the simulation's GEMM (the same descriptions cuBLASLt gets), compared with
// the same run on the CPU: the same losses, tokens and FLOP count; MFU from the device's own rate.
#include <gtest/gtest.h>

#include "backend/cuda/gemm.cuh"
#include "sim_device.h"
#include "support/test_util.h"
#include "train/train_benchmark.h"

namespace bp::test {
namespace {

TrainBenchSpec tiny_spec(const std::string& dir, const std::string& device) {
  TrainBenchSpec s;
  s.name = "tiny";
  s.config = bench_config(tiny_bench_shape(), 2);  // two of the five layers: the simulation is slow
  s.seq_len = 24;
  s.steps = 2;
  s.device = device;
  s.base_dtype = "bf16";
  s.tokenizer_dir = source_dir() + "/models/tiny-chat";
  s.work_dir = dir;
  s.threads = 1;
  s.gemm_min_seconds = 0.0;  // one timed pass
  return s;
}

// The simulation's GEMM on the card's memory: what bench_cuda does with cuBLASLt.
GemmRunner simulated_runner(int* calls) {
  GemmRunner r;
  r.device = SimulatedCudaDevice::device();
  r.run = [calls](const gemm::GemmDesc& d, const void* A, const void* B, void* C) {
    ++*calls;
    sim::gemm(d, A, B, C, nullptr, 0, nullptr);
  };
  r.sync = [] { sim::check_cuda(sim::cudaDeviceSynchronize(), "cudaDeviceSynchronize"); };
  return r;
}

TEST(CudaTrainBenchmark, TinyRunOnTheSimulatedCardMatchesTheCpuRun) {
  TempDir cpu_dir, gpu_dir;
  int cpu_calls = 0, gpu_calls = 0;
  GemmRunner host;
  host.run = [&cpu_calls](const gemm::GemmDesc& d, const void* A, const void* B, void* C) {
    ++cpu_calls;
    sim::gemm(d, A, B, C, nullptr, 0, nullptr);
  };
  const TrainBenchResult ref = run_train_benchmark(tiny_spec(cpu_dir.path, "cpu"), host);
  SimulatedCudaDevice card;
  const MemoryStats before = card.allocator().stats();
  const TrainBenchResult got = run_train_benchmark(tiny_spec(gpu_dir.path, "cuda"), simulated_runner(&gpu_calls));
  EXPECT_EQ(got.device, "cuda");
  EXPECT_EQ(got.steps, 2);
  EXPECT_EQ(got.tokens_per_step, 24);
  EXPECT_EQ(got.base_dtype, "bf16") << "the frozen weights on the card are bf16";
  EXPECT_NEAR(got.final_loss, ref.final_loss, 1e-4 * ref.final_loss) << "the card trained what the CPU trained";
  EXPECT_DOUBLE_EQ(got.model_flops_per_step, ref.model_flops_per_step);
  EXPECT_GT(got.peak_memory_bytes, 0u) << "the card's allocator held the run";
  EXPECT_GT(card.allocator().stats().num_allocs - before.num_allocs, 100u) << "weights, adapter, activations";
  EXPECT_EQ(card.allocator().stats().bytes_in_use, before.bytes_in_use) << "the run's device memory was given back";
  // One warm-up and one timed pass over the model's eight GEMM shapes, on the card's memory.
  EXPECT_EQ(gpu_calls, 16);
  EXPECT_GT(got.gemm_flops_per_s, 0.0);
  EXPECT_NEAR(got.mfu, got.model_flops_per_s / got.gemm_flops_per_s, 1e-12);
  EXPECT_NE(got.report().find("on cuda"), std::string::npos) << got.report();
}

}  // namespace
}  // namespace bp::test
