// ModelConfig: the Hugging Face config.json of a Llama-family model (DESIGN.md "Model").
// Supported architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v bias),
// Qwen3ForCausalLM (per-head q_norm/k_norm), Phi3ForCausalLM (Phi-3, Phi-3.5, Phi-4-mini: fused
// qkv_proj / gate_up_proj, partial rotary, LongRoPE), SmolLM3ForCausalLM (layers without RoPE),
// Gemma2ForCausalLM and Gemma3ForCausalLM (model_type gemma3_text; the Gemma fields below), the
// text model of Gemma3ForConditionalGeneration (multimodal_text), Qwen3MoeForCausalLM and
// MixtralForCausalLM (Mixture-of-Experts; the MoE fields below).
// Anything else -> DEP_MODEL_LOAD_FAILED listing these.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/attention.h"
#include "ops/rope.h"

namespace bp {

enum class Arch { Llama, Mistral, Qwen2, Qwen3, Phi3, SmolLM3, Gemma2, Gemma3, Qwen3Moe, Mixtral };

// The MLP's gate activation: SwiGLU (silu) or Gemma's GeGLU (gelu_pytorch_tanh, the tanh approximation).
enum class GluActivation { Silu, GeluTanh };

// Where config.json's sliding window is read from, and which layers it applies to when the config
// has no `layer_types` list: Always (Mistral): sliding_window, on every layer; IfUseSlidingWindow
// (Qwen2/3): sliding_window when use_sliding_window is true, on layers >= max_window_layers
// (default 28), as transformers' Qwen2Config derives layer_types.
enum class SlidingWindowKey { None, Always, IfUseSlidingWindow };

// How a Mixture-of-Experts architecture names its sparse block in Hugging Face files (block = null:
// a dense architecture). Qwen3-MoE: model.layers.N.mlp.gate.weight (the router) and
// mlp.experts.E.{gate,up,down}_proj.weight; Mixtral: block_sparse_moe.gate.weight and
// block_sparse_moe.experts.E.{w1,w3,w2}.weight (w1 = gate, w3 = up, w2 = down).
struct MoeNaming {
  const char* block;  // "mlp" / "block_sparse_moe"
  const char* gate;   // the experts' gate, up and down projections
  const char* up;
  const char* down;
};

// Everything that differs between the supported architectures, one row each (kArchs in
// config.cpp). Adding an architecture is one row here plus its genuinely new math.
struct ArchInfo {
  Arch arch;
  const char* architecture;        // config.json architectures[0]
  const char* model_type;          // config.json model_type (used when architectures is absent)
  const char* gguf_arch;           // GGUF general.architecture (llama.cpp's name)
  const char* gguf_tokenizer_pre;  // tokenizer.ggml.pre of a byte-level BPE vocabulary; "" = from the vocab
  bool qkv_bias;                   // q/k/v projections always have a bias (else config's attention_bias)
  bool qk_norm;                    // per-head RMSNorm on q and k
  bool tied_head_default;          // tie_word_embeddings when config.json does not say
  bool gguf_permute_qk;            // GGUF keeps q/k rows in Meta's interleaved rotary layout
  SlidingWindowKey sliding_window;
  // Hugging Face stores q/k/v as one qkv_proj [q_dim + 2·kv_dim, D] and gate/up as one gate_up_proj
  // [2F, D] (gate rows first), and PEFT names those modules (Phi-3): weight_names.h "fused".
  bool fused_projections;
  double default_rope_theta;  // rope_theta when config.json does not say
  MoeNaming moe;              // Mixture-of-Experts names; moe.block null for a dense architecture
};
const ArchInfo& arch_info(Arch a);

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string architecture_name = "LlamaForCausalLM";  // as in config.json
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_heads unless config.json says otherwise
  int64_t max_position_embeddings = 2048;
  float rms_norm_eps = 1e-6f;
  RopeConfig rope;  // theta, head_dim, llama3 scaling
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v bias (Qwen2 always true)
  bool qk_norm = false;         // Qwen3
  int64_t sliding_window = 0;   // config.json's sliding window (Mistral, Qwen2/3, Phi-3); 0 = none
  // Window of each layer (attention_window); empty: sliding_window on every layer. From
  // `layer_types` ("sliding_attention" layers get sliding_window, "full_attention" ones none) when
  // config.json has it, else from the architecture's rule (SlidingWindowKey).
  std::vector<int64_t> layer_windows;
  float attention_scale = 0.0f;    // q·k scale; 0 = 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar^-0.5)
  float attention_softcap = 0.0f;  // attention logit soft-capping (Gemma 2); 0 = none
  // SmolLM3: per layer, 1 = the layer applies RoPE, 0 = no position encoding (HF's no_rope_layers,
  // or every no_rope_layer_interval-th layer without). Empty: every layer uses RoPE.
  std::vector<uint8_t> rope_layers;
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;
  DType torch_dtype = DType::F32;  // dtype of the stored weights

