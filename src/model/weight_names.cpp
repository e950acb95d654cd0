// The weight-name table and the functions that read it (see weight_names.h).
#include "model/weight_names.h"

#include <charconv>

#include "core/error.h"

namespace bp {

namespace {

using R = WeightRole;

// THE table. Order = canonical save order (matches transformers' state_dict order per layer).
const std::vector<WeightNameEntry> kTable = {
    {R::Embed, false, "model.embed_tokens.weight", "base_model.model.model.embed_tokens", "token_embd.weight", "embed"},
    {R::InputNorm, true, "model.layers.{}.input_layernorm.weight", "base_model.model.model.layers.{}.input_layernorm",
     "blk.{}.attn_norm.weight", "input_norm"},
    {R::Q, true, "model.layers.{}.self_attn.q_proj.weight", "base_model.model.model.layers.{}.self_attn.q_proj",
     "blk.{}.attn_q.weight", "q"},
    {R::QBias, true, "model.layers.{}.self_attn.q_proj.bias", "base_model.model.model.layers.{}.self_attn.q_proj",
     "blk.{}.attn_q.bias", "q_bias"},
    {R::K, true, "model.layers.{}.self_attn.k_proj.weight", "base_model.model.model.layers.{}.self_attn.k_proj",
     "blk.{}.attn_k.weight", "k"},
    {R::KBias, true, "model.layers.{}.self_attn.k_proj.bias", "base_model.model.model.layers.{}.self_attn.k_proj",
     "blk.{}.attn_k.bias", "k_bias"},
    {R::V, true, "model.layers.{}.self_attn.v_proj.weight", "base_model.model.model.layers.{}.self_attn.v_proj",
     "blk.{}.attn_v.weight", "v"},
    {R::VBias, true, "model.layers.{}.self_attn.v_proj.bias", "base_model.model.model.layers.{}.self_attn.v_proj",
     "blk.{}.attn_v.bias", "v_bias"},
    {R::O, true, "model.layers.{}.self_attn.o_proj.weight", "base_model.model.model.layers.{}.self_attn.o_proj",
     "blk.{}.attn_output.weight", "o"},
    {R::QNorm, true, "model.layers.{}.self_attn.q_norm.weight", "base_model.model.model.layers.{}.self_attn.q_norm",
     "blk.{}.attn_q_norm.weight", "q_norm"},
    {R::KNorm, true, "model.layers.{}.self_attn.k_norm.weight", "base_model.model.model.layers.{}.self_attn.k_norm",
     "blk.{}.attn_k_norm.weight", "k_norm"},
    {R::PostNorm, true, "model.layers.{}.post_attention_layernorm.weight",
     "base_model.model.model.layers.{}.post_attention_layernorm", "blk.{}.ffn_norm.weight", "post_norm"},
    {R::PreFfnNorm, true, "model.layers.{}.pre_feedforward_layernorm.weight",
     "base_model.model.model.layers.{}.pre_feedforward_layernorm", "", "pre_ffn_norm"},  // GGUF: kSandwichGguf
    {R::Gate, true, "model.layers.{}.mlp.gate_proj.weight", "base_model.model.model.layers.{}.mlp.gate_proj",
     "blk.{}.ffn_gate.weight", "gate"},
    {R::Up, true, "model.layers.{}.mlp.up_proj.weight", "base_model.model.model.layers.{}.mlp.up_proj",
     "blk.{}.ffn_up.weight", "up"},
    {R::Down, true, "model.layers.{}.mlp.down_proj.weight", "base_model.model.model.layers.{}.mlp.down_proj",
     "blk.{}.ffn_down.weight", "down"},
    // Mixture-of-Experts, Qwen3-MoE's names (Mixtral's: moe_aware_name). The experts' `hf` is the
    // stacked tensor's name (stacked_expert_name); HF files hold one tensor per expert
    // (expert_hf_name). llama.cpp stacks them as we do: ffn_{gate,up,down}_exps [E, out, in].
    {R::Router, true, "model.layers.{}.mlp.gate.weight", "base_model.model.model.layers.{}.mlp.gate",
     "blk.{}.ffn_gate_inp.weight", "router"},
    {R::ExpertGate, true, "model.layers.{}.mlp.experts.gate_proj", "base_model.model.model.layers.{}.mlp.experts",
     "blk.{}.ffn_gate_exps.weight", "experts_gate"},
    {R::ExpertUp, true, "model.layers.{}.mlp.experts.up_proj", "base_model.model.model.layers.{}.mlp.experts",
     "blk.{}.ffn_up_exps.weight", "experts_up"},
    {R::ExpertDown, true, "model.layers.{}.mlp.experts.down_proj", "base_model.model.model.layers.{}.mlp.experts",
     "blk.{}.ffn_down_exps.weight", "experts_down"},
    {R::PostFfnNorm, true, "model.layers.{}.post_feedforward_layernorm.weight",
     "base_model.model.model.layers.{}.post_feedforward_layernorm", "blk.{}.post_ffw_norm.weight", "post_ffn_norm"},
    {R::FinalNorm, false, "model.norm.weight", "base_model.model.model.norm", "output_norm.weight", "final_norm"},
    {R::LmHead, false, "lm_head.weight", "base_model.model.lm_head", "output.weight", "lm_head"},
};

const std::vector<FusedProjection> kFused = {
    {"model.layers.{}.self_attn.qkv_proj.weight", "base_model.model.model.layers.{}.self_attn.qkv_proj",
     "blk.{}.attn_qkv.weight", R::Q, 3},
    {"model.layers.{}.mlp.gate_up_proj.weight", "base_model.model.model.layers.{}.mlp.gate_up_proj",
     "blk.{}.ffn_up.weight", R::Gate, 2},
};

std::string fill(const char* tmpl, bool per_layer, int64_t layer) {
  if (!per_layer) return tmpl;
  BP_CHECK(layer >= 0, "[weights] per-layer name '{}' needs a layer index", tmpl);
  return fmt::format(fmt::runtime(tmpl), layer);
}

// Matches `name` against a template; returns the layer (-1 for global) or nullopt.
std::optional<int64_t> match(std::string_view tmpl, bool per_layer, std::string_view name) {
  if (!per_layer) return name == tmpl ? std::optional<int64_t>(-1) : std::nullopt;
  const size_t at = tmpl.find("{}");
  const std::string_view pre = tmpl.substr(0, at), post = tmpl.substr(at + 2);
  if (name.size() <= pre.size() + post.size() || name.substr(0, pre.size()) != pre ||
      name.substr(name.size() - post.size()) != post)
    return std::nullopt;
  const std::string_view digits = name.substr(pre.size(), name.size() - pre.size() - post.size());
  int64_t layer = 0;
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), layer);
  if (ec != std::errc() || p != digits.data() + digits.size() || layer < 0 || digits.size() > 9) return std::nullopt;
  return layer;
}

}  // namespace

