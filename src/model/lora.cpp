// LoRA adapter structure and PEFT initialisation (see lora.h).
#include "model/lora.h"

#include <cmath>

#include "core/error.h"

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
  return s + "all-linear";
}

}  // namespace

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
  for (const std::string& m : target_modules)
    if (m == "all-linear" || m == lora_target_name(t)) return true;
  return false;
}

std::vector<std::string> LoraConfig::resolved_targets() const {
  std::vector<std::string> out;
  for (LoraTarget t : kAllLoraTargets)
    if (targets(t)) out.emplace_back(lora_target_name(t));
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
    if (m != "all-linear" && !parse_lora_target(m))
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  fmt::format("[lora] unknown target module '{}'; known: {}", m, known_targets()));
}

int64_t LoraAdapter::num_parameters() const {
  int64_t n = 0;
  for (const LoraLayer& l : layers)
    for (LoraTarget t : kAllLoraTargets)
      if (l.has(t)) n += l.a(t).numel() + l.b(t).numel();
  return n;
}

LoraAdapter init_lora(const ModelConfig& cfg, const LoraConfig& lora, uint64_t seed) {
  lora.validate();
  LoraAdapter ad;
  ad.config = lora;
  ad.layers.resize(static_cast<size_t>(cfg.num_layers));
  for (int64_t li = 0; li < cfg.num_layers; ++li) {
    LoraLayer& layer = ad.layers[static_cast<size_t>(li)];
    for (LoraTarget t : kAllLoraTargets) {
      if (!lora.targets(t)) continue;
      const int64_t in = lora_target_in(cfg, t), out = lora_target_out(cfg, t);
      // torch.nn.init.kaiming_uniform_(a=sqrt(5)): gain = sqrt(2/(1+5)), bound = gain·sqrt(3/in) = 1/sqrt(in).
      const double bound = 1.0 / std::sqrt(static_cast<double>(in));
      Tensor A = Tensor::empty({lora.r, in});
      uint64_t state =
          seed ^ (0x5851f42d4c957f2dull * static_cast<uint64_t>(li * kNumLoraTargets + static_cast<int>(t) + 1));
      splitmix64(state);
      float* a = A.data<float>();
      for (int64_t i = 0; i < A.numel(); ++i) a[i] = static_cast<float>((2.0 * uniform01(state) - 1.0) * bound);
      layer.a(t) = std::move(A);
      layer.b(t) = Tensor::zeros({out, lora.r});
      layer.enabled[static_cast<size_t>(t)] = true;
    }
  }
  return ad;
}

}  // namespace bp
