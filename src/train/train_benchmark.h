// The measuring logic of the training benchmarks (issue 6: bench/bench_train.cpp on the CPU;
// issue 18: bench/bench_cuda.cpp on a GPU), in the library so that tests run it at a tiny shape on
// the CPU and on the simulated CUDA device: nothing here is only ever run where a GPU exists.
//
//   * The model shapes (Qwen2.5-0.5B, Qwen2.5-1.5B, SmolLM-135M; a stories260K-sized one for tests).
//   * The model-FLOP count of one LoRA step (lora_step_flops, the definition below).
//   * The GEMM rate of a device on the model's frozen-linear shapes: GemmDescs (the cuBLASLt
//     descriptions of backend/cuda/gemm_desc.h) executed by a caller-given runner: cuBLASLt on a
//     card, the simulation's GEMM in test_cuda, the plain reference on the CPU.
//   * A LoRA training run through bp::Trainer, the code path `backprop train` runs (random weights
//     from the config, --init-from-config's path), timed by the trainer's own ThroughputMeter over
//     the steps after the warm-up; model-FLOPs utilisation = model FLOP/s / GEMM rate.
//   * The report: a human line block and one JSON object (scripts/gpu_bench_compare.py reads it).
//
// Model FLOPs of one step of one sequence (T tokens, L layers, per-layer frozen linear parameters
// N_lin = D·(q+2kv) + q·D + 3·D·F, head V·D, LoRA rank r on all seven projections, q = H·d):
//   frozen forward       2·T·(L·N_lin + V·D)
//   frozen backward (dx) 2·T·(L·N_lin + V·D)          (no dW: base weights are frozen)
//   LoRA fwd + bwd       6·T·r·Σ(in + out)            (forward 2, dx 2, dA + dB 2 per rank·(in+out))
//   attention            3 · 4·T²·q·L / 2              (QKᵀ and PV, causal half, backward = 2× forward)
// The recomputed forward of gradient checkpointing, norms, RoPE, SwiGLU, softmax and AdamW are not
// counted (overhead, as in the usual MFU definition).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/allocator.h"  // Device
#include "model/config.h"
#include "model/transformer.h"  // TrainMode
#include "ops/device_gemm.h"