const std::vector<WeightNameEntry>& weight_name_table() {
  return kTable;
}

const WeightNameEntry& weight_entry(WeightRole role) {
  for (const WeightNameEntry& e : kTable)
    if (e.role == role) return e;
  BP_CHECK(false, "[weights] role {} missing from the name table", static_cast<int>(role));
  return kTable[0];
}

std::string hf_name(WeightRole role, int64_t layer) {
  const WeightNameEntry& e = weight_entry(role);
  return fill(e.hf, e.per_layer, layer);
}
std::string peft_module_name(WeightRole role, int64_t layer) {
  const WeightNameEntry& e = weight_entry(role);
  return fill(e.peft, e.per_layer, layer);
}
std::string gguf_name(WeightRole role, int64_t layer) {
  const WeightNameEntry& e = weight_entry(role);
  BP_CHECK(*e.gguf, "[weights] {} has a GGUF name only for a given architecture", e.field);
  return fill(e.gguf, e.per_layer, layer);
}

namespace {
// Gemma's sandwich norms in llama.cpp's GGUF (llama-arch.cpp, LLM_ARCH_GEMMA2 / LLM_ARCH_GEMMA3):
// post_attention_layernorm is post_attention_norm, pre_feedforward_layernorm takes ffn_norm.
constexpr std::pair<WeightRole, const char*> kSandwichGguf[] = {
    {R::PostNorm, "blk.{}.post_attention_norm.weight"},
    {R::PreFfnNorm, "blk.{}.ffn_norm.weight"},
};
}  // namespace

std::string gguf_name(const ModelConfig& cfg, WeightRole role, int64_t layer) {
  if (cfg.sandwich_norms)
    for (const auto& [r, name] : kSandwichGguf)
      if (r == role) return fill(name, true, layer);
  return gguf_name(role, layer);
}

std::optional<std::pair<WeightRole, int64_t>> parse_gguf_name(const ModelConfig& cfg, std::string_view name) {
  if (cfg.sandwich_norms)
    for (const auto& [r, tmpl] : kSandwichGguf)
      if (auto l = match(tmpl, true, name)) return std::pair{r, *l};
  return parse_gguf_name(name);
}

