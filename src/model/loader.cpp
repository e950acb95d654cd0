// Model folder loading and random initialisation (see loader.h).
#include "model/loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>

#include "core/error.h"
#include "core/file_read.h"
#include "io/safetensors.h"
#include "model/held_weights.h"
#include "model/loader_gguf.h"
#include "model/weight_names.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const std::string& what) {
  throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, "[model] " + what);
}

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// normal(0, std) by Box-Muller on a splitmix64 stream (portable, unlike std distributions).
void fill_normal(Tensor& t, float std_dev, uint64_t seed) {
  uint64_t s = seed;
  float* p = t.data<float>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = (static_cast<double>(splitmix64(s) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)), th = 2.0 * M_PI * u2;
    p[i] = static_cast<float>(std_dev * r * std::cos(th));
    if (i + 1 < n) p[i + 1] = static_cast<float>(std_dev * r * std::sin(th));
  }
}

bool is_bias(WeightRole r) {
  return r == WeightRole::QBias || r == WeightRole::KBias || r == WeightRole::VBias;
}

// A fused projection (Phi-3's qkv_proj, gate_up_proj): its members are row views of the one tensor
// read, or each held (quantized) on its own from the mapped file's rows.
void load_fused(const SafetensorsReader& reader, ModelWeights& w, const FusedProjection& f, int64_t layer,
                std::optional<DType> base, std::vector<std::string>* notes) {
  const ModelConfig& cfg = w.config;
  const std::string name = fmt::format(fmt::runtime(f.hf), layer);
  if (!reader.contains(name))
    fail(fmt::format("{}: tensor '{}' is missing; {} with {} layers stores its projections fused and needs it",
                     reader.file_of(name), name, cfg.architecture_name, cfg.num_layers));
  const Shape shape = fused_shape(cfg, f);
  const bool held = base && *base != DType::F32 && role_is_held(f.first);
  const Tensor all = held ? reader.borrow(name) : reader.read(name, shape);
  if (all.shape() != shape) reader.read(name, shape);  // throws, naming both shapes
  for (int i = 0; i < f.count; ++i) {
    const auto role = static_cast<WeightRole>(static_cast<int>(f.first) + i);
    const auto [begin, end] = fused_rows(cfg, role);
    Tensor& t = weight_ref(w, role, layer);
    t = all.rows(begin, end);
    if (held) {
      const void* mapped = t.raw();
      hold_role(t, role, *base, notes);
      if (t.raw() == mapped) t = t.clone();  // already the held type: a copy of our own
    }
  }
  if (held) reader.release(name);
}

// How the files name the model's tensors: the HF names, or for the text model of a multimodal
// checkpoint (ModelConfig::multimodal_text) those under the prefix its files use (either layout,
// found from the embedding). Only the text model's tensors are ever read: the vision tower's stay
// unmapped in the files.
std::function<std::string(const std::string&)> stored_names(const SafetensorsReader& reader, const ModelConfig& cfg) {
  if (!cfg.multimodal_text) return [](const std::string& n) { return n; };
  const std::string embed = hf_name(WeightRole::Embed);
  for (MultimodalLayout layout : {MultimodalLayout::ModelLanguageModel, MultimodalLayout::LanguageModelModel})
    if (reader.contains(multimodal_hf_name(embed, layout)))
      return [layout](const std::string& n) { return multimodal_hf_name(n, layout); };
  fail(
      fmt::format("{}: neither '{}' nor '{}' is in the files: a {} checkpoint keeps its text model under one "
                  "of these prefixes",
                  reader.file_of(embed), multimodal_hf_name(embed, MultimodalLayout::ModelLanguageModel),
                  multimodal_hf_name(embed, MultimodalLayout::LanguageModelModel), "Gemma3ForConditionalGeneration"));
}

