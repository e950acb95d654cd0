// PEFT adapter save/load (see peft.h).
#include "model/peft.h"

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string_view>

#include "core/error.h"
#include "core/file_read.h"
#include "io/safetensors.h"
#include "model/weight_names.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

// An adapter that cannot be read: the code of a model that cannot be loaded, with advice for an
// adapter (the catalog's default suggestion is about model folders).
[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, fmt::format("[peft] {}: {}", where, what))
      .with_suggestion(
          "Pass a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors, as `backprop train` "
          "writes in <run>/adapter or PEFT's save_pretrained), trained for this base model (--model).");
}

// Numbers as PEFT writes them: integral values as integers (lora_alpha 16), others shortest.
nlohmann::json number_json(float v) {
  if (std::floor(v) == v && std::fabs(v) < 1e9f) return static_cast<int64_t>(v);
  return std::stod(fmt::format("{}", v));
}

constexpr const char* kWeightsFile = "adapter_model.safetensors";
// PEFT's DoRA magnitude, saved without its module's ".weight" (PEFT's get_peft_model_state_dict).
constexpr std::string_view kMagnitudeSuffix = ".lora_magnitude_vector";

// A fused module's (PEFT's qkv_proj / gate_up_proj, `fused`) is the module's, over all its rows.
std::string peft_magnitude_name(int64_t layer, LoraTarget t, bool fused) {
  const std::string a = peft_lora_name(layer, t, true, fused);  // "<module>.lora_A.weight"
  return a.substr(0, a.size() - std::string_view(".lora_A.weight").size()) + std::string(kMagnitudeSuffix);
}
constexpr const char* kConfigFile = "adapter_config.json";

// A Mixture-of-Experts expert's PEFT tensor name (peft_expert_module + .lora_A/.lora_B.weight) back
// to (layer, expert, projection); nullopt for any other name.
struct ExpertName {
  int64_t layer, expert;
  int p;
};
std::optional<ExpertName> parse_expert_name(const std::string& name, const ModelConfig& cfg) {
  const bool mixtral = cfg.arch == Arch::Mixtral;
  constexpr std::string_view kPrefix = "base_model.model.model.layers.";
  if (!name.starts_with(kPrefix)) return std::nullopt;
  size_t at = kPrefix.size();
  auto number = [&](int64_t& v) {
    const char* b = name.data() + at;
    auto [ptr, ec] = std::from_chars(b, name.data() + name.size(), v);
    if (ec != std::errc() || ptr == b) return false;
    at += static_cast<size_t>(ptr - b);
    return true;
  };
  ExpertName en{};
  const std::string mid = fmt::format(".{}.experts.", mixtral ? "block_sparse_moe" : "mlp");
  if (!number(en.layer) || name.compare(at, mid.size(), mid) != 0) return std::nullopt;
  at += mid.size();
  if (!number(en.expert)) return std::nullopt;
  for (int p = 0; p < 3; ++p) {
    const std::string module = peft_expert_module(mixtral, en.layer, en.expert, p);
    if (name == module + ".lora_A.weight" || name == module + ".lora_B.weight" ||
        name == module + std::string(kMagnitudeSuffix)) {
      if (en.layer >= cfg.num_layers || !cfg.is_moe_layer(en.layer) || en.expert >= cfg.num_experts)
        return std::nullopt;
      en.p = p;
      return en;
    }
  }
  return std::nullopt;
}

// A Mixture-of-Experts router's PEFT tensor name (peft_router_module + .lora_A/.lora_B.weight) to
// its layer; nullopt for any other name (a dense layer's "mlp.gate" included: it has no router).
std::optional<int64_t> parse_router_name(const std::string& name, const ModelConfig& cfg) {
  constexpr std::string_view kPrefix = "base_model.model.model.layers.";
  if (!name.starts_with(kPrefix)) return std::nullopt;
  int64_t layer = -1;
  const char* b = name.data() + kPrefix.size();
  auto [ptr, ec] = std::from_chars(b, name.data() + name.size(), layer);
  if (ec != std::errc() || ptr == b || layer >= cfg.num_layers || !cfg.is_moe_layer(layer)) return std::nullopt;
  const std::string module = peft_router_module(cfg.arch == Arch::Mixtral, layer);
  if (name != module + ".lora_A.weight" && name != module + ".lora_B.weight") return std::nullopt;
  return layer;
}