namespace {
constexpr std::string_view kTextModel = "model.", kTextHead = "lm_head.";
constexpr std::string_view kPeftRoot = "base_model.model.";
constexpr std::string_view kPeftLanguageModelModel = "base_model.model.language_model.model.";
constexpr std::string_view kPeftModelLanguageModel = "base_model.model.model.language_model.";
}  // namespace

std::string multimodal_hf_name(const std::string& hf, MultimodalLayout layout) {
  const bool old_layout = layout == MultimodalLayout::LanguageModelModel;
  if (hf.starts_with(kTextModel))
    return (old_layout ? "language_model.model." : "model.language_model.") + hf.substr(kTextModel.size());
  if (hf.starts_with(kTextHead)) return old_layout ? "language_model." + hf : hf;
  return hf;
}

std::string multimodal_peft_name(const std::string& peft) {
  const std::string text = std::string(kPeftRoot) + std::string(kTextModel);
  if (!peft.starts_with(text)) return peft;
  return std::string(kPeftModelLanguageModel) + peft.substr(text.size());
}

std::string text_peft_name(const std::string& peft) {
  for (std::string_view p : {kPeftLanguageModelModel, kPeftModelLanguageModel})
    if (peft.starts_with(p)) return std::string(kPeftRoot) + std::string(kTextModel) + peft.substr(p.size());
  return peft;
}

std::optional<std::pair<WeightRole, int64_t>> parse_hf_name(std::string_view name) {
  for (const WeightNameEntry& e : kTable)
    if (auto l = match(e.hf, e.per_layer, name)) return std::pair{e.role, *l};
  return std::nullopt;
}

std::optional<std::pair<WeightRole, int64_t>> parse_gguf_name(std::string_view name) {
  for (const WeightNameEntry& e : kTable)
    if (*e.gguf)
      if (auto l = match(e.gguf, e.per_layer, name)) return std::pair{e.role, *l};
  return std::nullopt;
}

std::optional<std::pair<WeightRole, int64_t>> parse_peft_module_name(std::string_view name) {
  for (const WeightNameEntry& e : kTable)  // weights come before their biases in the table
    if (auto l = match(e.peft, e.per_layer, name)) return std::pair{e.role, *l};
  return std::nullopt;
}

bool role_present(const ModelConfig& cfg, WeightRole role) {
  switch (role) {
    case R::QBias:
    case R::KBias:
    case R::VBias: return cfg.attention_bias;
    case R::QNorm:
    case R::KNorm: return cfg.qk_norm;
    case R::PreFfnNorm:
    case R::PostFfnNorm: return cfg.sandwich_norms;
    case R::LmHead: return !cfg.tie_word_embeddings;
    case R::Router:
    case R::ExpertGate:
    case R::ExpertUp:
    case R::ExpertDown: return cfg.is_moe();
    default: return true;
  }
}

bool is_norm_role(WeightRole r) {
  return r == R::InputNorm || r == R::PostNorm || r == R::FinalNorm || r == R::QNorm || r == R::KNorm ||
         r == R::PreFfnNorm || r == R::PostFfnNorm;
}

Shape role_shape(const ModelConfig& c, WeightRole role) {
  const int64_t D = c.hidden_size, F = c.intermediate_size;
  switch (role) {
    case R::Embed:
    case R::LmHead: return {c.vocab_size, D};
    case R::FinalNorm:
    case R::InputNorm:
    case R::PostNorm:
    case R::PreFfnNorm:
    case R::PostFfnNorm: return {D};
    case R::Q: return {c.q_dim(), D};
    case R::K:
    case R::V: return {c.kv_dim(), D};
    case R::O: return {D, c.q_dim()};
    case R::QBias: return {c.q_dim()};
    case R::KBias:
    case R::VBias: return {c.kv_dim()};
    case R::QNorm:
    case R::KNorm: return {c.head_dim};
    case R::Gate:
    case R::Up: return {F, D};
    case R::Down: return {D, F};
    case R::Router: return {c.num_experts, D};
    case R::ExpertGate:
    case R::ExpertUp: return {c.num_experts, c.moe_intermediate_size, D};
    case R::ExpertDown: return {c.num_experts, D, c.moe_intermediate_size};
  }
  return {};
}

