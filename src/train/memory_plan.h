// The memory plan (DESIGN.md "Memory plan"): bytes of every group for one training step, made
// before the first step, and the largest micro-batch that fits a limit.
//
// Groups:
//   weights             frozen base weights (LoRA mode), at the bytes of the type each is held in
//                       (f32, bf16, q8_0, q4_K, ...); in full mode, where all are trainable, the
//                       bf16 GEMM copies of the matrices with matmul_dtype bf16 (gemm_copy_bytes), else 0
//   trainable           trainable parameters (LoRA A/B, or every weight in full mode)
//   gradients           one f32 gradient per trainable parameter
//   optimizer_state     AdamW m and v: 2 × trainable, f32 (÷ N ranks with ZeRO-1, rounded up)
//   gemm_workspace      on CUDA: cuBLASLt's workspace, one block held from the first GEMM on (the
//                       size NVIDIA recommends for the card: backend/cuda/device_workspace.h); 0 on
//                       the CPU
//   saved_activations   what forward keeps for backward: the layer inputs with gradient
//                       checkpointing, every layer's activations without it
//   recompute_buffers   with checkpointing: the recomputed activations of the one layer in backward
//   cross_entropy_chunk the fused LM-head/loss op's logits chunk [min(chunk, T), V]; on CUDA the
//                       kernel's workspace (logits, gradient, row losses, a held head's f32 panel)
//   workspace           everything transient: activation gradients, temporaries, op scratch; on
//                       CUDA also the kernels' own device scratch (held-weight panels, ...)
// The activation groups are not simply summed maxima: the plan replays the allocation order of
// Model::forward_backward (model/transformer*.cpp) and of the ops it calls, tensor by tensor,
// and reports each group's bytes at the moment the total peaks. That is the number the CPU
// allocator measures (tests/train/memory_plan_test.cpp holds them within 10%; on the simulated
// CUDA card, tests/cuda/trainer_cuda_test.cpp holds a whole run's peak between 1x and 1.15x, beyond
// the GEMM workspace both include).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "model/config.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "ops/cross_entropy.h"
#include "ops/device_compute.h"  // cuda_workspace::

namespace bp {

struct MemorySettings {
  TrainMode mode = TrainMode::Lora;
  LoraConfig lora;  // r, dropout, target_modules (LoRA mode)
  bool gradient_checkpointing = true;
  int64_t micro_batch_tokens = 512;  // packed tokens per micro-batch
  int64_t ce_chunk_tokens = kDefaultCrossEntropyChunk;
  // Rows of the largest cross-entropy window the data can make (ops/cross_entropy.h: −100 spans
  // such as SFT prompts cost no logits rows); 0 = unknown, every token labelled: min(chunk, tokens).
  int64_t ce_window_tokens = 0;
  bool optimizer = true;     // count AdamW state (the trainer allocates it before the first step)
  int optimizer_shards = 1;  // ZeRO-1 over N ranks (train/optimizer.h): a rank holds 1/N of m and v
  int threads = 0;           // OpenMP threads for per-thread op scratch; 0 = omp_get_max_threads()
  // How the frozen weights are held (model.base_dtype, model/held_weights.h): their real bytes
  // per type, norms and biases at f32. `weights_bytes` > 0 (the loaded model's resident bytes, a
  // GGUF base in its stored types) overrides the count from base_dtype.
  DType base_dtype = DType::F32;
  // How the LM head (or the tied embedding) is held: on CUDA its type picks the fused loss's
  // workspace (backend/cuda/device_workspace.h).
  DType head_dtype = DType::F32;
  // On an f16 card: some frozen matrix has values outside f16's range, so its GEMMs take f32
  // panels (ops/held_range.h; the trainer checks at upload).
  bool frozen_f32_panels = false;
  size_t weights_bytes = 0;
  // Full mode: the input type of the trained matrices' GEMMs (training.matmul_dtype, resolved:
  // ModelOptions::matmul_dtype). BF16 counts the copies and, on CUDA, the bf16 operands of the
  // GEMMs (forward and dx like a bf16 base's, dW both of its operands): rounded per GEMM, or written
  // by their producers (memory_plan.cpp DeviceScratch::bf16_operands).
  DType matmul_dtype = DType::F32;
  // Where the step runs: on CUDA the kernels' own device workspace is counted (memory_plan.cpp
  // DeviceScratch) and the CPU's per-thread attention scratch is not.
  DeviceType device = DeviceType::CPU;
  // On CUDA: cuBLASLt's held workspace (ops::device_gemm_workspace_bytes for the card a run uses;
  // cuda_workspace::gemm_workspace_bytes of a known compute capability). Unknown: the largest
  // recommendation. Not counted on the CPU.
  size_t gemm_workspace_bytes = cuda_workspace::kGemmWorkspaceBytesMax;
};

struct MemoryPlan {
  size_t weights = 0;
  size_t trainable = 0;
  size_t gradients = 0;
  size_t optimizer_state = 0;
  size_t gemm_workspace = 0;
  size_t saved_activations = 0;
  size_t recompute_buffers = 0;
  size_t cross_entropy_chunk = 0;
  // Bytes per logit of the CPU's chunk: 4 (f32 logits), plus the logits' gradient rounded for a head
  // held in bf16 under a bf16 engine (2 with oneDNN, 4 with OpenBLAS's widened copy).
  int64_t cross_entropy_value_bytes = 4;
  size_t workspace = 0;
  // Resident memory outside the tensor allocator (code, libraries, tokenizer, dataset, BLAS
  // buffers): measured by the trainer when it plans (process RSS − allocator bytes in use), 0 in
  // estimate-vram. Not part of total(), which is what the allocator's limit is checked against.
  size_t process = 0;
  std::string peak_phase;  // where the activation peak happens ("backward layer 3", ...)
  int64_t trainable_parameters = 0;

  size_t persistent() const { return weights + trainable + gradients + optimizer_state + gemm_workspace; }
  size_t activations() const { return saved_activations + recompute_buffers + cross_entropy_chunk + workspace; }
  size_t total() const { return persistent() + activations(); }
  size_t resident() const { return total() + process; }  // what the process's peak RSS should be
  nlohmann::json to_json() const;
};

// Bytes of full fine-tuning's bf16 GEMM copies (ModelOptions::matmul_dtype): the seven projections
// of every layer and the head [V, D] (the LM head, or the tied embedding).
size_t gemm_copy_bytes(const ModelConfig& cfg);

// Validates the settings (INPUT_VALIDATION_FAILED / CONFIG_INVALID_SETTING with the value).
MemoryPlan plan_memory(const ModelConfig& cfg, const MemorySettings& settings);

// The largest micro_batch_tokens (<= max_tokens) whose plan total fits limit_bytes; 0 when not
// even one token fits.
int64_t max_micro_batch_tokens(const ModelConfig& cfg, const MemorySettings& settings, size_t limit_bytes,
                               int64_t max_tokens);

}  // namespace bp
