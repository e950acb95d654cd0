// LoRA adapter structure and PEFT initialisation (see lora.h).
#include "model/lora.h"

#include <cmath>

#include "core/error.h"
#include "model/weight_names.h"

namespace bp {

namespace {

constexpr std::array<const char*, kNumLoraTargets> kTargetNames = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                                   "gate_proj", "up_proj", "down_proj"};

// splitmix64: a tiny, portable generator, so initial values do not depend on the standard
// library's distribution implementations.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double uniform01(uint64_t& state) {
  return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
}

std::string known_targets() {
  std::string s;
  for (const char* n : kTargetNames) s += fmt::format("{}, ", n);
  for (const LoraFusedModule& m : kLoraFusedModules) s += fmt::format("{}, ", m.name);
  return s + "all-linear";
}

const LoraFusedModule* fused_module_named(std::string_view name) {
  for (const LoraFusedModule& m : kLoraFusedModules)
    if (name == m.name) return &m;
  return nullptr;
}

}  // namespace

const LoraFusedModule* lora_fused_module_of(LoraTarget t) {
  for (const LoraFusedModule& m : kLoraFusedModules)
    if (m.contains(t)) return &m;
  return nullptr;
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.kernel_raw() == b.kernel_raw() && a.shape() == b.shape() &&
         a.dtype() == b.dtype() && a.device() == b.device();
}

const char* lora_target_name(LoraTarget t) {
  return kTargetNames[static_cast<size_t>(t)];
}

std::optional<LoraTarget> parse_lora_target(std::string_view name) {
  for (LoraTarget t : kAllLoraTargets)
    if (name == lora_target_name(t)) return t;
  return std::nullopt;
}

int64_t lora_target_out(const ModelConfig& cfg, LoraTarget t) {
  switch (t) {
    case LoraTarget::Q: return cfg.q_dim();
    case LoraTarget::K:
    case LoraTarget::V: return cfg.kv_dim();
    case LoraTarget::O: return cfg.hidden_size;
    case LoraTarget::Gate:
    case LoraTarget::Up: return cfg.intermediate_size;
    case LoraTarget::Down: return cfg.hidden_size;
  }
  return 0;
}

int64_t lora_target_in(const ModelConfig& cfg, LoraTarget t) {
  switch (t) {
    case LoraTarget::Q:
    case LoraTarget::K:
    case LoraTarget::V: return cfg.hidden_size;
    case LoraTarget::O: return cfg.q_dim();
    case LoraTarget::Gate:
    case LoraTarget::Up: return cfg.hidden_size;
    case LoraTarget::Down: return cfg.intermediate_size;
  }
  return 0;
}

float LoraConfig::scale() const {
  const double rr = static_cast<double>(r);
  return static_cast<float>(use_rslora ? alpha / std::sqrt(rr) : alpha / rr);
}

bool LoraConfig::targets(LoraTarget t) const {
  for (const std::string& m : target_modules) {
    if (m == "all-linear" || m == lora_target_name(t)) return true;
    if (const LoraFusedModule* f = fused_module_named(m); f && f->contains(t)) return true;
  }
  return false;
}

std::vector<std::string> LoraConfig::resolved_targets() const {
  std::vector<std::string> out;
  for (LoraTarget t : kAllLoraTargets) {
    if (!targets(t)) continue;
    const LoraFusedModule* f = fused ? lora_fused_module_of(t) : nullptr;
    if (!f) {
      out.emplace_back(lora_target_name(t));
    } else if (f->first == t) {
      out.emplace_back(f->name);
    }
  }
  return out;
}

void LoraConfig::validate() const {
  if (r < 1) throw Error(ErrorCode::CONFIG_INVALID_SETTING, fmt::format("[lora] r must be >= 1, got {}", r));
  if (!(alpha > 0.0f))
    throw Error(ErrorCode::CONFIG_INVALID_SETTING, fmt::format("[lora] alpha must be > 0, got {}", alpha));
  if (!(dropout >= 0.0f && dropout < 1.0f))
    throw Error(ErrorCode::CONFIG_INVALID_SETTING, fmt::format("[lora] dropout must be in [0, 1), got {}", dropout));
  if (target_modules.empty())
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[lora] target_modules is empty; use some of: {}", known_targets()));
  for (const std::string& m : target_modules)
    if (m != "all-linear" && !parse_lora_target(m) && !fused_module_named(m))
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  fmt::format("[lora] unknown target module '{}'; known: {}", m, known_targets()));
}