const Tensor& weight_ref(const ModelWeights& w, WeightRole role, int64_t layer) {
  return weight_ref(const_cast<ModelWeights&>(w), role, layer);
}

Tensor& weight_ref(ModelWeights& w, WeightRole role, int64_t layer) {
  switch (role) {
    case R::Embed: return w.embed;
    case R::FinalNorm: return w.final_norm;
    case R::LmHead: return w.lm_head;
    default: break;
  }
  BP_CHECK(layer >= 0 && layer < static_cast<int64_t>(w.layers.size()), "[weights] layer {} of {}", layer,
           w.layers.size());
  LayerWeights& l = w.layers[static_cast<size_t>(layer)];
  switch (role) {
    case R::InputNorm: return l.input_norm;
    case R::Q: return l.q;
    case R::K: return l.k;
    case R::V: return l.v;
    case R::O: return l.o;
    case R::QBias: return l.q_bias;
    case R::KBias: return l.k_bias;
    case R::VBias: return l.v_bias;
    case R::QNorm: return l.q_norm;
    case R::KNorm: return l.k_norm;
    case R::PostNorm: return l.post_norm;
    case R::Gate: return l.gate;
    case R::Up: return l.up;
    case R::Down: return l.down;
    case R::PreFfnNorm: return l.pre_ffn_norm;
    case R::PostFfnNorm: return l.post_ffn_norm;
    case R::Router: return l.router;
    case R::ExpertGate: return l.experts_gate;
    case R::ExpertUp: return l.experts_up;
    case R::ExpertDown: return l.experts_down;
    default: break;
  }
  BP_CHECK(false, "[weights] unknown role {}", static_cast<int>(role));
  return w.embed;
}

std::vector<std::pair<WeightRole, int64_t>> model_roles(const ModelConfig& cfg) {
  std::vector<std::pair<WeightRole, int64_t>> out;
  for (const WeightNameEntry& e : kTable)
    if (!e.per_layer && e.role == R::Embed && role_present(cfg, e.role)) out.emplace_back(e.role, -1);
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (const WeightNameEntry& e : kTable) {
      if (!e.per_layer || !role_present(cfg, e.role)) continue;
      const bool mlp = e.role == R::Gate || e.role == R::Up || e.role == R::Down;
      if (cfg.is_moe_layer(l) ? mlp : is_moe_role(e.role)) continue;  // a sparse layer's MLP is its experts
      out.emplace_back(e.role, l);
    }
  for (const WeightNameEntry& e : kTable)
    if (!e.per_layer && e.role != R::Embed && role_present(cfg, e.role)) out.emplace_back(e.role, -1);
  return out;
}

const std::vector<FusedProjection>& fused_projection_table() {
  return kFused;
}

const FusedProjection* fused_projection_of(const ModelConfig& cfg, WeightRole role) {
  if (!cfg.fused_projections()) return nullptr;
  for (const FusedProjection& f : kFused)
    if (f.contains(role)) return &f;
  return nullptr;
}

Shape fused_shape(const ModelConfig& cfg, const FusedProjection& f) {
  int64_t rows = 0;
  for (int i = 0; i < f.count; ++i) rows += role_shape(cfg, static_cast<WeightRole>(static_cast<int>(f.first) + i))[0];
  return {rows, cfg.hidden_size};
}

std::pair<int64_t, int64_t> fused_rows(const ModelConfig& cfg, WeightRole role) {
  for (const FusedProjection& f : kFused) {
    if (!f.contains(role)) continue;
    int64_t at = 0;
    for (int r = static_cast<int>(f.first); r < static_cast<int>(role); ++r)
      at += role_shape(cfg, static_cast<WeightRole>(r))[0];
    return {at, at + role_shape(cfg, role)[0]};
  }
  return {0, role_shape(cfg, role)[0]};
}

Tensor join_rows_or_copy(const std::vector<const Tensor*>& parts) {
  if (Tensor joined = Tensor::joined_rows(parts); joined.defined()) return joined;
  bool same = true;
  int64_t rows = 0;
  for (const Tensor* p : parts) {
    same = same && p->dtype() == parts[0]->dtype();
    rows += p->dim(0);
  }
  const DType dt = same ? parts[0]->dtype() : DType::F32;
  Shape shape = parts[0]->shape();  // any rank: B [out, r], a DoRA magnitude [out]
  shape.dims[0] = rows;
  Tensor all = Tensor::empty(shape, dt);
  int64_t at = 0;
  for (const Tensor* p : parts) {
    const Tensor host = p->device().type == DeviceType::CPU ? *p : p->to(Device{});
    all.rows(at, at + p->dim(0)).copy_from(host.dtype() == dt ? host : host.to(dt));
    at += p->dim(0);
  }
  return all;
}