  // Gemma 2 / Gemma 3 (parsed by config.cpp parse_gemma; defaults = Llama behaviour):
  GluActivation hidden_act = GluActivation::Silu;  // hidden_activation gelu_pytorch_tanh: GeGLU
  float embed_scale = 0.0f;         // embeddings times sqrt(hidden_size) rounded to torch_dtype; 0 = none
  float norm_weight_offset = 0.0f;  // every RMSNorm multiplies by (offset + w): Gemma's (1 + w)
  bool sandwich_norms = false;      // post_attention_layernorm on the attention output, pre/post_feedforward_layernorm
  float query_pre_attn_scalar = 0.0f;  // config.json's (attention_scale = its ^-1/2); 0 = not given
  float final_logit_softcap = 0.0f;    // final_logit_softcapping on the LM head's logits; 0 = none
  // (attention_scale, attention_softcap and layer_windows above hold Gemma's attention settings.)
  bool local_rope = false;  // Gemma 3: sliding layers rotate with rope_local (rope_local_base_freq)
  RopeConfig rope_local;

  // The text model of a multimodal checkpoint (Gemma3ForConditionalGeneration): the config is its
  // text_config as a Gemma3ForCausalLM (raw too: a merged export is that text-only model); the
  // weights are read under the checkpoint's prefix (language_model.model. or model.language_model.,
  // model/weight_names.h multimodal_text_prefixes) and the vision tower is never read; PEFT module
  // names are the ones PEFT gives on the multimodal model (model/peft.h).
  bool multimodal_text = false;

  // Mixture-of-Experts (Qwen3-MoE, Mixtral; parsed by config.cpp parse_moe). A sparse layer's MLP is
  // a router [E, D] and E SwiGLU experts of moe_intermediate_size; each token runs through the
  // num_experts_per_tok experts of highest router probability (softmax over all E, top-k, the k
  // probabilities renormalised to sum 1 when norm_topk_prob: always for Mixtral), weighted by them.
  int64_t num_experts = 0;            // E (Qwen3-MoE num_experts, Mixtral num_local_experts); 0 = dense
  int64_t num_experts_per_tok = 0;    // k
  int64_t moe_intermediate_size = 0;  // each expert's F (Mixtral: intermediate_size)
  bool norm_topk_prob = false;
  float router_aux_loss_coef = 0.0f;  // the load-balancing loss's coefficient (config.json's)
  // Per layer, 1 = a sparse MoE block, 0 = the dense MLP of intermediate_size (Qwen3-MoE's
  // mlp_only_layers and decoder_sparse_step). Empty: a dense model.
  std::vector<uint8_t> moe_layers;
  bool is_moe() const { return !moe_layers.empty(); }
  bool is_moe_layer(int64_t l) const {
    return l >= 0 && l < static_cast<int64_t>(moe_layers.size()) && moe_layers[static_cast<size_t>(l)] != 0;
  }
  int64_t num_moe_layers() const;

  nlohmann::json raw;  // the original config.json, written back on export

  // Parses config.json contents; `source` names the file in errors.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);
  static ModelConfig from_file(const std::string& config_json_path);
  nlohmann::json to_json() const;  // HF config.json (raw, updated with our fields)

  // RoPE of layer l: `rope`, Gemma 3's local one (rope_local_base_freq) on its sliding layers, or
  // rotary_dim 0 (nothing rotates) for a layer without RoPE (SmolLM3).
  RopeConfig rope_for_layer(int64_t l) const;
  bool fused_projections() const;  // arch_info(arch).fused_projections

  // Sliding window of layer l (0 = full attention) and the attention op's shape for that layer.
  int64_t attention_window(int64_t layer) const;
  AttentionShape attention_shape(int64_t layer) const;
  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t num_parameters() const;
  // Parameters one token computes with: num_parameters() with only num_experts_per_tok of each
  // sparse layer's experts (the router counted whole). Equal to num_parameters() for a dense model.
  int64_t num_active_parameters() const;
};

const char* arch_name(Arch a);
std::vector<std::string> supported_architectures();

}  // namespace bp
