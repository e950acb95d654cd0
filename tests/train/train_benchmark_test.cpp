// The training benchmarks' measuring logic (train/train_benchmark.h), which bench_cuda runs on a GPU
// and bench_train on the CPU: the FLOP count against a count by enumeration of every GEMM of a
// tiny model, the MFU arithmetic against hand values, the GEMM rate's descriptions, a whole tiny run
// through the Trainer on the CPU (tokens, FLOPs, report, JSON; the frozen weights held as asked),
// and the GPU comparison script (scripts/gpu_bench_compare.py) on its CPU fallback reading that
// JSON, plus `bash -n` of scripts/gpu_check.sh. The same run on the simulated card: test_cuda.
#include "train/train_benchmark.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "backend/cuda/sim/gemm_reference.h"
#include "core/device_info.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

// A tiny config whose FLOPs are counted by hand below: D 8, F 12, 2 heads of 4 (q 8), 1 KV head
// (kv 4), 3 layers, vocab 20.
ModelConfig hand_config() {
  BenchShape s{"hand", Arch::Llama, 8, 12, 3, 2, 1, 20, false, 10000.0f, 1e-5f};
  return bench_config(s);
}

TEST(TrainBenchmark, FlopCountMatchesEnumerationOfEveryGemm) {
  const ModelConfig c = hand_config();
  const double T = 5, r = 2, L = 3, D = 8, V = 20;
  // (in, out) of q, k, v, o, gate, up, down.
  const int64_t mods[7][2] = {{8, 8}, {8, 4}, {8, 4}, {8, 8}, {8, 12}, {8, 12}, {12, 8}};
  double fwd = 0, lora = 0;
  for (int l = 0; l < L; ++l)
    for (const auto& m : mods) {
      const double in = static_cast<double>(m[0]), out = static_cast<double>(m[1]);
      fwd += 2 * T * in * out;  // y = x·Wᵀ
      // LoRA forward: x·Aᵀ, (xA)·Bᵀ; backward: dB, d(xA), dA, dx — six T×r×(in or out) GEMMs.
      lora += 2 * T * r * in + 2 * T * r * out;
      lora += 2 * T * r * out + 2 * T * r * out + 2 * T * r * in + 2 * T * r * in;
    }
  fwd += 2 * T * D * V;  // LM head
  // Attention per layer: QKᵀ and PV over half of the T×T pairs, 2 FLOPs each, width q = 8; the
  // backward does twice the forward.
  const double attn = L * 3 * (2 * 2 * T * T * 8 / 2);
  const StepFlops f = lora_step_flops(c, 5, 2);
  EXPECT_DOUBLE_EQ(f.frozen_fwd, fwd);
  EXPECT_DOUBLE_EQ(f.frozen_bwd, fwd);
  EXPECT_DOUBLE_EQ(f.lora, lora);
  EXPECT_DOUBLE_EQ(f.attention, attn);
  EXPECT_DOUBLE_EQ(f.total(), 56480.0);  // 16000 + 16000 + 20880 + 3600, by hand
  // Qwen2.5-0.5B at 2048 tokens: ~2·2048·(494M - 136M embeddings + 136M head) per pass.
  const StepFlops q = lora_step_flops(bench_config(qwen25_05b_shape()), 2048, 16);
  EXPECT_NEAR(q.frozen_fwd / (2.0 * 2048), 494.0e6, 5e6);
  // Full fine-tuning: every GEMM's dx and dW backward, no LoRA products.
  const StepFlops full = full_step_flops(c, 5);
  EXPECT_DOUBLE_EQ(full.frozen_fwd, fwd);
  EXPECT_DOUBLE_EQ(full.frozen_bwd, 2 * fwd);
  EXPECT_DOUBLE_EQ(full.lora, 0.0);
  EXPECT_DOUBLE_EQ(full.total(), 16000.0 * 3 + 3600);
}

TEST(TrainBenchmark, MfuArithmetic) {
  TrainBenchResult r;
  r.model_flops_per_step = 3e12;
  r.gemm_flops_per_s = 4e12;
  finish_train_benchmark(r, 6.0, 3 * 2048, 3);
  EXPECT_DOUBLE_EQ(r.step_s, 2.0);
  EXPECT_EQ(r.tokens_per_step, 2048);
  EXPECT_DOUBLE_EQ(r.tokens_per_s, 1024.0);
  EXPECT_DOUBLE_EQ(r.model_flops_per_s, 1.5e12);
  EXPECT_DOUBLE_EQ(r.mfu, 0.375);
}

// The reference GEMM on host memory as the runner (the test of the description path itself; on a
// card it is cuBLASLt, in test_cuda the simulation).
GemmRunner cpu_runner(std::vector<gemm::GemmDesc>* seen = nullptr) {
  GemmRunner r;
  r.run = [seen](const gemm::GemmDesc& d, const void* A, const void* B, void* C) {
    if (seen) seen->push_back(d);
    gemm::gemm_reference(d, A, B, C);
  };
  return r;
}