LoraConfig parse_adapter_config(const std::string& path) {
  if (!std::filesystem::exists(path)) fail(path, "cannot open the file; a PEFT adapter folder has adapter_config.json");
  const nlohmann::json j = read_json_file_capped(path, FileKind::Config, {"peft", ErrorCode::DEP_MODEL_LOAD_FAILED});
  if (j.is_discarded() || !j.is_object()) fail(path, "not a valid JSON object");
  auto str = [&](const char* k, const std::string& def) {
    auto it = j.find(k);
    return (it == j.end() || it->is_null()) ? def : (it->is_string() ? it->get<std::string>() : std::string("?"));
  };
  if (str("peft_type", "LORA") != "LORA")
    fail(path, fmt::format("peft_type '{}' is not supported (only LORA)", str("peft_type", "")));
  if (str("bias", "none") != "none")
    fail(path, fmt::format("bias '{}' is not supported (only \"none\")", str("bias", "")));
  if (j.contains("fan_in_fan_out") && j["fan_in_fan_out"].is_boolean() && j["fan_in_fan_out"].get<bool>())
    fail(path, "fan_in_fan_out = true is not supported");
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    if (j.contains(k) && j[k].is_object() && !j[k].empty())
      fail(path, fmt::format("{} (per-module ranks or alphas) is not supported", k));
  if (j.contains("modules_to_save") && j["modules_to_save"].is_array() && !j["modules_to_save"].empty())
    fail(path, "modules_to_save (fully trained extra modules) is not supported");

  LoraConfig c;
  if (!j.contains("r") || !j["r"].is_number_integer()) fail(path, "field 'r' is missing or not an integer");
  c.r = j["r"].get<int64_t>();
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number())
    fail(path, "field 'lora_alpha' is missing or not a number");
  // Range-check as double before narrowing: a float cannot hold every JSON number.
  const double alpha = j["lora_alpha"].get<double>();
  const double dropout =
      (j.contains("lora_dropout") && j["lora_dropout"].is_number()) ? j["lora_dropout"].get<double>() : 0.0;
  if (!(alpha > 0 && alpha < 1e30) || !(dropout >= 0 && dropout < 1) || c.r < 1 || c.r > (int64_t{1} << 22))
    fail(path, fmt::format("r = {}, lora_alpha = {}, lora_dropout = {} are out of range", c.r, alpha, dropout));
  c.alpha = static_cast<float>(alpha);
  c.dropout = static_cast<float>(dropout);
  if (j.contains("use_rslora") && j["use_rslora"].is_boolean()) c.use_rslora = j["use_rslora"].get<bool>();
  if (j.contains("use_dora") && j["use_dora"].is_boolean()) c.use_dora = j["use_dora"].get<bool>();
  // An unconverted PiSSA (or OLoRA, CorDA, ...) adapter is relative to a base PEFT changes on load.
  if (auto it = j.find("init_lora_weights"); it != j.end() && it->is_string() && it->get<std::string>() != "gaussian")
    fail(path, fmt::format("init_lora_weights '{}': the adapter was saved against a base its initialisation "
                           "changed; save it with PEFT's path_initial_model_for_weight_conversion (PiSSA to LoRA)",
                           it->get<std::string>()));
  return c;
}

// target_modules as PEFT reads it: the module names, or on the text model of a multimodal
// checkpoint a regular expression (PEFT full-matches a string against each module's path, as
// Unsloth writes for vision models) that keeps PEFT off the vision tower's projections of the same names.
nlohmann::json target_modules_json(const LoraConfig& c) {
  const std::vector<std::string> names = c.resolved_targets();
  if (!c.multimodal_text) return names;
  return fmt::format(R"(.*language_model.*\.layers\.\d+\.(?:self_attn|mlp)\.(?:{}))", fmt::join(names, "|"));
}

}  // namespace

