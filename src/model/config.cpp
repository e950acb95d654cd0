// ModelConfig from Hugging Face config.json (see config.h).
//
// Defaults follow transformers' config classes for the four architectures: num_key_value_heads
// = num_attention_heads, head_dim = hidden_size / num_attention_heads, rope_theta 10000,
// rms_norm_eps 1e-6, tie_word_embeddings false. Qwen2 always has q/k/v bias; Qwen3 always has
// per-head q_norm/k_norm. Every problem is DEP_MODEL_LOAD_FAILED naming the file and the key.
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_read.h"

namespace bp {

namespace {

using ArchEntry = ArchInfo;
using SW = SlidingWindowKey;
// arch, architecture, model_type, gguf_arch, gguf_tokenizer_pre, qkv_bias, qk_norm, tied_head_default,
// gguf_permute_qk, sliding_window, fused_projections, default_rope_theta, moe. (Llama-3's "llama-bpe"
// pre-tokenizer is recognised from its vocabulary.) Phi-3's defaults follow Phi3Config (untied,
// theta 1e4, original_max_position_embeddings 4096), SmolLM3's SmolLM3Config (tied, theta 2e6).
constexpr MoeNaming kDense{nullptr, nullptr, nullptr, nullptr};
constexpr ArchEntry kArchs[] = {
    {Arch::Llama, "LlamaForCausalLM", "llama", "llama", "", false, false, false, true, SW::None, false, 10000.0,
     kDense},
    {Arch::Mistral, "MistralForCausalLM", "mistral", "llama", "", false, false, false, true, SW::Always, false, 10000.0,
     kDense},
    {Arch::Qwen2, "Qwen2ForCausalLM", "qwen2", "qwen2", "qwen2", true, false, false, false, SW::IfUseSlidingWindow,
     false, 10000.0, kDense},
    {Arch::Qwen3, "Qwen3ForCausalLM", "qwen3", "qwen3", "qwen2", false, true, false, false, SW::IfUseSlidingWindow,
     false, 10000.0, kDense},
    {Arch::Phi3, "Phi3ForCausalLM", "phi3", "phi3", "", false, false, false, false, SW::Always, true, 10000.0, kDense},
    {Arch::SmolLM3, "SmolLM3ForCausalLM", "smollm3", "smollm3", "", false, false, true, true, SW::None, false,
     2000000.0, kDense},
    // Gemma: sliding windows per layer (parse_gemma), SentencePiece vocabularies in GGUF.
    {Arch::Gemma2, "Gemma2ForCausalLM", "gemma2", "gemma2", "", false, false, true, false, SW::None, false, 10000.0,
     kDense},
    {Arch::Gemma3, "Gemma3ForCausalLM", "gemma3_text", "gemma3", "", false, true, true, false, SW::None, false,
     1000000.0, kDense},
    // Mixture-of-Experts (parse_moe): Qwen3-MoE is Qwen3's attention (q/k norms) with sparse blocks
    // (Qwen3MoeConfig); Mixtral is Mistral's with every layer sparse, theta 1e6 (MixtralConfig).
    {Arch::Qwen3Moe,
     "Qwen3MoeForCausalLM",
     "qwen3_moe",
     "qwen3moe",
     "qwen2",
     false,
     true,
     false,
     false,
     SW::IfUseSlidingWindow,
     false,
     10000.0,
     {"mlp", "gate_proj", "up_proj", "down_proj"}},
    {Arch::Mixtral,
     "MixtralForCausalLM",
     "mixtral",
     "llama",
     "",
     false,
     false,
     false,
     true,
     SW::Always,
     false,
     1000000.0,
     {"block_sparse_moe", "w1", "w3", "w2"}},
};
// Phi3Config's original_max_position_embeddings when config.json does not say.
constexpr int64_t kPhi3OriginalMaxPosition = 4096;
// Gemma 3's multimodal checkpoints, whose text model is read (gemma3_text_config).
constexpr const char* kGemma3Multimodal = "Gemma3ForConditionalGeneration";

// Bounds far above any real model (Llama 3.1 405B: hidden 16384, intermediate 53248, 126 layers)
// that keep every size product, e.g. num_parameters(), inside int64.
constexpr int64_t kMaxDim = int64_t{1} << 22;
constexpr int64_t kMaxLayers = 4096;
// Largest parameter count accepted (2.8e14, a thousand times today's largest models): every size
// derived from the config (bytes of weights, gradients, optimizer state) then fits in 64 bits.
constexpr int64_t kMaxParameters = int64_t{1} << 48;

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, fmt::format("[config] {}: {}", source, what));
}

std::string supported_list() {
  std::string s;
  for (const ArchEntry& a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a.architecture);
  return s + ", " + kGemma3Multimodal + " (its text model)";
}