TEST(TrainBenchmark, GemmRateRunsTheModelShapesAsLinearForwardDescriptions) {
  const ModelConfig c = hand_config();
  const auto shapes = model_gemm_shapes(c, 7);
  ASSERT_EQ(shapes.size(), 8u);
  EXPECT_EQ(shapes.back().N, 20);  // the LM head
  std::vector<gemm::GemmDesc> seen;
  const GemmRate rate = measure_gemm_rate(shapes, cpu_runner(&seen), 0.0);
  ASSERT_GE(rate.rounds, 1);
  ASSERT_EQ(seen.size(), shapes.size() * static_cast<size_t>(rate.rounds + 1));  // + the warm-up pass
  double per_round = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const gemm::GemmDesc& d = seen[i];
    EXPECT_EQ(d.m, shapes[i].N);  // column-major: A = W (out rows), B = x
    EXPECT_EQ(d.n, shapes[i].M);
    EXPECT_EQ(d.k, shapes[i].K);
    EXPECT_TRUE(d.trans_a);
    EXPECT_EQ(d.a_type, gemm::DType::BF16);
    EXPECT_EQ(d.c_type, gemm::DType::BF16);
    per_round += 2.0 * static_cast<double>(shapes[i].M * shapes[i].N * shapes[i].K);
  }
  EXPECT_DOUBLE_EQ(rate.flops, per_round * rate.rounds);
  EXPECT_NEAR(rate.flops_per_s, rate.flops / rate.seconds, 1e-9 * rate.flops_per_s);
}

// A Turing card's runner (input_type f16) measures f16 GEMMs, as its training GEMMs are: the rate
// must not be a bf16 figure (cuBLASLt has no bf16 on compute capability 7.5).
TEST(TrainBenchmark, GemmRateTakesTheRunnersInputType) {
  const auto shapes = model_gemm_shapes(hand_config(), 5);
  std::vector<gemm::GemmDesc> seen;
  GemmRunner runner = cpu_runner(&seen);
  runner.input_type = gemm::DType::F16;
  measure_gemm_rate(shapes, runner, 0.0);
  ASSERT_FALSE(seen.empty());
  for (const gemm::GemmDesc& d : seen) {
    EXPECT_EQ(d.a_type, gemm::DType::F16);
    EXPECT_EQ(d.b_type, gemm::DType::F16);
    EXPECT_EQ(d.c_type, gemm::DType::F16);
  }
}

TrainBenchSpec tiny_spec(const std::string& dir, const std::string& device, const std::string& base) {
  TrainBenchSpec s;
  s.name = "tiny";
  s.config = bench_config(tiny_bench_shape());
  s.seq_len = 32;
  s.steps = 2;
  s.device = device;
  s.base_dtype = base;
  s.tokenizer_dir = source_dir() + "/models/tiny-chat";
  s.work_dir = dir;
  s.threads = 1;
  s.gemm_min_seconds = 0.01;
  return s;
}

TEST(TrainBenchmark, TinyCpuRunMeasuresThroughTheTrainer) {
  TempDir dir;
  const TrainBenchSpec spec = tiny_spec(dir.path, "cpu", "f32");
  const TrainBenchResult r = run_train_benchmark(spec, cpu_runner());
  EXPECT_EQ(r.steps, 2);
  EXPECT_EQ(r.tokens_per_step, 32);
  EXPECT_EQ(r.layers, 5);
  EXPECT_GT(r.tokens_per_s, 0.0);
  EXPECT_NEAR(r.tokens_per_s, 32.0 / r.step_s, 1e-9 * r.tokens_per_s);
  EXPECT_DOUBLE_EQ(r.model_flops_per_step, lora_step_flops(spec.config, 32, 16).total());
  EXPECT_GT(r.gemm_flops_per_s, 0.0);
  EXPECT_NEAR(r.mfu, r.model_flops_per_s / r.gemm_flops_per_s, 1e-12);
  EXPECT_NEAR(r.final_loss, std::log(512.0), 0.5);  // random weights: about uniform over the vocab
  EXPECT_EQ(r.base_dtype, "f32");
  EXPECT_TRUE(std::filesystem::exists(dir.path + "/tiny/run/adapter")) << "the trainer's own run folder";
  const std::string rep = r.report();
  EXPECT_NE(rep.find("tiny (5 layers, seq 32, LoRA r16"), std::string::npos) << rep;
  EXPECT_NE(rep.find("tokens/s"), std::string::npos) << rep;
  EXPECT_NE(rep.find("MFU"), std::string::npos) << rep;
  const nlohmann::json j = r.to_json();
  EXPECT_EQ(j.at("impl"), "backprop");
  EXPECT_EQ(j.at("seq"), 32);
  EXPECT_DOUBLE_EQ(j.at("mfu").get<double>(), r.mfu);

  // --base-dtype bf16 holds the random frozen weights as bf16 (the trainer's init-from-config path).
  TrainBenchSpec bf = tiny_spec(dir.path + "/bf16", "cpu", "bf16");
  bf.steps = 1;
  const TrainBenchResult rb = run_train_benchmark(bf, cpu_runner());
  EXPECT_EQ(rb.base_dtype, "bf16") << "not 'bf16 (held as f32)'";

  // Full fine-tuning (BP_BENCH_MODE=full): every weight trained, its FLOP count, the GEMM inputs
  // asked for (bf16 copies here, as a card's auto would pick) in the report and the JSON.
  TrainBenchSpec full = tiny_spec(dir.path + "/full", "cpu", "bf16");
  full.steps = 1;
  full.mode = TrainMode::Full;
  full.matmul_dtype = "bf16";
  const TrainBenchResult rf = run_train_benchmark(full, cpu_runner());
  EXPECT_EQ(rf.mode, "full");
  EXPECT_EQ(rf.matmul_dtype, "bf16");
  EXPECT_DOUBLE_EQ(rf.model_flops_per_step, full_step_flops(full.config, 32).total());
  EXPECT_TRUE(std::filesystem::exists(dir.path + "/full/tiny/run/model")) << "a full run writes the model";
  EXPECT_NE(rf.report().find("full fine-tuning, bf16 GEMMs"), std::string::npos) << rf.report();
  EXPECT_EQ(rf.to_json().at("mode"), "full");
}

