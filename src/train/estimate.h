// `backprop estimate-vram` (issue 9): the memory plan (train/memory_plan.h) of a training setup,
// what fits a memory size, and the cheapest change that makes a setup that does not fit fit.
//
// The setup is given in the trainer's terms: batch_size sequences per optimizer step, split into
// micro-batches of micro_batch_size sequences (0 = the whole batch in one pass, the most the
// trainer's "auto" ever picks). The plan is for the worst micro-batch: micro_batch_size
// sequences of max_seq_length tokens each, packed, i.e. micro_batch_size × max_seq_length tokens.
// Every group of the plan depends on the tokens of the micro-batch, not on how they split into
// sequences (batches are packed; attention scratch is per thread), so "largest micro-batch" and
// "largest sequence length" both come from the largest micro-batch in tokens.
//
// weights_dtype is how the frozen base weights are held (setting model.base_dtype): the plan counts their real bytes in
// that type (model/held_weights.h). Trainable parameters, their gradients and AdamW state stay f32 (master weights), as
// do the activations the plan replays.
//
// Changes tried for a setup that does not fit, in this order (the first one that fits alone is
// the cheapest):
//   1. gradient checkpointing on              (when off)
//   2. a smaller micro-batch, more accumulation (when micro_batch_size > 1): the largest that fits
//   3. frozen weights held quantized (QLoRA)   (mode lora) --base-dtype q8_0, else q4_k; combined
//                                              with the others only when it is enough
//   4. a shorter max sequence length           the longest that fits, if it keeps at least half
//                                              the requested length and kMinUsefulSeqLength tokens
//   5. LoRA instead of full fine-tuning        (mode full), with the requested lora.r
//   6. a lower LoRA r                          (mode lora) r/2, r/4, ... 1: the largest that fits
// When none fits alone, they are combined in the same order, each as far as needed (a lower r only
// when it is enough; as the last resort, the longest sequence length that fits however short).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "train/memory_plan.h"

namespace bp {

// Shortening the sequences below this is not offered as a single fix (it would train on fragments).
inline constexpr int64_t kMinUsefulSeqLength = 64;
// Searches for the largest micro-batch stop here (16M tokens per micro-batch).
inline constexpr int64_t kMaxSearchTokens = int64_t{1} << 24;

struct EstimateRequest {
  TrainMode mode = TrainMode::Lora;
  LoraConfig lora;
  bool gradient_checkpointing = true;
  int64_t batch_size = 8;        // sequences per optimizer step
  int64_t micro_batch_size = 0;  // sequences per micro-batch; 0 = batch_size; larger is clamped to it
  int64_t max_seq_length = 2048;
  DType weights_dtype = DType::F32;  // frozen base weights
  DType matmul_dtype = DType::F32;   // full mode: BF16 = the trained matrices' bf16 GEMM copies
  size_t limit_bytes = 0;            // the memory size to fit
  int threads = 0;                   // as MemorySettings::threads
  int optimizer_shards = 1;          // as MemorySettings::optimizer_shards (estimate-vram --nproc N)
  int64_t ce_chunk_tokens = kDefaultCrossEntropyChunk;
  // Where the run would train: on CUDA the kernels' own device memory is counted (the fused loss's
  // workspace over whole chunks, bf16 operand copies, held-weight panels: memory_plan.cpp).
  DeviceType device = DeviceType::CPU;
  // On CUDA: cuBLASLt's workspace (MemorySettings::gemm_workspace_bytes): the card's recommended size
  // when its compute capability is known, else the largest.
  size_t gemm_workspace_bytes = cuda_workspace::kGemmWorkspaceBytesMax;

  int64_t micro_batch() const;  // micro_batch_size resolved (1..batch_size)
  int64_t micro_batch_tokens() const { return micro_batch() * max_seq_length; }
  MemorySettings memory_settings() const;  // at micro_batch_tokens()
};

// One setup the search looked at: the settings that differ from the request and its plan total.
struct EstimateChange {
  std::string kind;         // gradient_checkpointing | micro_batch_size | max_seq_length | mode | lora_r | combined
  std::string description;  // "turn on gradient checkpointing", "--micro-batch-size 2 (accumulation 4)", ...
  std::string flags;        // the command-line flags that make it: "--gradient-checkpointing --lora-r 4"
  bool gradient_checkpointing = true;
  TrainMode mode = TrainMode::Lora;
  int64_t lora_r = 0;
  int64_t micro_batch_size = 0;
  int64_t grad_accum = 0;
  int64_t max_seq_length = 0;
  size_t total = 0;
  bool fits = false;
  nlohmann::json to_json() const;
};

struct Estimate {
  EstimateRequest request;
  int64_t micro_batch_size = 0;  // resolved
  int64_t grad_accum = 0;        // ceil(batch_size / micro_batch_size)
  int64_t micro_batch_tokens = 0;
  MemoryPlan plan;              // weights at request.weights_dtype
  int64_t base_parameters = 0;  // every weight of the model
  // Mixture-of-Experts: the parameters one token computes with (only num_experts_per_tok of each sparse
  // layer's experts; ModelConfig::num_active_parameters); base_parameters for a dense model.
  int64_t active_parameters = 0;
  size_t weights_f32 = 0;  // the frozen weights as the CPU backend holds them
  bool fits = false;
  // Largest micro-batch in tokens that fits (0: not even one token; kMaxSearchTokens: at least).
  int64_t max_micro_batch_tokens = 0;
  int64_t max_micro_batch_size = 0;   // sequences of max_seq_length: max_micro_batch_tokens / max_seq_length
  int64_t max_seq_length = 0;         // at micro_batch_size sequences: max_micro_batch_tokens / micro_batch_size
  std::vector<EstimateChange> tried;  // each single change, in the order above (only those that apply)
  bool has_fix = false;
  EstimateChange fix;  // the first single change that fits, else the combination (fits may be false)
  nlohmann::json to_json() const;
};

// plan_memory with the frozen weights counted at `weights_dtype`.
MemoryPlan plan_memory_dtype(const ModelConfig& cfg, const MemorySettings& s, DType weights_dtype);

// Validates the request (INPUT_VALIDATION_FAILED / CONFIG_INVALID_SETTING with the value) and
// runs the plan, the fit searches and, when it does not fit, the search for a change.
Estimate estimate_memory(const ModelConfig& cfg, const EstimateRequest& request);

// "256 tokens × 49,152 vocab × 4 bytes = 48.00 MiB": the logits chunk of the fused LM-head/loss.
std::string cross_entropy_chunk_arithmetic(int64_t micro_batch_tokens, int64_t vocab, int64_t chunk_tokens);
// 49152 -> "49,152".
std::string group_digits(int64_t n);

}  // namespace bp