// Reads an integer field; `def` < 0 with the key missing means required.
int64_t get_int(const nlohmann::json& j, const char* key, const std::string& source, int64_t def, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) fail(source, fmt::format("required field '{}' is missing", key));
    return def;
  }
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (std::fabs(d) < 9.0e18 && d == std::floor(d)) return static_cast<int64_t>(d);
  }
  fail(source, fmt::format("field '{}' must be an integer, got {}", key, it->dump()));
}

double get_number(const nlohmann::json& j, const char* key, const std::string& source, double def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number()) fail(source, fmt::format("field '{}' must be a number, got {}", key, it->dump()));
  const double d = it->get<double>();
  // Every number here ends up in a float: reject what a float cannot hold instead of overflowing.
  if (!std::isfinite(d) || std::fabs(d) > 3.0e38)
    fail(source, fmt::format("field '{}' = {} is out of range", key, it->dump()));
  return d;
}

bool get_bool(const nlohmann::json& j, const char* key, const std::string& source, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) fail(source, fmt::format("field '{}' must be true or false, got {}", key, it->dump()));
  return it->get<bool>();
}

// A string field; null or missing gives `def`, another type is an error naming the key.
std::string get_string(const nlohmann::json& j, const char* key, const std::string& source, const std::string& def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_string()) fail(source, fmt::format("field '{}' must be a string, got {}", key, it->dump()));
  return it->get<std::string>();
}

// Token ids: an int, a list of ints, or null.
std::vector<int32_t> get_token_ids(const nlohmann::json& j, const char* key, const std::string& source) {
  std::vector<int32_t> ids;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return ids;
  auto one = [&](const nlohmann::json& v) {
    if (!v.is_number_integer()) fail(source, fmt::format("field '{}' must be an integer or a list of integers", key));
    ids.push_back(v.get<int32_t>());
  };
  if (it->is_array()) {
    for (const auto& v : *it) one(v);
  } else {
    one(*it);
  }
  return ids;
}

// Each field is within bounds, but their products may not be: computes the weight shapes and the
// parameter count in 128 bits and rejects a config whose sizes pass kMaxParameters, naming the fields.
void check_sizes(const ModelConfig& c, const std::string& source) {
  using Wide = unsigned __int128;
  const Wide D = static_cast<Wide>(c.hidden_size), F = static_cast<Wide>(c.intermediate_size);
  const Wide qd = static_cast<Wide>(c.num_heads) * static_cast<Wide>(c.head_dim);
  const Wide kvd = static_cast<Wide>(c.num_kv_heads) * static_cast<Wide>(c.head_dim);
  const Wide per_layer =
      4 * D + 2 * qd * D + 2 * kvd * D + 3 * F * D + qd + 2 * kvd + 2 * static_cast<Wide>(c.head_dim);
  const Wide embed = static_cast<Wide>(c.vocab_size) * D;
  // A sparse layer: the router and E experts of three [Fe, D] projections, beside the dense MLP.
  const Wide experts = static_cast<Wide>(c.num_experts) * (3 * static_cast<Wide>(c.moe_intermediate_size) * D + D);
  const std::pair<const char*, Wide> sizes[] = {
      {"num_experts x moe_intermediate_size x hidden_size (one layer's experts)", experts},
      {"num_attention_heads x head_dim x hidden_size (the q/o projections)", qd * D},
      {"num_key_value_heads x head_dim x hidden_size (the k/v projections)", kvd * D},
      {"intermediate_size x hidden_size (the MLP projections)", F * D},
      {"vocab_size x hidden_size (the embeddings)", embed},
      {"num_hidden_layers x the parameters of one layer", static_cast<Wide>(c.num_layers) * (per_layer + experts)},
      {"the total parameter count", static_cast<Wide>(c.num_layers) * (per_layer + experts) + 2 * embed + D},
  };
  for (const auto& [what, n] : sizes)
    if (n > static_cast<Wide>(kMaxParameters))
      fail(source, fmt::format("{} is {:.3g} parameters, past the limit of {:.3g}: the config's sizes are too large",
                               what, static_cast<double>(n), static_cast<double>(kMaxParameters)));
}

// A list of numbers (LongRoPE's factors) of exactly n entries.
std::vector<float> get_factor_list(const nlohmann::json& j, const char* key, size_t n, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array())
    fail(source, fmt::format("rope_scaling longrope needs '{}', a list of rotary_dim/2 = {} numbers", key, n));
  if (it->size() != n)
    fail(source, fmt::format("rope_scaling '{}' has {} values but rotary_dim/2 = {} are needed (head_dim x "
                             "partial_rotary_factor / 2)",
                             key, it->size(), n));
  std::vector<float> v;
  for (const auto& x : *it) {
    if (!x.is_number() || !(x.get<double>() > 0) || !(x.get<double>() < 3e38))
      fail(source, fmt::format("rope_scaling '{}' must hold positive numbers, got {}", key, x.dump()));
    v.push_back(static_cast<float>(x.get<double>()));
  }
  return v;
}