TEST(TrainBenchmark, RefusesRunsThatMeasureNothing) {
  TempDir dir;
  TrainBenchSpec s = tiny_spec(dir.path, "cpu", "f32");
  s.steps = 0;
  EXPECT_THROW(run_train_benchmark(s, cpu_runner()), Error);
  EXPECT_THROW(bench_shape("qwen9"), Error);
  EXPECT_EQ(bench_config(bench_shape("qwen2.5-1.5b")).num_layers, 28);
}

// The device line bench_cuda prints: the card's name, compute capability, driver and runtime, or
// why there is none (this machine: no driver).
TEST(TrainBenchmark, CudaDeviceDescriptionSaysWhatTheMachineHas) {
  const CudaStatus cs = cuda_status();
  const std::string d = cuda_device_description();
  if (!cs.compiled) {
    EXPECT_EQ(d, "no CUDA backend in this build");
    return;
  }
  EXPECT_NE(d.find(fmt::format("runtime {}.{}", cs.runtime_version / 1000, cs.runtime_version % 1000 / 10)),
            std::string::npos)
      << d;
  if (cs.devices.empty())
    EXPECT_NE(d.find("no usable device: " + cs.why_unavailable), std::string::npos) << d;
  else
    EXPECT_NE(d.find(fmt::format("{}, compute capability {}.{}", cs.devices[0].name, cs.devices[0].cc_major,
                                 cs.devices[0].cc_minor)),
              std::string::npos)
        << d;
}

// scripts/gpu_check.sh parses; the comparison script runs its CPU fallback on the tiny shape and
// joins backprop's JSON: the PyTorch eager row, the transformers + PEFT row or the modules it lacks,
// the ratio and MFU beside the targets.
TEST(TrainBenchmark, GpuComparisonScriptCpuFallbackReadsTheBenchmarkJson) {
  std::string out;
  ASSERT_EQ(run_command("bash -n " + source_dir() + "/scripts/gpu_check.sh", &out), 0) << out;
  TempDir dir;
  const TrainBenchResult r = run_train_benchmark(tiny_spec(dir.path, "cpu", "f32"), cpu_runner());
  const std::string json = dir.path + "/backprop.jsonl";
  std::ofstream(json) << r.to_json().dump() << "\n";
  const std::string cmd = "/usr/bin/python3 " + source_dir() +
                          "/scripts/gpu_bench_compare.py --device cpu --shapes tiny --seq 32 --steps 1 "
                          "--backprop-json " +
                          json;
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  EXPECT_NE(out.find("torch eager"), std::string::npos) << out;
  EXPECT_NE(out.find("transformers+PEFT"), std::string::npos) << out;
  EXPECT_NE(out.find("target 2.00x"), std::string::npos) << out;
  EXPECT_NE(out.find("target 40%"), std::string::npos) << out;
  char mfu[32];
  std::snprintf(mfu, sizeof mfu, "%.1f%%", 100.0 * r.mfu);
  EXPECT_NE(out.find(mfu), std::string::npos) << "backprop's MFU from the JSON: " << mfu << "\n" << out;

  // A full fine-tuning result (BP_BENCH_MODE=full) is reported as such, not set beside LoRA rows.
  nlohmann::json full = r.to_json();
  full["mode"] = "full";
  full["matmul_dtype"] = "bf16";
  std::ofstream(json) << full.dump() << "\n";
  ASSERT_EQ(run_command(cmd, &out), 0) << out;
  EXPECT_NE(out.find("full fine-tuning, bf16 GEMMs"), std::string::npos) << out;
  EXPECT_EQ(out.find("transformers+PEFT "), std::string::npos) << out;
}

}  // namespace
}  // namespace bp::test
