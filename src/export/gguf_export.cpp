// ModelWeights -> GGUF (contract in export/gguf_export.h).
#include "export/gguf_export.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/weight_names.h"

namespace bp {
namespace {

// llama.cpp's choice of layers that get more bits in the _M mixtures.
bool use_more_bits(int i_layer, int n_layers) {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

GGMLType base_type(GGUFQuant q) {
  switch (q) {
    case GGUFQuant::F32: return GGMLType::F32;
    case GGUFQuant::F16: return GGMLType::F16;
    case GGUFQuant::BF16: return GGMLType::BF16;
    case GGUFQuant::Q8_0: return GGMLType::Q8_0;
    case GGUFQuant::Q4_0: return GGMLType::Q4_0;
    case GGUFQuant::Q4_K_M: return GGMLType::Q4_K;
    case GGUFQuant::Q5_K_M: return GGMLType::Q5_K;
    case GGUFQuant::Q6_K: return GGMLType::Q6_K;
  }
  return GGMLType::F32;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Row order llama.cpp expects for q/k of the llama architecture: within each head, HF's rotate_half
// rows [j·d/2 + i] (j = 0, 1) move to Meta's interleaved position [2i + j].
int64_t permuted_source_row(int64_t out_row, int64_t head_dim) {
  const int64_t h = out_row / head_dim, r = out_row % head_dim;
  const int64_t i = r / 2, j = r % 2;
  return h * head_dim + j * (head_dim / 2) + i;
}

Tensor permuted_vector(const Tensor& b, int64_t head_dim) {
  std::vector<float> v(static_cast<size_t>(b.numel()));
  const float* src = b.data<float>();
  for (int64_t r = 0; r < b.numel(); ++r) v[static_cast<size_t>(r)] = src[permuted_source_row(r, head_dim)];
  return Tensor::from_vector(v, Shape{b.numel()});
}

// Llama-3 rope scaling as llama.cpp stores it: one divisor per rotary frequency.
std::vector<float> llama3_rope_factors(const RopeConfig& r) {
  std::vector<float> f;
  const double low_wavelen = r.original_max_position / r.low_freq_factor;
  const double high_wavelen = r.original_max_position / r.high_freq_factor;
  for (int i = 0; i < r.head_dim; i += 2) {
    const double freq = 1.0 / std::pow(static_cast<double>(r.theta), static_cast<double>(i) / r.head_dim);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) {
      f.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      f.push_back(r.factor);
    } else {
      const double smooth =
          (r.original_max_position / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      f.push_back(static_cast<float>(1.0 / ((1 - smooth) / r.factor + smooth)));
    }
  }
  return f;
}

// llama.cpp runs every layer of qwen3moe and of a llama with experts as a sparse block whose top-k
// weights are renormalised (build_moe_ffn with norm_w true; no metadata says otherwise). A model
// that differs would run differently there: refused, naming what differs.
void check_moe_exportable(const ModelConfig& c) {
  auto refuse = [&](const std::string& why) {
    throw Error(ErrorCode::RUNTIME_GGUF_EXPORT_FAILED, fmt::format("[gguf] this {} {}", c.architecture_name, why))
        .with_suggestion("Export it as a merged Hugging Face folder (--format merged) or a PEFT adapter instead.");
  };
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (!c.is_moe_layer(l))
      refuse(
          fmt::format("has a dense MLP on layer {} (mlp_only_layers / decoder_sparse_step); llama.cpp's {} makes "
                      "every layer a Mixture-of-Experts block and has no metadata for dense ones",
                      l, arch_info(c.arch).gguf_arch));
  if (!c.norm_topk_prob)
    refuse(
        fmt::format("has norm_topk_prob false; llama.cpp's {} always renormalises the top-{} router weights and "
                    "has no metadata to turn that off",
                    arch_info(c.arch).gguf_arch, c.num_experts_per_tok));
}

}  // namespace

GGUFTensorSpec gguf_permuted_rows_spec(const std::string& name, const Tensor& t, GGMLType type, int64_t head_dim) {
  BP_CHECK(t.rank() == 2 && t.dim(0) % head_dim == 0 && head_dim % 2 == 0,
           "[gguf] cannot permute {} {} with head_dim {}", name, t.describe(), head_dim);
  GGUFTensorSpec s = gguf_tensor_from(name, t, type);
  const int64_t n = t.dim(1);
  s.produce = [t, type, n, head_dim](uint8_t* dst, int64_t r0, int64_t r1) {
    std::vector<float> rows(static_cast<size_t>((r1 - r0) * n));
    const float* src = t.data<float>();
    for (int64_t r = r0; r < r1; ++r)
      std::copy_n(src + permuted_source_row(r, head_dim) * n, n, rows.data() + (r - r0) * n);
    quantize_rows(type, rows.data(), dst, r1 - r0, n);
  };
  return s;
}

GGUFQuant parse_gguf_quant(std::string_view name) {
  std::string n(name);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  for (GGUFQuant q : {GGUFQuant::F32, GGUFQuant::F16, GGUFQuant::BF16, GGUFQuant::Q8_0, GGUFQuant::Q4_0,
                      GGUFQuant::Q4_K_M, GGUFQuant::Q5_K_M, GGUFQuant::Q6_K})
    if (n == gguf_quant_name(q)) return q;
  throw Error(
      ErrorCode::INPUT_VALIDATION_FAILED,
      fmt::format("[export] unknown --quantization '{}'; allowed: f32, f16, bf16, q8_0, q4_0, q4_k_m, q5_k_m, q6_k",
                  name));
}

const char* gguf_quant_name(GGUFQuant q) {
  switch (q) {
    case GGUFQuant::F32: return "f32";
    case GGUFQuant::F16: return "f16";
    case GGUFQuant::BF16: return "bf16";
    case GGUFQuant::Q8_0: return "q8_0";
    case GGUFQuant::Q4_0: return "q4_0";
    case GGUFQuant::Q4_K_M: return "q4_k_m";
    case GGUFQuant::Q5_K_M: return "q5_k_m";
    case GGUFQuant::Q6_K: return "q6_k";
  }
  return "?";
}

uint32_t gguf_file_type(GGUFQuant q) {
  switch (q) {
    case GGUFQuant::F32: return 0;
    case GGUFQuant::F16: return 1;
    case GGUFQuant::Q4_0: return 2;
    case GGUFQuant::Q8_0: return 7;
    case GGUFQuant::Q4_K_M: return 15;
    case GGUFQuant::Q5_K_M: return 17;
    case GGUFQuant::Q6_K: return 18;
    case GGUFQuant::BF16: return 32;
  }
  return 0;
}

const char* gguf_arch_name(Arch a) {
  return arch_info(a).gguf_arch;
}

GGMLType gguf_tensor_type(GGUFQuant q, const std::string& name, int64_t row_length, int n_dims, int layer, int n_layers,
                          bool tied) {
  if (n_dims < 2 || !ends_with(name, ".weight") || name.find("_norm.weight") != std::string::npos) return GGMLType::F32;
  // A Mixture-of-Experts router stays f32 (convert_hf_to_gguf.py's FFN_GATE_INP; llama-quant never quantizes it).
  if (ends_with(name, ".ffn_gate_inp.weight")) return GGMLType::F32;
  const GGMLType base = base_type(q);
  if (!ggml_is_quantized(base)) return base;
  GGMLType t = base;
  const bool is_output = name == "output.weight" || (tied && name == "token_embd.weight");
  if (is_output) {
    if (row_length % ggml_type_info(base).block_size != 0)
      t = GGMLType::Q8_0;
    else if (base != GGMLType::Q8_0)
      t = GGMLType::Q6_K;
  } else if ((q == GGUFQuant::Q4_K_M || q == GGUFQuant::Q5_K_M) && layer >= 0 &&
             (ends_with(name, ".attn_v.weight") || ends_with(name, ".ffn_down.weight") ||
              ends_with(name, ".ffn_down_exps.weight")) &&
             use_more_bits(layer, n_layers)) {
    t = GGMLType::Q6_K;
  }
  if (row_length % ggml_type_info(t).block_size != 0) {
    switch (t) {
      case GGMLType::Q4_K: t = GGMLType::Q5_0; break;
      case GGMLType::Q5_K: t = GGMLType::Q5_1; break;
      case GGMLType::Q6_K: t = GGMLType::Q8_0; break;
      default: break;
    }
    if (row_length % ggml_type_info(t).block_size != 0) t = GGMLType::F16;
  }
  return t;
}

void add_model_to_gguf(GGUFWriter& w, const ModelWeights& mw, GGUFQuant q, const std::string& model_name) {
  const ModelConfig& c = mw.config;
  const std::string arch = gguf_arch_name(c.arch);
  const int n_layers = static_cast<int>(c.num_layers);
  BP_CHECK(static_cast<int64_t>(mw.layers.size()) == c.num_layers, "[gguf] {} layers of weights for num_layers {}",
           mw.layers.size(), c.num_layers);
  if (c.is_moe()) check_moe_exportable(c);
  w.set("general.architecture", GGUFValue::str(arch));
  w.set("general.name", GGUFValue::str(model_name));
  w.set("general.file_type", GGUFValue::u32(gguf_file_type(q)));
  w.set("general.quantization_version", GGUFValue::u32(2));
  auto u32 = [](int64_t v) { return GGUFValue::u32(static_cast<uint32_t>(v)); };
  w.set(arch + ".vocab_size", u32(c.vocab_size));
  w.set(arch + ".context_length", u32(c.max_position_embeddings));
  w.set(arch + ".embedding_length", u32(c.hidden_size));
  w.set(arch + ".block_count", u32(c.num_layers));
  w.set(arch + ".feed_forward_length", u32(c.intermediate_size));
  w.set(arch + ".attention.head_count", u32(c.num_heads));
  w.set(arch + ".attention.head_count_kv", u32(c.num_kv_heads));
  w.set(arch + ".rope.freq_base", GGUFValue::f32(c.rope.theta));
  // llama.cpp's n_rot: the rotated dims (Phi-3: int(partial_rotary_factor · hidden) / heads).
  w.set(arch + ".rope.dimension_count", u32(c.rope.rot_dim()));
  w.set(arch + ".attention.layer_norm_rms_epsilon", GGUFValue::f32(c.rms_norm_eps));
  // llama.cpp's sliding window keys: the window, and which layers have it when not all do (one
  // bool per layer, as llama.cpp's sliding_window_pattern array).
  bool all_windowed = true, any_windowed = false;
  nlohmann::json pattern = nlohmann::json::array();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const bool windowed = c.attention_window(l) > 0;
    all_windowed &= windowed;
    any_windowed |= windowed;
    pattern.push_back(windowed);
  }
  if (any_windowed) w.set(arch + ".attention.sliding_window", u32(c.sliding_window));
  if (any_windowed && !all_windowed)
    w.set(arch + ".attention.sliding_window_pattern", GGUFValue::array(GGUFValueType::BOOL, pattern));
  if (c.head_dim * c.num_heads != c.hidden_size ||
      c.sandwich_norms) {  // llama.cpp's Gemma converters always write them
    w.set(arch + ".attention.key_length", u32(c.head_dim));
    w.set(arch + ".attention.value_length", u32(c.head_dim));
  }
  // Gemma (convert_hf_to_gguf.py Gemma2Model / Gemma3Model): Gemma 2's soft-caps, Gemma 3's linear
  // rope scaling (the window above). llama.cpp derives the rest (its layer pattern, the local RoPE
  // base 10000, the attention scale) from the architecture, as hub/gguf_source.cpp reads them back.
  if (c.sandwich_norms) {
    if (c.attention_softcap > 0) w.set(arch + ".attn_logit_softcapping", GGUFValue::f32(c.attention_softcap));
    if (c.final_logit_softcap > 0) w.set(arch + ".final_logit_softcapping", GGUFValue::f32(c.final_logit_softcap));
    if (c.rope.linear_factor != 1.0f) {
      w.set(arch + ".rope.scaling.type", GGUFValue::str("linear"));
      w.set(arch + ".rope.scaling.factor", GGUFValue::f32(c.rope.linear_factor));
    }
  }

  // Mixture-of-Experts (convert_hf_to_gguf.py: TextModel's expert_count / expert_used_count,
  // Qwen2MoeModel's expert_feed_forward_length; a Mixtral is LlamaModel with these keys).
  if (c.is_moe()) {
    w.set(arch + ".expert_count", u32(c.num_experts));
    w.set(arch + ".expert_used_count", u32(c.num_experts_per_tok));
    if (c.arch == Arch::Qwen3Moe) w.set(arch + ".expert_feed_forward_length", u32(c.moe_intermediate_size));
  }
  if (c.arch == Arch::Phi3) {  // convert_hf_to_gguf.py Phi3MiniModel
    w.set(arch + ".attention.sliding_window", u32(c.sliding_window));
    if (c.rope.longrope) {
      w.set(arch + ".rope.scaling.original_context_length", u32(c.rope.original_max_position));
      w.set(arch + ".rope.scaling.attn_factor", GGUFValue::f32(c.rope.attention_factor));
    }
  }
  if (c.arch == Arch::SmolLM3) {
    // llama.cpp's smollm3 has no key for the layers without RoPE: it takes every 4th
    // (n_no_rope_layer_step = 4), SmolLM3Config's default. Another pattern would run wrong there.
    for (int64_t l = 0; l < c.num_layers; ++l)
      if (c.rope_for_layer(l).rot_dim() != ((l + 1) % 4 != 0 ? c.rope.rot_dim() : 0))
        throw Error(ErrorCode::RUNTIME_EXPORT_FAILED,
                    fmt::format("[gguf] this SmolLM3 has RoPE on layer {} {}; llama.cpp's smollm3 takes RoPE off "
                                "every 4th layer only (no_rope_layer_interval 4) and has no metadata for another "
                                "pattern: export it as a merged Hugging Face folder instead",
                                l, c.rope_for_layer(l).rot_dim() ? "on" : "off"));
  }

  const bool tied = c.tie_word_embeddings;
  const bool permute = arch_info(c.arch).gguf_permute_qk;
  auto add = [&](const std::string& name, const Tensor& t, int layer, int64_t permute_head_dim = 0) {
    if (!t.defined()) return;
    const GGMLType type = gguf_tensor_type(q, name, t.dim(t.rank() - 1), t.rank(), layer, n_layers, tied);
    if (permute_head_dim > 0 && t.rank() == 2)
      w.add_tensor(gguf_permuted_rows_spec(name, t, type, permute_head_dim));
    else if (permute_head_dim > 0)
      w.add_tensor(gguf_tensor_from(name, permuted_vector(t, permute_head_dim), type));
    else
      w.add_tensor(gguf_tensor_from(name, t, type));
  };
  // Names come from the one weight-name table (model/weight_names.h); rope_freqs is GGUF-only.
  const int64_t qk_perm = permute ? c.head_dim : 0;
  for (const auto& [role, layer] : model_roles(c)) {
    const bool qk =
        role == WeightRole::Q || role == WeightRole::K || role == WeightRole::QBias || role == WeightRole::KBias;
    if (const FusedProjection* f = fused_projection_of(c, role)) {  // phi3: attn_qkv, ffn_up = gate + up rows
      if (role != f->first) continue;
      std::vector<const Tensor*> parts;
      for (int i = 0; i < f->count; ++i)
        parts.push_back(&weight_ref(mw, static_cast<WeightRole>(static_cast<int>(f->first) + i), layer));
      add(fmt::format(fmt::runtime(f->gguf), layer), join_rows_or_copy(parts), static_cast<int>(layer));
      continue;
    }
    const Tensor& t = weight_ref(mw, role, layer);
    if (c.norm_weight_offset != 0.0f && is_norm_role(role)) {  // Gemma: stored as 1 + w (llama.cpp's norm_shift)
      std::vector<float> shifted = t.to_vector();
      for (float& x : shifted) x += c.norm_weight_offset;
      add(gguf_name(c, role, layer), Tensor::from_vector(shifted, t.shape()), static_cast<int>(layer));
      continue;
    }
    add(gguf_name(c, role, layer), t, static_cast<int>(layer), qk ? qk_perm : 0);
    if (role == WeightRole::Embed && c.rope.llama3_scaling) {
      RopeConfig r = c.rope;
      r.head_dim = static_cast<int>(c.head_dim);
      const auto f = llama3_rope_factors(r);
      add("rope_freqs.weight", Tensor::from_vector(f, Shape{static_cast<int64_t>(f.size())}), -1);
    }
    if (role == WeightRole::Embed && c.rope.longrope) {  // Phi-3's LongRoPE factors, f32 [rot_dim/2]
      const auto n = static_cast<int64_t>(c.rope.long_factor.size());
      w.add_tensor(gguf_tensor_from("rope_factors_long.weight", Tensor::from_vector(c.rope.long_factor, Shape{n}),
                                    GGMLType::F32));
      w.add_tensor(gguf_tensor_from("rope_factors_short.weight", Tensor::from_vector(c.rope.short_factor, Shape{n}),
                                    GGMLType::F32));
    }
  }
}

GGUFExportResult export_gguf(const ModelWeights& weights, const std::string& tokenizer_dir, GGUFQuant quant,
                             const std::string& output_path, const std::string& model_name,
                             const std::string& chat_template) {
  const auto t0 = std::chrono::steady_clock::now();
  GGUFWriter w;
  const std::string name = model_name.empty() ? std::filesystem::path(output_path).stem().string() : model_name;
  add_model_to_gguf(w, weights, quant, name);
  GGUFTokenizer tok = read_gguf_tokenizer(tokenizer_dir, weights.config);
  tok.chat_template = chat_template;
  add_tokenizer_metadata(w, tok);
  w.write(output_path);
  GGUFExportResult r;
  r.chat_template = tok.chat_template;
  r.end_tokens = tok.end_tokens;
  r.context_length = weights.config.max_position_embeddings;
  r.path = output_path;
  r.bytes = w.expected_file_bytes();
  r.file_type = gguf_quant_name(quant);
  for (const auto& t : w.tensors()) r.tensor_types.emplace_back(t.name, ggml_type_name(t.type));
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace bp