// The layers that apply RoPE (SmolLM3Config): no_rope_layers (1 = RoPE) or, without it, every
// no_rope_layer_interval-th layer without (default 4).
std::vector<uint8_t> parse_rope_layers(const nlohmann::json& j, int64_t layers, const std::string& source) {
  std::vector<uint8_t> v;
  if (auto it = j.find("no_rope_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != layers)
      fail(source, fmt::format("no_rope_layers must be a list of num_hidden_layers = {} entries (1 = the layer uses "
                               "RoPE, 0 = no position encoding), got {}",
                               layers, it->dump()));
    for (const auto& x : *it) {
      if (!x.is_number_integer() || (x.get<int64_t>() != 0 && x.get<int64_t>() != 1))
        fail(source, fmt::format("no_rope_layers entries must be 0 or 1, got {}", x.dump()));
      v.push_back(static_cast<uint8_t>(x.get<int64_t>()));
    }
    return v;
  }
  const int64_t interval = get_int(j, "no_rope_layer_interval", source, 4, false);
  if (interval < 1) fail(source, fmt::format("no_rope_layer_interval must be >= 1, got {}", interval));
  for (int64_t l = 0; l < layers; ++l) v.push_back(static_cast<uint8_t>((l + 1) % interval != 0));
  return v;
}

// Windows longer than this would not fit the attention op's int (any window past the sequence
// length is full attention anyway).
constexpr int64_t kMaxWindow = (int64_t{1} << 31) - 1;

// sliding_window, layer_types and the per-layer windows (config.h: ModelConfig::layer_windows).
void parse_windows(const nlohmann::json& j, const ArchEntry& entry, const std::string& source, ModelConfig& c) {
  if (entry.sliding_window == SW::Always ||
      (entry.sliding_window == SW::IfUseSlidingWindow && get_bool(j, "use_sliding_window", source, false)))
    c.sliding_window = get_int(j, "sliding_window", source, 0, false);
  if (c.sliding_window < 0 || c.sliding_window > kMaxWindow)
    fail(source, fmt::format("sliding_window must be in [0, {}], got {}", kMaxWindow, c.sliding_window));
  std::vector<bool> sliding;  // from layer_types, when given
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != c.num_layers)
      fail(source, fmt::format("field 'layer_types' must be a list of num_hidden_layers = {} entries, got {}",
                               c.num_layers, it->dump()));
    for (const auto& t : *it) {
      const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
      if (type != "sliding_attention" && type != "full_attention")
        fail(source, fmt::format("layer_types entry '{}' is not supported (supported: sliding_attention, "
                                 "full_attention)",
                                 type));
      sliding.push_back(type == "sliding_attention");
    }
  }
  if (c.sliding_window == 0) return;
  const int64_t first = entry.sliding_window == SW::IfUseSlidingWindow && sliding.empty()
                            ? get_int(j, "max_window_layers", source, 28, false)
                            : 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const bool windowed = sliding.empty() ? l >= first : sliding[static_cast<size_t>(l)];
    c.layer_windows.push_back(windowed ? c.sliding_window : 0);
  }
}

// A float as JSON in its shortest decimal form (1e-05, not 9.99999974737875e-06).
double float_for_json(float f) {
  return std::stod(fmt::format("{}", f));
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    default: return "float32";
  }
}

