// LoRA adapter in memory (DESIGN.md "LoRA"), with PEFT semantics and layout:
//   for a target projection W [out, in]:  y = x·Wᵀ + scale · (dropout(x)·Aᵀ)·Bᵀ
//   A = lora_A [r, in]  (Kaiming-uniform init with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in)))
//   B = lora_B [out, r] (zero init, so a fresh adapter leaves the model unchanged)
//   scale = alpha / r, or alpha / sqrt(r) with rsLoRA.
// One LoraLayer per transformer layer holds A/B for each of the seven projections, indexed by
// LoraTarget; `enabled[t]` says whether that projection is adapted (A/B undefined otherwise).
// Save/load in PEFT's files: model/peft.h. Merge into base weights: model/merge.h.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace bp {

// The seven linear projections of a Llama-family layer, in PEFT's usual order.
enum class LoraTarget : int { Q = 0, K, V, O, Gate, Up, Down };
inline constexpr int kNumLoraTargets = 7;
inline constexpr std::array<LoraTarget, kNumLoraTargets> kAllLoraTargets = {
    LoraTarget::Q, LoraTarget::K, LoraTarget::V, LoraTarget::O, LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down};

// "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj".
const char* lora_target_name(LoraTarget t);
std::optional<LoraTarget> parse_lora_target(std::string_view name);
// Shape of the base weight W [out, in] this projection adapts.
int64_t lora_target_out(const ModelConfig& cfg, LoraTarget t);
int64_t lora_target_in(const ModelConfig& cfg, LoraTarget t);

struct LoraConfig {
  int64_t r = 16;
  float alpha = 16.0f;
  float dropout = 0.0f;  // probability in [0, 1), on the LoRA input only
  bool use_rslora = false;
  // Projection names ("q_proj", ...) or the single entry "all-linear" (all seven).
  std::vector<std::string> target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};

  float scale() const;                                // alpha / r, or alpha / sqrt(r) with rsLoRA
  bool targets(LoraTarget t) const;                   // is this projection adapted?
  std::vector<std::string> resolved_targets() const;  // the names, "all-linear" expanded, in enum order
  // Throws CONFIG_INVALID_SETTING for r < 1, dropout outside [0, 1), alpha <= 0 or an unknown
  // target name (the message lists the known ones).
  void validate() const;
  bool operator==(const LoraConfig&) const = default;
};

struct LoraLayer {
  std::array<Tensor, kNumLoraTargets> A;  // [r, in]   (defined when enabled)
  std::array<Tensor, kNumLoraTargets> B;  // [out, r]
  std::array<bool, kNumLoraTargets> enabled{};

  Tensor& a(LoraTarget t) { return A[static_cast<size_t>(t)]; }
  Tensor& b(LoraTarget t) { return B[static_cast<size_t>(t)]; }
  const Tensor& a(LoraTarget t) const { return A[static_cast<size_t>(t)]; }
  const Tensor& b(LoraTarget t) const { return B[static_cast<size_t>(t)]; }
  bool has(LoraTarget t) const { return enabled[static_cast<size_t>(t)]; }
};

struct LoraAdapter {
  LoraConfig config;
  std::vector<LoraLayer> layers;        // one per transformer layer
  std::string base_model_name_or_path;  // written to adapter_config.json

  int64_t num_parameters() const;  // elements of every A and B
};

// PEFT initialisation: A Kaiming-uniform (bound 1/sqrt(in)), B zeros; f32 tensors from the CPU
// allocator. Deterministic in `seed`; each (layer, target) draws from its own stream, so enabling
// another target does not change the others' values. Validates `lora`.
LoraAdapter init_lora(const ModelConfig& cfg, const LoraConfig& lora, uint64_t seed);

}  // namespace bp
