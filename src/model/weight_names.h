// The weight-name table (DESIGN.md "Model", CONVENTIONS.md "One table, not many lists"):
// every tensor role of a Llama-family model with its Hugging Face name, its PEFT module name
// and its GGUF name, in ONE table (weight_names.cpp). Loading, saving, merging, PEFT adapters,
// debugging dumps and GGUF export all go through it. Per-layer names carry "{}" for the layer.
//
//   role       HF                                         PEFT module (+ ".lora_A.weight" etc.)            GGUF
//   Embed      model.embed_tokens.weight                  base_model.model.model.embed_tokens token_embd.weight Q
//   model.layers.{}.self_attn.q_proj.weight    base_model.model.model.layers.{}.self_attn.q_proj blk.{}.attn_q.weight
//   ...
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/lora.h"
#include "model/weights.h"

namespace bp {

enum class WeightRole : int {
  Embed,
  FinalNorm,
  LmHead,
  InputNorm,
  Q,
  K,
  V,
  O,
  QBias,
  KBias,
  VBias,
  QNorm,
  KNorm,
  PostNorm,
  Gate,
  Up,
  Down,
  PreFfnNorm,   // Gemma: pre_feedforward_layernorm (the MLP's input norm)
  PostFfnNorm,  // Gemma: post_feedforward_layernorm (on the MLP's output)
};
inline constexpr int kNumWeightRoles = 19;

struct WeightNameEntry {
  WeightRole role;
  bool per_layer;     // name has a "{}" for the layer index
  const char* hf;     // Hugging Face safetensors name
  const char* peft;   // PEFT module path (the HF module prefixed with base_model.model.)
  const char* gguf;   // llama.cpp GGUF tensor name
  const char* field;  // ModelWeights / LayerWeights field, for messages and dumps
};

// The table, in the canonical save order (global tensors first, then per-layer ones).
const std::vector<WeightNameEntry>& weight_name_table();
const WeightNameEntry& weight_entry(WeightRole role);

// Names with the layer filled in (layer ignored for global roles).
std::string hf_name(WeightRole role, int64_t layer = -1);
std::string peft_module_name(WeightRole role, int64_t layer = -1);
std::string gguf_name(WeightRole role, int64_t layer = -1);
// The GGUF name in a model of `cfg` (Gemma's sandwich norms are named differently in llama.cpp).
std::string gguf_name(const ModelConfig& cfg, WeightRole role, int64_t layer = -1);

// Parses a name back to (role, layer); layer = -1 for global roles. nullopt when unknown.
std::optional<std::pair<WeightRole, int64_t>> parse_hf_name(std::string_view name);
std::optional<std::pair<WeightRole, int64_t>> parse_gguf_name(std::string_view name);
std::optional<std::pair<WeightRole, int64_t>> parse_gguf_name(const ModelConfig& cfg, std::string_view name);
// PEFT module paths are shared by a weight and its bias; this returns the weight's role.
std::optional<std::pair<WeightRole, int64_t>> parse_peft_module_name(std::string_view name);

// Does this model have the role (bias only with attention_bias, q/k norm only for Qwen3 and Gemma 3,
// pre/post feed-forward norms only for Gemma,
// lm_head only when untied)? And its shape per the config.
bool role_present(const ModelConfig& cfg, WeightRole role);
// The RMSNorm weights (input, post-attention, Gemma's feed-forward ones, q/k, final).
bool is_norm_role(WeightRole role);
Shape role_shape(const ModelConfig& cfg, WeightRole role);

// The tensor of a role in a ModelWeights (layer ignored for global roles).
Tensor& weight_ref(ModelWeights& w, WeightRole role, int64_t layer = -1);
const Tensor& weight_ref(const ModelWeights& w, WeightRole role, int64_t layer = -1);

// Every present (role, layer) of a model, in the canonical order.
std::vector<std::pair<WeightRole, int64_t>> model_roles(const ModelConfig& cfg);
// (HF name, tensor) of every present weight, for saving; tensors are shared, not copied.
std::vector<std::pair<std::string, Tensor>> named_hf_weights(const ModelWeights& w);

// LoRA targets and their base-weight roles.
WeightRole lora_target_role(LoraTarget t);
// "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" (is_a) or ".lora_B.weight".
std::string peft_lora_name(int64_t layer, LoraTarget t, bool is_a);

}  // namespace bp