// Gemma 2 / Gemma 3 (transformers' configuration_gemma2.py / configuration_gemma3.py, Gemma3TextConfig):
// GeGLU with hidden_activation gelu_pytorch_tanh, RMSNorm times (1 + w), four norms a layer,
// embeddings times sqrt(hidden_size) (the normalizer in the weights' dtype), attention scale
// query_pre_attn_scalar^-1/2, sliding-window layers from layer_types (or, without it, every
// sliding_window_pattern-th layer global for Gemma 3, alternate sliding/global from layer 0 for
// Gemma 2), Gemma 3's local RoPE base rope_local_base_freq (rope_scaling on global layers only),
// Gemma 2's attention and final logit soft-capping.
void parse_gemma(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  const bool g3 = c.arch == Arch::Gemma3;
  const std::string act =
      get_string(j, "hidden_activation", source, get_string(j, "hidden_act", source, "gelu_pytorch_tanh"));
  if (act != "gelu_pytorch_tanh")
    fail(source, fmt::format("hidden_activation '{}' is not supported (Gemma: gelu_pytorch_tanh, the GeGLU MLP)", act));
  c.hidden_act = GluActivation::GeluTanh;
  c.norm_weight_offset = 1.0f;
  c.sandwich_norms = true;
  const double sqrt_d = std::sqrt(static_cast<double>(c.hidden_size));
  c.embed_scale = static_cast<float>(sqrt_d);  // rounded to torch_dtype by from_json once that is read
  c.query_pre_attn_scalar = static_cast<float>(get_number(j, "query_pre_attn_scalar", source, 256.0));
  if (!(c.query_pre_attn_scalar > 0))
    fail(source, fmt::format("query_pre_attn_scalar must be > 0, got {}", c.query_pre_attn_scalar));
  c.attention_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.query_pre_attn_scalar)));
  c.attention_softcap = static_cast<float>(get_number(j, "attn_logit_softcapping", source, g3 ? 0.0 : 50.0));
  c.final_logit_softcap = static_cast<float>(get_number(j, "final_logit_softcapping", source, g3 ? 0.0 : 30.0));
  if (c.attention_softcap < 0 || c.final_logit_softcap < 0)
    fail(source, "attn_logit_softcapping and final_logit_softcapping must be >= 0 (or null)");
  const int64_t window = get_int(j, "sliding_window", source, 4096, false);
  if (window < 1 || window > kMaxWindow)
    fail(source, fmt::format("sliding_window must be in [1, {}], got {}", kMaxWindow, window));
  c.sliding_window = window;
  // layer_types was checked by parse_windows; without it, the architecture's pattern.
  const auto types = j.find("layer_types");
  const bool listed = types != j.end() && !types->is_null();
  const int64_t pattern = listed || !g3 ? 2 : get_int(j, "sliding_window_pattern", source, 6, false);
  if (pattern < 1) fail(source, fmt::format("sliding_window_pattern must be >= 1, got {}", pattern));
  c.layer_windows.assign(static_cast<size_t>(c.num_layers), 0);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const bool sliding = listed ? (*types)[static_cast<size_t>(l)] == "sliding_attention" : (l + 1) % pattern != 0;
    if (sliding) c.layer_windows[static_cast<size_t>(l)] = window;
  }
  if (g3) {
    c.local_rope = true;
    c.rope_local = RopeConfig{};
    c.rope_local.head_dim = c.rope.head_dim;
    c.rope_local.theta = static_cast<float>(get_number(j, "rope_local_base_freq", source, 10000.0));
    if (!(c.rope_local.theta > 0)) fail(source, "rope_local_base_freq must be > 0");
  }
}

// Gemma 3's multimodal checkpoints (Gemma3ForConditionalGeneration, model_type "gemma3": Gemma 3
// 4B/12B/27B) nest the text model's settings under text_config, leaving out those equal to
// Gemma3TextConfig's defaults (transformers' configuration_gemma3.py), and keep torch_dtype and
// eos_token_id at the top. The text model is that config as a Gemma3ForCausalLM; the vision tower
// is not read (ModelConfig::multimodal_text).

bool is_gemma3_multimodal(const nlohmann::json& j) {
  auto it = j.find("architectures");
  if (it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string())
    return (*it)[0].get<std::string>() == kGemma3Multimodal;
  return (it == j.end() || it->is_null()) && j.value("model_type", nlohmann::json()) == "gemma3";
}

nlohmann::json gemma3_text_config(const nlohmann::json& j, const std::string& source) {
  nlohmann::json t = {{"vocab_size", 262208},
                      {"hidden_size", 2304},
                      {"intermediate_size", 9216},
                      {"num_hidden_layers", 26},
                      {"num_attention_heads", 8},
                      {"num_key_value_heads", 4},
                      {"head_dim", 256},
                      {"hidden_activation", "gelu_pytorch_tanh"},
                      {"max_position_embeddings", 131072},
                      {"initializer_range", 0.02},
                      {"rms_norm_eps", 1e-6},
                      {"pad_token_id", 0},
                      {"eos_token_id", 1},
                      {"bos_token_id", 2},
                      {"tie_word_embeddings", true},
                      {"rope_theta", 1000000.0},
                      {"attention_bias", false},
                      {"query_pre_attn_scalar", 256},
                      {"sliding_window", 4096},
                      {"final_logit_softcapping", nullptr},
                      {"attn_logit_softcapping", nullptr},
                      {"rope_scaling", nullptr},
                      {"rope_local_base_freq", 10000.0}};
  const auto text = j.find("text_config");
  if (text != j.end() && !text->is_null() && !text->is_object()) fail(source, "field 'text_config' must be an object");
  // Keys the top level holds for the whole model (the text model's own value wins when it has one).
  for (const char* k : {"torch_dtype", "dtype", "eos_token_id", "bos_token_id", "pad_token_id", "tie_word_embeddings"})
    if (auto it = j.find(k); it != j.end()) t[k] = *it;
  if (text != j.end() && text->is_object())
    for (const auto& [k, v] : text->items()) t[k] = v;
  t["architectures"] = nlohmann::json::array({"Gemma3ForCausalLM"});
  t["model_type"] = "gemma3_text";
  return t;
}