nlohmann::json peft_adapter_config(const LoraAdapter& a) {
  const LoraConfig& c = a.config;
  nlohmann::json base =
      a.base_model_name_or_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.base_model_name_or_path);
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", base},
          {"r", c.r},
          {"lora_alpha", number_json(c.alpha)},
          {"lora_dropout", number_json(c.dropout)},
          {"target_modules", target_modules_json(c)},
          {"bias", "none"},
          {"use_rslora", c.use_rslora},
          {"use_dora", c.use_dora},
          {"fan_in_fan_out", false},
          {"init_lora_weights", true},
          {"inference_mode", true},
          {"modules_to_save", nullptr},
          {"layers_to_transform", nullptr},
          {"layers_pattern", nullptr},
          {"rank_pattern", nlohmann::json::object()},
          {"alpha_pattern", nlohmann::json::object()},
          {"revision", nullptr}};
}

std::vector<std::string> save_peft_adapter(const LoraAdapter& adapter, const std::string& dir) {
  const LoraAdapter converted = pissa_to_lora(adapter);  // PiSSA: the rank-2r LoRA for the original base
  const LoraAdapter& a = adapter.config.pissa() ? converted : adapter;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error(ErrorCode::RUNTIME_EXPORT_FAILED, fmt::format("[peft] cannot create folder {}: {}", dir, ec.message()));
  // The text model of a multimodal checkpoint: the names PEFT gives on the multimodal model.
  auto named = [&](const std::string& n) { return a.config.multimodal_text ? multimodal_peft_name(n) : n; };
  NamedTensors ts;
  for (size_t li = 0; li < a.layers.size(); ++li) {
    const LoraLayer& l = a.layers[li];
    for (LoraTarget t : kAllLoraTargets) {
      if (!l.has(t)) continue;
      BP_CHECK(l.a(t).rank() == 2 && l.b(t).rank() == 2 && l.a(t).dim(0) == a.config.r && l.b(t).dim(1) == a.config.r,
               "[peft] layer {} {}: A {} / B {} do not match r = {}", li, lora_target_name(t), l.a(t).describe(),
               l.b(t).describe(), a.config.r);
      const LoraFusedModule* f = a.config.fused ? lora_fused_module_of(t) : nullptr;
      if (f && f->first != t) continue;  // written with the module's first member
      Tensor B = l.b(t);
      if (f) {  // PEFT's fused module: the shared A, and B [Σout, r] of the members' rows
        std::vector<const Tensor*> bs;
        for (int i = 0; i < f->count; ++i) bs.push_back(&l.b(static_cast<LoraTarget>(static_cast<int>(t) + i)));
        B = join_rows_or_copy(bs);
      }
      ts.emplace_back(named(peft_lora_name(static_cast<int64_t>(li), t, true, f != nullptr)), l.a(t));
      ts.emplace_back(named(peft_lora_name(static_cast<int64_t>(li), t, false, f != nullptr)), B);
      if (a.config.use_dora) {
        const Tensor M = f ? fused_rows_of(l.M, *f) : l.m(t);  // a fused module's: over all its rows
        BP_CHECK(M.defined() && M.shape() == Shape{B.dim(0)},
                 "[peft] layer {} {}: a DoRA adapter without its magnitude [{}]", li, lora_target_name(t), B.dim(0));
        const auto layer = static_cast<int64_t>(li);
        ts.emplace_back(named(peft_magnitude_name(layer, t, f != nullptr)), M);
      }
    }
  }
  // Mixture-of-Experts: each expert's A and B under its PEFT module name (slabs of the stacked tensors).
  for (size_t li = 0; li < a.layers.size(); ++li)
    for (int p = 0; p < 3; ++p) {
      const Tensor& A = a.layers[li].expert_A[static_cast<size_t>(p)];
      const Tensor& B = a.layers[li].expert_B[static_cast<size_t>(p)];
      if (!A.defined()) continue;
      for (int64_t e = 0; e < A.dim(0); ++e) {
        const std::string module = peft_expert_module(a.config.mixtral, static_cast<int64_t>(li), e, p);
        ts.emplace_back(module + ".lora_A.weight", expert_matrix(A, e));
        ts.emplace_back(module + ".lora_B.weight", expert_matrix(B, e));
        if (a.config.use_dora) {  // DoRA: expert e's magnitude, row e of the stacked [E, out]
          const Tensor& M = a.layers[li].expert_M[static_cast<size_t>(p)];
          BP_CHECK(M.defined() && M.shape() == (Shape{B.dim(0), B.dim(1)}),
                   "[peft] layer {} experts: a DoRA adapter without their magnitudes [{}, {}]", li, B.dim(0), B.dim(1));
          ts.emplace_back(module + std::string(kMagnitudeSuffix), M.rows(e, e + 1).reshape({B.dim(1)}));
        }
      }
    }
  for (size_t li = 0; li < a.layers.size(); ++li)  // the routers' A [r, D] and B [E, r]
    if (a.layers[li].router_A.defined()) {
      const std::string module = peft_router_module(a.config.mixtral, static_cast<int64_t>(li));
      ts.emplace_back(module + ".lora_A.weight", a.layers[li].router_A);
      ts.emplace_back(module + ".lora_B.weight", a.layers[li].router_B);
    }
  write_safetensors((fs::path(dir) / kWeightsFile).string(), ts);
  write_file_atomic((fs::path(dir) / kConfigFile).string(), peft_adapter_config(a).dump(2) + "\n");
  return {kWeightsFile, kConfigFile};
}