// A sparse layer's experts of one projection (Mixture-of-Experts): each expert's HF tensor read (or
// held from the mapped file) into its slab of the stacked [E, out, in] tensor (weights.h).
void load_experts(const SafetensorsReader& reader, ModelWeights& w, WeightRole role, int64_t layer,
                  std::optional<DType> base, std::vector<std::string>* notes) {
  const ModelConfig& cfg = w.config;
  const Shape stacked = role_shape(cfg, role), one{stacked[1], stacked[2]};
  const bool held = base && *base != DType::F32;
  std::string note;
  const DType dt = held ? held_dtype_for(*base, one[1], &note) : DType::F32;
  if (notes && !note.empty() && std::find(notes->begin(), notes->end(), note) == notes->end()) notes->push_back(note);
  Tensor all = Tensor::empty(stacked, dt);
  for (int64_t e = 0; e < stacked[0]; ++e) {
    const std::string name = expert_hf_name(cfg, role, layer, e);
    if (!reader.contains(name))
      fail(fmt::format("{}: tensor '{}' is missing; {} with num_experts = {} needs every expert of layer {}",
                       reader.file_of(name), name, cfg.architecture_name, cfg.num_experts, layer));
    Tensor slab = expert_matrix(all, e);
    if (held) {
      const Tensor view = reader.borrow(name);
      if (view.shape() != one) reader.read(name, one);  // throws, naming both shapes
      const Tensor h = hold_weight(view, dt);
      std::memcpy(slab.raw(), h.raw(), h.nbytes());
      reader.release(name);
    } else {
      slab.copy_from(reader.read(name, one));
    }
  }
  weight_ref(w, role, layer) = std::move(all);
}

}  // namespace

bool looks_like_hub_name(const std::string& s) {
  static const std::regex re(R"(^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$)");
  return std::regex_match(s, re);
}

void check_model_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (looks_like_hub_name(dir)) {
      const std::string local = dir.substr(dir.find('/') + 1);
      throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                  fmt::format("[model] '{}' is not a local folder. The loader reads local folders in Hugging Face "
                              "format (config.json, *.safetensors, tokenizer.json); pass the name to a command's "
                              "--model (it downloads into the Hugging Face cache), or on a machine with internet "
                              "access run `huggingface-cli download {} --local-dir ./{}` and pass ./{}.",
                              dir, dir, local, local))
          .with_suggestion(fmt::format("huggingface-cli download {} --local-dir ./{}", dir, local));
    }
    fail(
        fmt::format("model folder '{}' does not exist (expected a local Hugging Face folder with config.json and "
                    "*.safetensors)",
                    dir));
  }
  if (!fs::is_directory(dir, ec))
    fail(fmt::format("'{}' is a file; pass the model folder that holds config.json and the *.safetensors files", dir));
  if (!fs::exists(fs::path(dir) / "config.json", ec))
    fail(fmt::format("'{}' is not a Hugging Face model folder: it has no config.json", dir));
}

ModelConfig load_model_config(const std::string& dir) {
  check_model_dir(dir);
  ModelConfig cfg = ModelConfig::from_file((fs::path(dir) / "config.json").string());
  const fs::path gen = fs::path(dir) / "generation_config.json";
  if (cfg.eos_token_ids.empty() && fs::exists(gen)) {
    const nlohmann::json g =
        read_json_file_capped(gen.string(), FileKind::Config, {"model", ErrorCode::DEP_MODEL_LOAD_FAILED});
    if (!g.is_discarded() && g.is_object()) {
      if (auto it = g.find("eos_token_id"); it != g.end()) {
        if (it->is_number_integer()) cfg.eos_token_ids = {it->get<int32_t>()};
        if (it->is_array())
          for (const auto& v : *it)
            if (v.is_number_integer()) cfg.eos_token_ids.push_back(v.get<int32_t>());
      }
    }
  }
  return cfg;
}