// Mixture-of-Experts (transformers' Qwen3MoeConfig / MixtralConfig and their decoder layers):
// Qwen3-MoE: num_experts (128), num_experts_per_tok (8), moe_intermediate_size (768), norm_topk_prob
// (false), decoder_sparse_step (1), mlp_only_layers ([]); layer l is sparse when it is not in
// mlp_only_layers and num_experts > 0 and (l + 1) % decoder_sparse_step == 0, else the dense MLP of
// intermediate_size. Mixtral: num_local_experts (8), num_experts_per_tok (2), experts of
// intermediate_size on every layer, the top-k probabilities always renormalised. Both:
// router_aux_loss_coef (0.001).
void parse_moe(const nlohmann::json& j, const std::string& source, ModelConfig& c) {
  const bool qwen = c.arch == Arch::Qwen3Moe;
  c.num_experts = get_int(j, qwen ? "num_experts" : "num_local_experts", source, qwen ? 128 : 8, false);
  c.num_experts_per_tok = get_int(j, "num_experts_per_tok", source, qwen ? 8 : 2, false);
  c.moe_intermediate_size = qwen ? get_int(j, "moe_intermediate_size", source, 768, false) : c.intermediate_size;
  c.norm_topk_prob = qwen ? get_bool(j, "norm_topk_prob", source, false) : true;
  c.router_aux_loss_coef = static_cast<float>(get_number(j, "router_aux_loss_coef", source, 0.001));
  const char* experts_key = qwen ? "num_experts" : "num_local_experts";
  if (c.num_experts < (qwen ? 0 : 1) || c.num_experts > kMaxDim)
    fail(source, fmt::format("{} must be in [{}, {}], got {}", experts_key, qwen ? 0 : 1, kMaxDim, c.num_experts));
  if (c.num_experts > 0 && (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts))
    fail(source, fmt::format("num_experts_per_tok must be in [1, {} = {}], got {}", experts_key, c.num_experts,
                             c.num_experts_per_tok));
  if (c.moe_intermediate_size < 1 || c.moe_intermediate_size > kMaxDim)
    fail(source, fmt::format("moe_intermediate_size must be in [1, {}], got {}", kMaxDim, c.moe_intermediate_size));
  if (!(c.router_aux_loss_coef >= 0))
    fail(source, fmt::format("router_aux_loss_coef must be >= 0, got {}", c.router_aux_loss_coef));
  std::vector<uint8_t> dense(static_cast<size_t>(c.num_layers), 0);
  int64_t step = 1;
  if (qwen) {
    step = get_int(j, "decoder_sparse_step", source, 1, false);
    if (step < 1) fail(source, fmt::format("decoder_sparse_step must be >= 1, got {}", step));
    if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
      if (!it->is_array())
        fail(source, fmt::format("mlp_only_layers must be a list of layer indices, got {}", it->dump()));
      for (const auto& x : *it) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= c.num_layers)
          fail(source, fmt::format("mlp_only_layers entry {} is not a layer index in [0, {})", x.dump(), c.num_layers));
        dense[static_cast<size_t>(x.get<int64_t>())] = 1;
      }
    }
  }
  if (c.num_experts == 0) return;  // Qwen3-MoE with no experts: every layer dense
  c.moe_layers.assign(static_cast<size_t>(c.num_layers), 0);
  for (int64_t l = 0; l < c.num_layers; ++l)
    c.moe_layers[static_cast<size_t>(l)] = !dense[static_cast<size_t>(l)] && (l + 1) % step == 0;
  if (c.num_moe_layers() == 0) c.moe_layers.clear();
}

}  // namespace

const ArchInfo& arch_info(Arch a) {
  for (const ArchEntry& e : kArchs)
    if (e.arch == a) return e;
  throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[config] no architecture row for {}", static_cast<int>(a)));
}

