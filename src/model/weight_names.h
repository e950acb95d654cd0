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
  // Mixture-of-Experts (a sparse layer, ModelConfig::is_moe_layer; weights.h): the router and the
  // experts' stacked projections. Their HF names depend on the architecture (ArchInfo::moe): the
  // table's `hf` is Qwen3-MoE's, expert_hf_name gives each expert's, moe_hf_name any architecture's.
  Router,
  ExpertGate,
  ExpertUp,
  ExpertDown,
};
inline constexpr int kNumWeightRoles = 23;
inline bool is_expert_role(WeightRole r) {
  return r == WeightRole::ExpertGate || r == WeightRole::ExpertUp || r == WeightRole::ExpertDown;
}
inline bool is_moe_role(WeightRole r) {
  return r == WeightRole::Router || is_expert_role(r);
}

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

// The text model of a multimodal checkpoint (ModelConfig::multimodal_text, Gemma3ForConditionalGeneration)
// is stored under a prefix: transformers < 4.52 (and Google's published Gemma 3 files) name it
// language_model.model.* with language_model.lm_head; transformers >= 4.52 model.language_model.*
// with lm_head (its _checkpoint_conversion_mapping between the two). PEFT on such a model names
// its modules after the model's attributes: base_model.model.model.language_model.layers.N... on
// today's transformers (PEFT reads the older base_model.model.language_model.model.layers.N... too).
enum class MultimodalLayout { LanguageModelModel, ModelLanguageModel };
// A text model's HF name ("model.layers.0...", "lm_head.weight") as stored in `layout`.
std::string multimodal_hf_name(const std::string& hf, MultimodalLayout layout);
// A text model's PEFT name as PEFT writes it on the multimodal model (the model.language_model. layout).
std::string multimodal_peft_name(const std::string& peft);
// A PEFT name of the multimodal model (either layout) as the text model's; other names unchanged.
std::string text_peft_name(const std::string& peft);

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

// Every present (role, layer) of a model, in the canonical order. A sparse layer has Router,
// ExpertGate/Up/Down in place of Gate/Up/Down.
std::vector<std::pair<WeightRole, int64_t>> model_roles(const ModelConfig& cfg);

// Mixture-of-Experts names (ArchInfo::moe): the router's HF name (model.layers.3.mlp.gate.weight,
// model.layers.3.block_sparse_moe.gate.weight), expert e's HF tensor name of an expert role
// (model.layers.3.mlp.experts.5.gate_proj.weight, ...block_sparse_moe.experts.5.w1.weight), its
// module path (without ".weight": PEFT's module is base_model.model. + it), and the name of a
// stacked tensor in checkpoints and trainable_parameters (model.layers.3.mlp.experts.gate_proj: the
// module name without the expert index).
std::string moe_router_hf_name(const ModelConfig& cfg, int64_t layer);
std::string expert_module_path(const ModelConfig& cfg, WeightRole role, int64_t layer, int64_t expert);
std::string expert_hf_name(const ModelConfig& cfg, WeightRole role, int64_t layer, int64_t expert);
std::string stacked_expert_name(const ModelConfig& cfg, WeightRole role, int64_t layer);
// The HF name of any per-layer or global role of `cfg` (the router by architecture); for an expert
// role, the stacked name.
std::string moe_aware_name(const ModelConfig& cfg, WeightRole role, int64_t layer);
// (HF name, tensor) of every present weight, for saving; tensors are shared, not copied.
std::vector<std::pair<std::string, Tensor>> named_hf_weights(const ModelWeights& w);

// Projections Hugging Face stores as one tensor (ArchInfo::fused_projections: Phi-3): q/k/v are
// rows of qkv_proj [q_dim + 2·kv_dim, D], gate/up rows of gate_up_proj [2F, D], gate first
// (modeling_phi3.py chunks it so). In memory each role keeps its own tensor (loading makes them
// row views of the one tensor read); saving writes the fused tensor back. PEFT's LoRA sits on the
// fused module (one A, one B of the fused rows: model/lora.h); llama.cpp's phi3 GGUF names them
// attn_qkv and ffn_up (gate rows, then up rows).
struct FusedProjection {
  const char* hf;    // Hugging Face safetensors name
  const char* peft;  // PEFT module path
  const char* gguf;  // llama.cpp GGUF tensor name
  WeightRole first;  // the member roles: first .. first + count − 1 (consecutive)
  int count;
  bool contains(WeightRole r) const {
    return static_cast<int>(r) >= static_cast<int>(first) && static_cast<int>(r) < static_cast<int>(first) + count;
  }
};
const std::vector<FusedProjection>& fused_projection_table();
// The fused tensor `role` is stored in on this model, or null (stored on its own).
const FusedProjection* fused_projection_of(const ModelConfig& cfg, WeightRole role);
// The fused tensor's shape, and `role`'s rows [begin, end) in it.
Shape fused_shape(const ModelConfig& cfg, const FusedProjection& f);
std::pair<int64_t, int64_t> fused_rows(const ModelConfig& cfg, WeightRole role);
// The member tensors as one [Σrows, in] tensor: a view when they are consecutive rows of one
// storage (as loading lays them out), else a copy (f32 when their types differ).
Tensor join_rows_or_copy(const std::vector<const Tensor*>& parts);

// LoRA targets and their base-weight roles.
WeightRole lora_target_role(LoraTarget t);
// "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" (is_a) or ".lora_B.weight";
// fused (LoraConfig::fused): a member of a fused module gets the module's name (...qkv_proj.lora_A...).
std::string peft_lora_name(int64_t layer, LoraTarget t, bool is_a, bool fused = false);
// A fused module's PEFT path (base_model.model.model.layers.3.self_attn.qkv_proj) back to its first
// member and layer; nullopt for other names.
std::optional<std::pair<LoraTarget, int64_t>> parse_peft_fused_module_name(std::string_view name);

}  // namespace bp