ModelWeights load_model(const std::string& dir, std::optional<DType> base, std::vector<std::string>* notes) {
  ModelWeights w;
  w.config = load_model_config(dir);
  if (auto g = w.config.raw.find(kGGUFSourceKey); g != w.config.raw.end() && g->is_string())
    return load_gguf_weights(w.config, g->get<std::string>(), base, notes);  // a GGUF --model (hub/gguf_source.h)
  const ModelConfig& cfg = w.config;
  SafetensorsReader reader = SafetensorsReader::open_model(dir);
  const std::function<std::string(const std::string&)> stored = stored_names(reader, cfg);
  w.layers.resize(static_cast<size_t>(cfg.num_layers));
  for (const auto& [role, layer] : model_roles(cfg)) {
    if (const FusedProjection* f = fused_projection_of(cfg, role)) {
      if (role == f->first) load_fused(reader, w, *f, layer, base, notes);
      continue;
    }
    if (is_expert_role(role)) {
      load_experts(reader, w, role, layer, base, notes);
      continue;
    }
    const std::string name = stored(moe_aware_name(cfg, role, layer));
    if (!reader.contains(name)) {
      std::string why = fmt::format("{} with {} layers needs it", cfg.architecture_name, cfg.num_layers);
      if (role == WeightRole::LmHead) why += " (tie_word_embeddings is false)";
      if (is_bias(role)) why += " (attention_bias / Qwen2 q/k/v bias)";
      if (role == WeightRole::Router) why += fmt::format(" (the router of layer {}'s experts)", layer);
      fail(fmt::format("{}: tensor '{}' is missing; {}", reader.file_of(name), name, why));
    }
    Tensor& t = weight_ref(w, role, layer);
    if (base && *base != DType::F32 && role_is_held(role)) {
      // Quantized straight from the mapped file, one tensor at a time, and its file pages dropped
      // after: loading never holds the model (nor one weight) in f32.
      const Tensor view = reader.borrow(name);
      if (view.shape() != role_shape(cfg, role)) reader.read(name, role_shape(cfg, role));  // throws, naming both
      t = view;
      hold_role(t, role, *base, notes);
      if (t.raw() == view.raw()) t = view.clone();  // already the held type: a copy of our own
      reader.release(name);
    } else {
      t = reader.read(name, role_shape(cfg, role));
    }
  }
  // torch_dtype decides the dtype of merged exports; take the stored one when config.json is silent.
  if (!cfg.raw.contains("torch_dtype") && !cfg.raw.contains("dtype")) {
    const SafetensorsEntry& e = reader.entry(stored(hf_name(WeightRole::Embed)));
    if (e.dtype && *e.dtype != DType::I32) w.config.torch_dtype = *e.dtype;
  }
  return w;  // auto (nullopt) keeps a safetensors base at f32
}

ModelWeights init_random_weights(const ModelConfig& cfg, uint64_t seed) {
  float std_dev = 0.02f;
  if (cfg.raw.is_object())
    if (auto it = cfg.raw.find("initializer_range"); it != cfg.raw.end() && it->is_number()) std_dev = it->get<float>();
  ModelWeights w;
  w.config = cfg;
  w.layers.resize(static_cast<size_t>(cfg.num_layers));
  for (const auto& [role, layer] : model_roles(cfg)) {
    Tensor t = Tensor::empty(role_shape(cfg, role));
    if (is_norm_role(role)) {
      t.fill(1.0f - cfg.norm_weight_offset);  // a norm that starts as the identity (Gemma's (1 + w): w = 0)
    } else if (is_bias(role)) {
      t.zero();
    } else {
      const uint64_t stream = static_cast<uint64_t>(role) * 1000003ull + static_cast<uint64_t>(layer + 1);
      fill_normal(t, std_dev, seed * 0x9e3779b97f4a7c15ull + stream * 0xd1b54a32d192ed03ull);
    }
    weight_ref(w, role, layer) = std::move(t);
  }
  return w;
}

}  // namespace bp