const char* arch_name(Arch a) {
  for (const ArchEntry& e : kArchs)
    if (e.arch == a) return e.architecture;
  return "?";
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> v;
  for (const ArchEntry& e : kArchs) v.emplace_back(e.architecture);
  return v;
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) fail(source, "config.json must be a JSON object");
  if (is_gemma3_multimodal(j)) {
    ModelConfig c = from_json(gemma3_text_config(j, source), source + " (text_config)");
    c.multimodal_text = true;
    return c;
  }
  ModelConfig c;
  c.raw = j;

  // Architecture: architectures[0], or model_type when `architectures` is absent.
  std::string arch_str, model_type = get_string(j, "model_type", source, "");
  if (auto it = j.find("architectures"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->empty() || !(*it)[0].is_string())
      fail(source, "field 'architectures' must be a non-empty list of names");
    arch_str = (*it)[0].get<std::string>();
  }
  const ArchEntry* entry = nullptr;
  for (const ArchEntry& e : kArchs)
    if ((!arch_str.empty() && arch_str == e.architecture) || (arch_str.empty() && model_type == e.model_type))
      entry = &e;
  if (!entry) {
    const std::string name = !arch_str.empty() ? arch_str : (model_type.empty() ? "(none given)" : model_type);
    fail(source, fmt::format("unsupported architecture '{}'; supported architectures: {}", name, supported_list()));
  }
  c.arch = entry->arch;
  c.architecture_name = entry->architecture;
  c.model_type = model_type.empty() ? entry->model_type : model_type;

  c.vocab_size = get_int(j, "vocab_size", source, 0, true);
  c.hidden_size = get_int(j, "hidden_size", source, 0, true);
  c.intermediate_size = get_int(j, "intermediate_size", source, 0, true);
  c.num_layers = get_int(j, "num_hidden_layers", source, 0, true);
  c.num_heads = get_int(j, "num_attention_heads", source, 0, true);
  c.num_kv_heads = get_int(j, "num_key_value_heads", source, c.num_heads, false);
  for (auto [key, v] : {std::pair{"vocab_size", c.vocab_size},
                        {"hidden_size", c.hidden_size},
                        {"intermediate_size", c.intermediate_size},
                        {"num_hidden_layers", c.num_layers},
                        {"num_attention_heads", c.num_heads},
                        {"num_key_value_heads", c.num_kv_heads}})
    if (v < 1 || v > kMaxDim) fail(source, fmt::format("field '{}' must be in [1, {}], got {}", key, kMaxDim, v));
  if (c.num_layers > kMaxLayers)
    fail(source, fmt::format("num_hidden_layers = {} is implausibly large (limit {})", c.num_layers, kMaxLayers));
  if (c.num_heads % c.num_kv_heads != 0)
    fail(source, fmt::format("num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", c.num_heads,
                             c.num_kv_heads));
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    c.head_dim = get_int(j, "head_dim", source, 0, true);
  } else if (c.arch == Arch::Gemma2 || c.arch == Arch::Gemma3) {
    c.head_dim = 256;  // Gemma2Config / Gemma3TextConfig default
  } else {
    if (c.hidden_size % c.num_heads != 0)
      fail(source, fmt::format("hidden_size ({}) is not divisible by num_attention_heads ({}) and no head_dim is given",
                               c.hidden_size, c.num_heads));
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (c.head_dim < 2 || c.head_dim % 2 != 0 || c.head_dim > kMaxDim)
    fail(source,
         fmt::format("head_dim must be even and in [2, {}] for rotary embeddings, got {}", kMaxDim, c.head_dim));
  check_sizes(c, source);
  const int64_t default_max_pos = c.arch == Arch::Gemma3 ? 131072 : c.arch == Arch::Gemma2 ? 8192 : 2048;
  c.max_position_embeddings = get_int(j, "max_position_embeddings", source, default_max_pos, false);
  c.rms_norm_eps = static_cast<float>(get_number(j, "rms_norm_eps", source, 1e-6));
  if (!(c.rms_norm_eps > 0)) fail(source, fmt::format("rms_norm_eps must be > 0, got {}", c.rms_norm_eps));

  const bool gemma = c.arch == Arch::Gemma2 || c.arch == Arch::Gemma3;
  const std::string act = get_string(j, "hidden_act", source, "silu");
  if (!gemma && act != "silu" && act != "swish")
    fail(source, fmt::format("hidden_act '{}' is not supported (only silu, the SwiGLU MLP)", act));
  if (get_bool(j, "mlp_bias", source, false)) fail(source, "mlp_bias = true is not supported");

  c.rope.head_dim = static_cast<int>(c.head_dim);
  c.rope.theta = static_cast<float>(get_number(j, "rope_theta", source, entry->default_rope_theta));
  // Partial rotary (read for every architecture, as modeling_rope_utils does): the first
  // int(head_dim · factor) dims of each head rotate.
  const double prf = get_number(j, "partial_rotary_factor", source, 1.0);
  if (!(prf > 0.0 && prf <= 1.0)) fail(source, fmt::format("partial_rotary_factor must be in (0, 1], got {}", prf));
  const auto rot = static_cast<int64_t>(static_cast<double>(c.head_dim) * prf);
  if (rot < 2 || rot % 2 != 0)
    fail(source, fmt::format("partial_rotary_factor {} rotates {} of head_dim {} dims; it must be an even number >= 2",
                             prf, rot, c.head_dim));
  if (rot != c.head_dim) c.rope.rotary_dim = static_cast<int>(rot);
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) fail(source, "field 'rope_scaling' must be an object or null");
    std::string type = get_string(*it, "rope_type", source, get_string(*it, "type", source, ""));
    if (type == "llama3") {
      c.rope.llama3_scaling = true;
      c.rope.factor = static_cast<float>(get_number(*it, "factor", source, 8.0));
      c.rope.low_freq_factor = static_cast<float>(get_number(*it, "low_freq_factor", source, 1.0));
      c.rope.high_freq_factor = static_cast<float>(get_number(*it, "high_freq_factor", source, 4.0));
      c.rope.original_max_position =
          static_cast<int>(get_int(*it, "original_max_position_embeddings", source, 8192, false));
      if (!(c.rope.factor > 0) || !(c.rope.high_freq_factor > c.rope.low_freq_factor))
        fail(source, "rope_scaling llama3 needs factor > 0 and high_freq_factor > low_freq_factor");
    } else if (type == "longrope") {
      // _compute_longrope_parameters: with original_max_position_embeddings in the config (always
      // for Phi-3), the scale is max_position_embeddings / original; else rope_scaling's factor.
      c.rope.longrope = true;
      const size_t n = static_cast<size_t>(rot / 2);
      c.rope.short_factor = get_factor_list(*it, "short_factor", n, source);
      c.rope.long_factor = get_factor_list(*it, "long_factor", n, source);
      int64_t original = get_int(j, "original_max_position_embeddings", source,
                                 c.arch == Arch::Phi3 ? kPhi3OriginalMaxPosition : -1, false);
      double factor = 0;
      if (original > 0) {
        factor = static_cast<double>(c.max_position_embeddings) / static_cast<double>(original);
      } else {
        original = c.max_position_embeddings;
        factor = get_number(*it, "factor", source, 1.0);
      }
      if (original < 1 || original > (int64_t{1} << 30))
        fail(source, fmt::format("original_max_position_embeddings must be in [1, 2^30], got {}", original));
      c.rope.original_max_position = static_cast<int>(original);
      double af = get_number(*it, "attention_factor", source, -1.0);
      if (af < 0)
        af = factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(original)));
      if (!(af > 0)) fail(source, fmt::format("rope_scaling attention_factor must be > 0, got {}", af));
      c.rope.attention_factor = static_cast<float>(af);
    } else if (type == "linear") {
      c.rope.linear_factor = static_cast<float>(get_number(*it, "factor", source, 1.0));
      if (!(c.rope.linear_factor > 0)) fail(source, "rope_scaling linear needs factor > 0");
    } else if (type != "default") {
      fail(source,
           fmt::format("rope_scaling type '{}' is not supported (supported: llama3, longrope, linear, default)", type));
    }
  }
  if (c.arch == Arch::SmolLM3) {
    c.rope_layers = parse_rope_layers(j, c.num_layers, source);
    if (get_bool(j, "use_sliding_window", source, false))
      fail(source, "use_sliding_window = true (sliding windows on SmolLM3's layers without RoPE) is not supported");
  }

  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", source, entry->tied_head_default);
  // Phi-3's qkv_proj has no bias (Phi3Config has no attention_bias).
  c.attention_bias =
      entry->qkv_bias ? true : (!entry->fused_projections && get_bool(j, "attention_bias", source, false));
  c.qk_norm = entry->qk_norm;
  parse_windows(j, *entry, source, c);

  if (gemma) parse_gemma(j, source, c);
  if (entry->moe.block) parse_moe(j, source, c);

  const std::vector<int32_t> bos = get_token_ids(j, "bos_token_id", source);
  c.bos_token_id = bos.empty() ? -1 : bos[0];
  c.eos_token_ids = get_token_ids(j, "eos_token_id", source);

  // transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
  std::string dt = get_string(j, "torch_dtype", source, get_string(j, "dtype", source, "float32"));
  if (dt == "float32" || dt == "bfloat16" || dt == "float16") {
    c.torch_dtype = parse_dtype(dt);
  } else {
    fail(source, fmt::format("torch_dtype '{}' is not supported (float32, bfloat16, float16)", dt));
  }
  // HF multiplies by the normalizer cast to the weights' dtype (Gemma3TextScaledWordEmbedding).
  if (c.embed_scale > 0)
    c.embed_scale = c.torch_dtype == DType::BF16  ? bf16_to_f32(f32_to_bf16(c.embed_scale))
                    : c.torch_dtype == DType::F16 ? f16_to_f32(f32_to_f16(c.embed_scale))
                                                  : c.embed_scale;
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  const nlohmann::json j = read_json_file_capped(path, FileKind::Config, {"config", ErrorCode::DEP_MODEL_LOAD_FAILED});
  if (j.is_discarded()) fail(path, "not valid JSON");
  return from_json(j, path);
}