LoraAdapter load_peft_adapter(const std::string& dir, const ModelConfig& cfg) {
  if (!fs::is_directory(dir)) fail(dir, "adapter folder does not exist");
  const std::string config_path = (fs::path(dir) / kConfigFile).string();
  const std::string weights_path = (fs::path(dir) / kWeightsFile).string();
  LoraAdapter ad;
  ad.config = parse_adapter_config(config_path);
  {
    const nlohmann::json j =
        read_json_file_capped(config_path, FileKind::Config, {"peft", ErrorCode::DEP_MODEL_LOAD_FAILED});
    if (j.is_object())
      if (auto it = j.find("base_model_name_or_path"); it != j.end() && it->is_string())
        ad.base_model_name_or_path = it->get<std::string>();
  }
  if (!fs::exists(weights_path)) {
    if (fs::exists(fs::path(dir) / "adapter_model.bin"))
      fail(dir, "only adapter_model.safetensors is supported; adapter_model.bin (pickle) is not read");
    fail(weights_path, "file does not exist");
  }
  SafetensorsReader reader = SafetensorsReader::open_file(weights_path);
  const int64_t r = ad.config.r;
  ad.config.fused = cfg.fused_projections();
  ad.config.multimodal_text = cfg.multimodal_text;
  ad.config.mixtral = cfg.arch == Arch::Mixtral;
  ad.config.moe = cfg.is_moe();
  ad.layers.resize(static_cast<size_t>(cfg.num_layers));
  // Mixture-of-Experts: which experts' A and B were read, per (layer, projection).
  std::map<std::pair<int64_t, int>, std::vector<uint8_t>> expert_seen;
  for (const std::string& stored : reader.names()) {
    // A multimodal checkpoint's text model: PEFT's names on it (either transformers layout) as the text model's.
    const std::string name = cfg.multimodal_text ? text_peft_name(stored) : stored;
    const bool is_a = name.ends_with(".lora_A.weight"), is_b = name.ends_with(".lora_B.weight");
    const bool is_mag = name.ends_with(kMagnitudeSuffix);
    if (const std::optional<ExpertName> en =
            cfg.is_moe() && (is_a || is_b || is_mag) ? parse_expert_name(name, cfg) : std::nullopt) {
      const int64_t E = cfg.num_experts, Fe = cfg.moe_intermediate_size, D = cfg.hidden_size;
      const int64_t in = en->p == 2 ? Fe : D, out = en->p == 2 ? D : Fe;
      const Shape want = is_mag ? Shape{out} : is_a ? Shape{r, in} : Shape{out, r};
      if (reader.entry(stored).shape != want.vec())
        fail(weights_path,
             fmt::format("tensor '{}' has shape [{}] but {}'s experts (r = {}) need {}", name,
                         fmt::join(reader.entry(stored).shape, ", "), cfg.architecture_name, r, want.str()));
      if (is_mag && !ad.config.use_dora)
        fail(weights_path,
             fmt::format("tensor '{}' is a DoRA magnitude but adapter_config.json has no use_dora = true", name));
      LoraLayer& l = ad.layers[static_cast<size_t>(en->layer)];
      const auto pi = static_cast<size_t>(en->p);
      Tensor& stacked = is_mag ? l.expert_M[pi] : (is_a ? l.expert_A : l.expert_B)[pi];
      if (!stacked.defined())
        stacked = Tensor::zeros(is_mag ? Shape{E, out} : is_a ? Shape{E, r, in} : Shape{E, out, r});
      Tensor slab =
          is_mag ? stacked.rows(en->expert, en->expert + 1).reshape({out}) : expert_matrix(stacked, en->expert);
      slab.copy_from(reader.read(stored, want));
      auto& seen_e = expert_seen[{en->layer, en->p}];
      seen_e.resize(static_cast<size_t>(3 * E), 0);
      seen_e[static_cast<size_t>(3 * en->expert + (is_mag ? 2 : is_a ? 0 : 1))] = 1;
      continue;
    }
    if (const std::optional<int64_t> rl =
            cfg.is_moe() && (is_a || is_b) ? parse_router_name(name, cfg) : std::nullopt) {
      const Shape want = is_a ? Shape{r, cfg.hidden_size} : Shape{cfg.num_experts, r};
      if (reader.entry(stored).shape != want.vec())
        fail(weights_path,
             fmt::format("tensor '{}' has shape [{}] but {}'s router (r = {}) needs {}", name,
                         fmt::join(reader.entry(stored).shape, ", "), cfg.architecture_name, r, want.str()));
      LoraLayer& l = ad.layers[static_cast<size_t>(*rl)];
      (is_a ? l.router_A : l.router_B) = reader.read(stored, want);
      continue;
    }
    const bool is_m = name.ends_with(kMagnitudeSuffix);
    std::optional<std::pair<WeightRole, int64_t>> parsed;
    std::optional<std::pair<LoraTarget, int64_t>> fused;
    if (is_a || is_b || is_m) {
      const std::string_view module =
          std::string_view(name).substr(0, name.size() - (is_m ? kMagnitudeSuffix.size() : 14));
      parsed = parse_peft_module_name(module);
      if (ad.config.fused) fused = parse_peft_fused_module_name(module);
    }
    std::optional<LoraTarget> target;
    if (parsed)  // on a fused model q_proj etc. do not exist: only the fused modules' names
      for (LoraTarget t : kAllLoraTargets)
        if (lora_target_role(t) == parsed->first && !(ad.config.fused && lora_fused_module_of(t))) target = t;
    if (fused) {
      target = fused->first;
      parsed = std::pair{lora_target_role(fused->first), fused->second};
    }
    if (!target)
      fail(weights_path,
           fmt::format("tensor '{}' is not a lora_A/lora_B weight or DoRA magnitude of {} (other PEFT modules are "
                       "not supported)",
                       name,
                       ad.config.fused ? "qkv_proj/o_proj/gate_up_proj/down_proj on " + cfg.architecture_name
                                       : std::string("q/k/v/o/gate/up/down_proj")));
    if (is_m && !ad.config.use_dora)
      fail(weights_path,
           fmt::format("tensor '{}' is a DoRA magnitude but adapter_config.json has no use_dora = true", name));
    const int64_t layer = parsed->second;
    if (layer >= cfg.num_layers)
      fail(weights_path, fmt::format("tensor '{}' is for layer {} but the model has {} layers: the adapter was "
                                     "trained for a different base model",
                                     name, layer, cfg.num_layers));
    const LoraFusedModule* f = fused ? lora_fused_module_of(*target) : nullptr;
    int64_t out = lora_target_out(cfg, *target);
    if (f)
      for (int i = 1; i < f->count; ++i)
        out += lora_target_out(cfg, static_cast<LoraTarget>(static_cast<int>(*target) + i));
    const Shape want = is_m ? Shape{out} : is_a ? Shape{r, lora_target_in(cfg, *target)} : Shape{out, r};
    const std::vector<int64_t>& got = reader.entry(stored).shape;
    if (got != want.vec())
      fail(weights_path,
           fmt::format("tensor '{}' has shape [{}] but {} (hidden_size {}, r = {}) needs {}: the "
                       "adapter does not fit this base model",
                       name, fmt::join(got, ", "), cfg.architecture_name, cfg.hidden_size, r, want.str()));
    LoraLayer& l = ad.layers[static_cast<size_t>(layer)];
    const Tensor t = reader.read(stored, want);
    if (!f) {
      (is_m ? l.m(*target) : is_a ? l.a(*target) : l.b(*target)) = t;
      continue;
    }
    // A fused module: the members share A, their B (and DoRA magnitude) are its rows.
    std::array<int64_t, 3> rows{};
    for (int i = 0; i < f->count; ++i)
      rows[static_cast<size_t>(i)] = lora_target_out(cfg, static_cast<LoraTarget>(static_cast<int>(*target) + i));
    if (is_a)
      for (int i = 0; i < f->count; ++i) l.a(static_cast<LoraTarget>(static_cast<int>(*target) + i)) = t;
    else
      split_fused_rows(is_m ? l.M : l.B, *f, t, rows);
  }
  // Every adapted projection needs both halves; targets are the projections found.
  std::vector<bool> seen(kNumLoraTargets, false);
  for (size_t li = 0; li < ad.layers.size(); ++li) {
    LoraLayer& l = ad.layers[li];
    for (LoraTarget t : kAllLoraTargets) {
      const bool a = l.a(t).defined(), b = l.b(t).defined();
      const std::string magnitude_name =
          peft_magnitude_name(static_cast<int64_t>(li), t, ad.config.fused && lora_fused_module_of(t));
      if (a != b)
        fail(weights_path,
             fmt::format("tensor '{}' is missing (its {} is present)",
                         peft_lora_name(static_cast<int64_t>(li), t, !a, ad.config.fused), a ? "lora_A" : "lora_B"));
      if (a && ad.config.use_dora && !l.m(t).defined())
        fail(weights_path, fmt::format("tensor '{}' is missing (use_dora = true)", magnitude_name));
      if (!a && l.m(t).defined())
        fail(weights_path, fmt::format("tensor '{}' has no lora_A/lora_B beside it", magnitude_name));
      l.enabled[static_cast<size_t>(t)] = a;
      if (a) seen[static_cast<size_t>(t)] = true;
    }
  }
  for (const auto& [key, seen_e] : expert_seen)  // every expert of an adapted projection: A, B (DoRA: M)
    for (size_t i = 0; i < seen_e.size(); ++i)
      if (!seen_e[i] && (i % 3 != 2 || ad.config.use_dora))
        fail(weights_path,
             fmt::format("tensor '{}' is missing (an adapted expert projection needs every expert's "
                         "lora_A and lora_B{})",
                         peft_expert_module(ad.config.mixtral, key.first, static_cast<int64_t>(i / 3), key.second) +
                             (i % 3 == 2   ? std::string(kMagnitudeSuffix)
                              : i % 3 == 1 ? std::string(".lora_B.weight")
                                           : std::string(".lora_A.weight")),
                         ad.config.use_dora ? " and, with use_dora, its lora_magnitude_vector" : ""));
  for (const auto& [key, seen_e] : expert_seen)
    seen[static_cast<size_t>(LoraTarget::Gate) + static_cast<size_t>(key.second)] = true;
  bool router = false;
  for (size_t li = 0; li < ad.layers.size(); ++li) {  // a router needs both halves
    const LoraLayer& l = ad.layers[li];
    if (l.router_A.defined() != l.router_B.defined())
      fail(weights_path, fmt::format("tensor '{}' is missing (its {} is present)",
                                     peft_router_module(ad.config.mixtral, static_cast<int64_t>(li)) +
                                         (l.router_A.defined() ? ".lora_B.weight" : ".lora_A.weight"),
                                     l.router_A.defined() ? "lora_A" : "lora_B"));
    router = router || l.router_A.defined();
  }
  if (router && ad.config.use_dora)
    fail(weights_path, "DoRA on a Mixture-of-Experts router is not supported (its lora_magnitude_vector)");
  ad.config.target_modules.clear();
  for (LoraTarget t : kAllLoraTargets)
    if (seen[static_cast<size_t>(t)]) ad.config.target_modules.emplace_back(lora_target_name(t));
  if (router) ad.config.target_modules.emplace_back(kLoraRouterTarget);
  ad.config.target_modules = ad.config.resolved_targets();  // the fused modules' names on a fused model
  if (ad.config.target_modules.empty()) fail(weights_path, "the adapter holds no LoRA weights");
  return ad;
}

}  // namespace bp