namespace {
const MoeNaming& moe_naming(const ModelConfig& cfg) {
  const MoeNaming& n = arch_info(cfg.arch).moe;
  BP_CHECK(n.block, "[weights] {} has no Mixture-of-Experts names", cfg.architecture_name);
  return n;
}
}  // namespace

std::string moe_router_hf_name(const ModelConfig& cfg, int64_t layer) {
  return fmt::format("model.layers.{}.{}.gate.weight", layer, moe_naming(cfg).block);
}

std::string expert_module_path(const ModelConfig& cfg, WeightRole role, int64_t layer, int64_t expert) {
  const MoeNaming& n = moe_naming(cfg);
  const char* proj = role == R::ExpertGate ? n.gate : role == R::ExpertUp ? n.up : n.down;
  BP_CHECK(is_expert_role(role), "[weights] {} is not an expert role", weight_entry(role).field);
  return fmt::format("model.layers.{}.{}.experts.{}.{}", layer, n.block, expert, proj);
}

std::string expert_hf_name(const ModelConfig& cfg, WeightRole role, int64_t layer, int64_t expert) {
  return expert_module_path(cfg, role, layer, expert) + ".weight";
}

std::string stacked_expert_name(const ModelConfig& cfg, WeightRole role, int64_t layer) {
  const MoeNaming& n = moe_naming(cfg);
  const char* proj = role == R::ExpertGate ? n.gate : role == R::ExpertUp ? n.up : n.down;
  return fmt::format("model.layers.{}.{}.experts.{}", layer, n.block, proj);
}

std::string moe_aware_name(const ModelConfig& cfg, WeightRole role, int64_t layer) {
  if (role == R::Router) return moe_router_hf_name(cfg, layer);
  if (is_expert_role(role)) return stacked_expert_name(cfg, role, layer);
  return hf_name(role, layer);
}

std::vector<std::pair<std::string, Tensor>> named_hf_weights(const ModelWeights& w) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [role, layer] : model_roles(w.config)) {
    if (is_expert_role(role)) {  // one tensor per expert, as Hugging Face stores them
      const Tensor& stacked = weight_ref(w, role, layer);
      for (int64_t e = 0; e < stacked.dim(0); ++e)
        out.emplace_back(expert_hf_name(w.config, role, layer, e), expert_matrix(stacked, e));
      continue;
    }
    if (role == R::Router) {
      out.emplace_back(moe_router_hf_name(w.config, layer), weight_ref(w, role, layer));
      continue;
    }
    if (const FusedProjection* f = fused_projection_of(w.config, role)) {
      if (role != f->first) continue;  // written with the first member
      std::vector<const Tensor*> parts;
      for (int i = 0; i < f->count; ++i)
        parts.push_back(&weight_ref(w, static_cast<WeightRole>(static_cast<int>(f->first) + i), layer));
      out.emplace_back(fill(f->hf, true, layer), join_rows_or_copy(parts));
      continue;
    }
    out.emplace_back(hf_name(role, layer), weight_ref(w, role, layer));
  }
  return out;
}

WeightRole lora_target_role(LoraTarget t) {
  switch (t) {
    case LoraTarget::Q: return R::Q;
    case LoraTarget::K: return R::K;
    case LoraTarget::V: return R::V;
    case LoraTarget::O: return R::O;
    case LoraTarget::Gate: return R::Gate;
    case LoraTarget::Up: return R::Up;
    case LoraTarget::Down: return R::Down;
  }
  return R::Q;
}

std::string peft_lora_name(int64_t layer, LoraTarget t, bool is_a, bool fused) {
  const char* suffix = is_a ? ".lora_A.weight" : ".lora_B.weight";
  if (fused)
    for (const FusedProjection& f : kFused)
      if (f.contains(lora_target_role(t))) return fill(f.peft, true, layer) + suffix;
  return peft_module_name(lora_target_role(t), layer) + suffix;
}

std::optional<std::pair<LoraTarget, int64_t>> parse_peft_fused_module_name(std::string_view name) {
  for (const FusedProjection& f : kFused)
    if (auto l = match(f.peft, true, name))
      for (LoraTarget t : kAllLoraTargets)
        if (lora_target_role(t) == f.first) return std::pair{t, *l};
  return std::nullopt;
}

}  // namespace bp