nlohmann::json ModelConfig::to_json() const {
  nlohmann::json j = raw.is_object() ? raw : nlohmann::json::object();
  j["architectures"] = nlohmann::json::array({architecture_name});
  j["model_type"] = model_type;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_layers;
  j["num_attention_heads"] = num_heads;
  j["num_key_value_heads"] = num_kv_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = float_for_json(rms_norm_eps);
  j["rope_theta"] = float_for_json(rope.theta);
  if (rope.llama3_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", float_for_json(rope.factor)},
                         {"low_freq_factor", float_for_json(rope.low_freq_factor)},
                         {"high_freq_factor", float_for_json(rope.high_freq_factor)},
                         {"original_max_position_embeddings", rope.original_max_position}};
  } else if (rope.linear_factor != 1.0f) {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", float_for_json(rope.linear_factor)}};
  } else if (!j.contains("rope_scaling")) {
    j["rope_scaling"] = nullptr;
  }
  if (hidden_act == GluActivation::GeluTanh) {
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["query_pre_attn_scalar"] = float_for_json(query_pre_attn_scalar);
    auto cap = [](float v) { return v > 0 ? nlohmann::json(float_for_json(v)) : nlohmann::json(nullptr); };
    j["attn_logit_softcapping"] = cap(attention_softcap);
    j["final_logit_softcapping"] = cap(final_logit_softcap);
    if (local_rope) j["rope_local_base_freq"] = float_for_json(rope_local.theta);
  } else if (!j.contains("hidden_act")) {
    j["hidden_act"] = "silu";
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (sliding_window > 0) {  // a config made without config.json (GGUF) says it too
    j["sliding_window"] = sliding_window;
    if (arch_info(arch).sliding_window == SlidingWindowKey::IfUseSlidingWindow) j["use_sliding_window"] = true;
    const bool mixed =
        std::any_of(layer_windows.begin(), layer_windows.end(), [&](int64_t w) { return w != layer_windows.front(); });
    if (mixed || sandwich_norms) {  // Gemma: its default pattern need not be these windows
      nlohmann::json types = nlohmann::json::array();
      for (int64_t w : layer_windows) types.push_back(w > 0 ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
    }
  }
  if (arch == Arch::Llama || arch == Arch::Qwen3) j["attention_bias"] = attention_bias;
  if (arch == Arch::Qwen3Moe) {
    j["num_experts"] = num_experts;
    j["moe_intermediate_size"] = moe_intermediate_size;
    j["norm_topk_prob"] = norm_topk_prob;
  }
  if (arch == Arch::Mixtral) j["num_local_experts"] = num_experts;
  if (arch_info(arch).moe.block) {
    j["num_experts_per_tok"] = num_experts_per_tok;
    j["router_aux_loss_coef"] = float_for_json(router_aux_loss_coef);
  }
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  if (eos_token_ids.size() > 1) j["eos_token_id"] = eos_token_ids;
  if (j.contains("dtype")) j["dtype"] = torch_dtype_name(torch_dtype);
  j["torch_dtype"] = torch_dtype_name(torch_dtype);
  return j;
}

RopeConfig ModelConfig::rope_for_layer(int64_t l) const {
  const RopeConfig& base = local_rope && attention_window(l) > 0 ? rope_local : rope;
  if (l >= 0 && l < static_cast<int64_t>(rope_layers.size()) && !rope_layers[static_cast<size_t>(l)]) {
    RopeConfig none = base;
    none.rotary_dim = 0;
    none.longrope = false;
    none.short_factor.clear();
    none.long_factor.clear();
    return none;
  }
  return base;
}

bool ModelConfig::fused_projections() const {
  return arch_info(arch).fused_projections;
}

int64_t ModelConfig::attention_window(int64_t layer) const {
  if (layer_windows.empty()) return sliding_window;
  if (layer < 0 || layer >= static_cast<int64_t>(layer_windows.size()))
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[config] no layer {} (the model has {} windows)", layer, layer_windows.size()));
  return layer_windows[static_cast<size_t>(layer)];
}

AttentionShape ModelConfig::attention_shape(int64_t layer) const {
  return {static_cast<int>(num_heads),
          static_cast<int>(num_kv_heads),
          static_cast<int>(head_dim),
          static_cast<int>(std::min(attention_window(layer), kMaxWindow)),
          attention_scale,
          attention_softcap};
}

int64_t ModelConfig::num_moe_layers() const {
  return static_cast<int64_t>(std::count(moe_layers.begin(), moe_layers.end(), uint8_t{1}));
}

namespace {
// Parameters of the model with `experts` experts computed per sparse layer (all E: the total; k:
// what one token runs through).
int64_t parameters_with(const ModelConfig& c, int64_t experts) {
  const int64_t D = c.hidden_size, F = c.intermediate_size;
  int64_t per_layer = (c.sandwich_norms ? 4 : 2) * D        // input/post norms (+ Gemma's pre/post feed-forward)
                      + c.q_dim() * D + 2 * c.kv_dim() * D  // q, k, v
                      + D * c.q_dim();                      // o
  if (c.attention_bias) per_layer += c.q_dim() + 2 * c.kv_dim();
  if (c.qk_norm) per_layer += 2 * c.head_dim;
  const int64_t sparse = c.num_moe_layers();
  int64_t n = c.vocab_size * D + c.num_layers * per_layer + D;
  n += (c.num_layers - sparse) * 3 * D * F;                                       // dense MLPs
  n += sparse * (c.num_experts * D + experts * 3 * D * c.moe_intermediate_size);  // router + experts
  if (!c.tie_word_embeddings) n += c.vocab_size * D;
  return n;
}
}  // namespace

int64_t ModelConfig::num_parameters() const {
  return parameters_with(*this, num_experts);
}

int64_t ModelConfig::num_active_parameters() const {
  return parameters_with(*this, num_experts_per_tok);
}

}  // namespace bp