namespace bp {

// ---- shapes -----------------------------------------------------------------------------------
struct BenchShape {
  const char* name;
  Arch arch;
  int64_t hidden, inter, layers, heads, kv_heads, vocab;
  bool bias;
  float theta, eps;
};
BenchShape smollm135m_shape();
BenchShape qwen25_05b_shape();
BenchShape qwen25_15b_shape();
BenchShape tiny_bench_shape();  // stories260K-sized (64 wide, 5 layers, 8/4 heads, vocab 512): tests
// "qwen2.5-0.5b", "qwen2.5-1.5b", "smollm135m" or "tiny"; throws CONFIG_INVALID_SETTING otherwise.
BenchShape bench_shape(const std::string& name);
// The shape as a ModelConfig (tied embeddings, head_dim = hidden / heads); layers < 0 keeps the shape's.
ModelConfig bench_config(const BenchShape& s, int64_t layers = -1);

// ---- FLOPs ------------------------------------------------------------------------------------
struct StepFlops {
  double frozen_fwd = 0, frozen_bwd = 0, lora = 0, attention = 0;
  double total() const { return frozen_fwd + frozen_bwd + lora + attention; }
};
// One LoRA step over one sequence of seq_len tokens, rank `rank` on all seven projections.
StepFlops lora_step_flops(const ModelConfig& c, int64_t seq_len, int64_t rank);
// One full fine-tuning step: the linear GEMMs forward, and twice that backward (dx and dW of every
// matrix, the LM head's included); frozen_* then count the trained matrices, lora is 0.
StepFlops full_step_flops(const ModelConfig& c, int64_t seq_len);

// ---- GEMM rate --------------------------------------------------------------------------------
// Executes one description on the runner's device: A, B, C are device pointers (cuBLASLt's roles).
struct GemmRunner {
  Device device;
  std::function<void(const gemm::GemmDesc&, const void* A, const void* B, void* C)> run;
  std::function<void()> sync;  // waits for the device (cudaDeviceSynchronize); may be empty
  // The 16-bit input type of the card's tensor-core GEMMs, what training's frozen-weight GEMMs take
  // (gemm::narrow_type): bf16, f16 on a Turing card (compute capability 7.5, no bf16).
  gemm::DType input_type = gemm::DType::BF16;
};
struct GemmShape {
  const char* what;
  int64_t M, K, N;  // y[M×N] = x[M×K]·W[N×K]ᵀ
};
// The frozen GEMMs of one step's forward: q, k, v, o, gate, up, down and the LM head at T rows.
std::vector<GemmShape> model_gemm_shapes(const ModelConfig& c, int64_t T);
struct GemmRate {
  double flops_per_s = 0;
  double seconds = 0;
  int rounds = 0;    // passes over every shape
  double flops = 0;  // executed in the timed rounds
};
// runner.input_type (bf16, or f16 on Turing) inputs and output, f32 accumulation (gemm_desc.h),
// random operands on runner.device; one
// untimed pass, then passes until min_seconds have gone by (at least one). Rate = FLOPs / wall time.
GemmRate measure_gemm_rate(const std::vector<GemmShape>& shapes, const GemmRunner& runner, double min_seconds);

// ---- the training run -------------------------------------------------------------------------
struct TrainBenchSpec {
  std::string name;  // shown in the report (the shape's name)
  ModelConfig config;
  int64_t seq_len = 2048;
  int warmup_steps = 1;  // untimed
  int steps = 3;         // timed
  int64_t rank = 16;
  float alpha = 32.0f;
  std::string device = "cuda";
  std::string base_dtype = "bf16";    // how the frozen weights are held (--base-dtype; LoRA)
  TrainMode mode = TrainMode::Lora;   // Full: every weight trained (base_dtype ignored: f32 masters)
  std::string matmul_dtype = "auto";  // full mode's GEMM inputs (--matmul-dtype: auto, f32, bf16)
  std::string tokenizer_dir;          // any tokenizer of the model family's ids (< vocab): the texts' tokens
  std::string work_dir;               // config.json, data.jsonl and the run folder are written here
  int threads = 0;
  double gemm_min_seconds = 1.0;
};
struct TrainBenchResult {
  std::string name, device, base_dtype;
  std::string mode = "lora", matmul_dtype = "f32";  // full fine-tuning: its GEMM inputs
  int64_t layers = 0, seq_len = 0, rank = 0;
  float alpha = 0;
  int steps = 0;
  bool gradient_checkpointing = false;
  int64_t tokens_per_step = 0;
  double step_s = 0, tokens_per_s = 0;
  double model_flops_per_step = 0, model_flops_per_s = 0;
  double gemm_flops_per_s = 0, mfu = 0;  // mfu: model_flops_per_s / gemm_flops_per_s
  std::string gemm_input_type = "bf16";  // what the GEMM rate was measured in (the runner's input_type)
  double final_loss = 0;
  size_t peak_memory_bytes = 0;
  nlohmann::json config;  // the model's config.json (the comparison script builds the same model)
  nlohmann::json to_json() const;
  std::string report() const;  // a few human-readable lines
};
// Trains spec.warmup_steps + spec.steps LoRA steps (batch of one sequence of seq_len tokens, r/alpha
// of the spec, all-linear, dropout 0, lr constant; or full fine-tuning steps with spec.mode Full) with bp::Trainer on
// spec.device, then measures the GEMM rate with `runner` on the model's shapes at seq_len rows.
TrainBenchResult run_train_benchmark(const TrainBenchSpec& spec, const GemmRunner& runner);
// MFU arithmetic of a result (tokens/s, model FLOP/s, MFU) from its measured times and counts.
void finish_train_benchmark(TrainBenchResult& r, double timed_seconds, int64_t timed_tokens, int timed_steps);

// "NVIDIA H100 80GB HBM3, compute capability 9.0, driver 13.0, runtime 13.0, 79.1 GiB" or why none.
std::string cuda_device_description();

}  // namespace bp