void LoraConfig::validate_for(const ModelConfig& cfg) const {
  validate();
  const bool model_fused = cfg.fused_projections();
  for (const std::string& m : target_modules) {
    const std::optional<LoraTarget> t = parse_lora_target(m);
    if (model_fused && t && lora_fused_module_of(*t))
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  fmt::format("[lora] target module '{}' does not exist in {}: it stores q/k/v as one qkv_proj and "
                              "gate/up as one gate_up_proj (PEFT's target names there: qkv_proj, o_proj, "
                              "gate_up_proj, down_proj, or all-linear)",
                              m, cfg.architecture_name))
          .with_suggestion(fmt::format("--target-modules {}", lora_fused_module_of(*t)->name));
    if (!model_fused && fused_module_named(m))
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  fmt::format("[lora] target module '{}' is Phi-3's fused projection; {} has separate ones (q_proj, "
                              "k_proj, v_proj / gate_proj, up_proj)",
                              m, cfg.architecture_name));
  }
}

int64_t LoraAdapter::num_parameters() const {
  int64_t n = 0;
  for (const LoraLayer& l : layers)
    for (LoraTarget t : kAllLoraTargets) {
      if (!l.has(t)) continue;
      const LoraFusedModule* f = config.fused ? lora_fused_module_of(t) : nullptr;
      const bool shared_a = f && f->first != t && same_tensor(l.a(t), l.a(f->first));
      n += (shared_a ? 0 : l.a(t).numel()) + l.b(t).numel();
    }
  return n;
}

LoraAdapter init_lora(const ModelConfig& cfg, const LoraConfig& lora, uint64_t seed) {
  lora.validate_for(cfg);
  LoraAdapter ad;
  ad.config = lora;
  ad.config.fused = cfg.fused_projections();
  ad.layers.resize(static_cast<size_t>(cfg.num_layers));
  for (int64_t li = 0; li < cfg.num_layers; ++li) {
    LoraLayer& layer = ad.layers[static_cast<size_t>(li)];
    for (LoraTarget t : kAllLoraTargets) {
      if (!lora.targets(t)) continue;
      const LoraFusedModule* f = ad.config.fused ? lora_fused_module_of(t) : nullptr;
      layer.enabled[static_cast<size_t>(t)] = true;
      if (f && f->first != t) continue;  // made with the module's first member
      const int64_t in = lora_target_in(cfg, t);
      // torch.nn.init.kaiming_uniform_(a=sqrt(5)): gain = sqrt(2/(1+5)), bound = gain·sqrt(3/in) = 1/sqrt(in).
      const double bound = 1.0 / std::sqrt(static_cast<double>(in));
      Tensor A = Tensor::empty({lora.r, in});
      uint64_t state =
          seed ^ (0x5851f42d4c957f2dull * static_cast<uint64_t>(li * kNumLoraTargets + static_cast<int>(t) + 1));
      splitmix64(state);
      float* a = A.data<float>();
      for (int64_t i = 0; i < A.numel(); ++i) a[i] = static_cast<float>((2.0 * uniform01(state) - 1.0) * bound);
      if (!f) {
        layer.a(t) = std::move(A);
        layer.b(t) = Tensor::zeros({lora_target_out(cfg, t), lora.r});
        continue;
      }
      // A fused module: one A, one B [Σout, r]; the members' B are its rows.
      int64_t rows = 0;
      for (int i = 0; i < f->count; ++i) rows += lora_target_out(cfg, static_cast<LoraTarget>(static_cast<int>(t) + i));
      const Tensor B = Tensor::zeros({rows, lora.r});
      int64_t at = 0;
      for (int i = 0; i < f->count; ++i) {
        const auto m = static_cast<LoraTarget>(static_cast<int>(t) + i);
        const int64_t out = lora_target_out(cfg, m);
        layer.a(m) = A;
        layer.b(m) = B.rows(at, at + out);
        at += out;
      }
    }
  }
  return ad;
}

void copy_adapter_tensors(LoraAdapter& adapter, const std::function<Tensor(const Tensor&)>& copy) {
  for (LoraLayer& layer : adapter.layers)
    for (LoraTarget t : kAllLoraTargets) {
      if (!layer.has(t)) continue;
      const LoraFusedModule* f = adapter.config.fused ? lora_fused_module_of(t) : nullptr;
      if (!f) {
        layer.a(t) = copy(layer.a(t));
        layer.b(t) = copy(layer.b(t));
        continue;
      }
      if (f->first != t) continue;  // copied with the module's first member
      std::vector<const Tensor*> bs;
      for (int i = 0; i < f->count; ++i) bs.push_back(&layer.b(static_cast<LoraTarget>(static_cast<int>(t) + i)));
      const Tensor A = copy(layer.a(t));
      const Tensor B = copy(join_rows_or_copy(bs));
      int64_t at = 0;
      for (int i = 0; i < f->count; ++i) {
        const auto m = static_cast<LoraTarget>(static_cast<int>(t) + i);
        const int64_t out = layer.b(m).dim(0);
        layer.a(m) = A;
        layer.b(m) = B.rows(at, at + out);
        at += out;
      }
    }
}

}  // namespace bp
