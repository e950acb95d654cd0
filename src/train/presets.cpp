// Presets: the tables in presets.h, applied under every explicit layer.
#include "train/presets.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/settings.h"
#include "model/loader.h"

namespace bp {

namespace {

using Values = std::vector<std::pair<std::string, std::string>>;

Values auto_values(int64_t params, std::string* reason) {
  struct Row {
    double below;
    const char* label;
    Values values;
  };
  static const Row kRows[] = {
      {1e8,
       "< 100M",
       {{"lora.r", "8"}, {"lora.alpha", "16"}, {"training.lr", "1e-3"}, {"training.max_seq_length", "512"}}},
      {1e9,
       "< 1B",
       {{"lora.r", "16"}, {"lora.alpha", "32"}, {"training.lr", "2e-4"}, {"training.max_seq_length", "1024"}}},
      {1e10,
       "< 10B",
       {{"lora.r", "16"}, {"lora.alpha", "16"}, {"training.lr", "1e-4"}, {"training.max_seq_length", "2048"}}},
      {1e300,
       ">= 10B",
       {{"lora.r", "8"}, {"lora.alpha", "16"}, {"training.lr", "1e-4"}, {"training.max_seq_length", "2048"}}},
  };
  for (const auto& row : kRows)
    if (static_cast<double>(params) < row.below) {
      *reason = fmt::format("the model has {} parameters ({})", params, row.label);
      return row.values;
    }
  return {};
}

// Phi-3 has no q_proj / v_proj modules (PEFT's fused qkv_proj, model/lora.h): the fast preset's
// attention-only adapter is qkv_proj there. A folder that cannot be read yet says so later, in loading.
bool stores_fused_projections(const std::string& model_dir) {
  try {
    return load_model_config(model_dir).fused_projections();
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

PresetApplied apply_preset(Settings& s, const std::string& model_dir) {
  PresetApplied out;
  out.name = s.get_string("training.preset");
  Values values;
  if (out.name == "fast")
    values = {{"lora.r", "8"},
              {"lora.alpha", "16"},
              {"lora.target_modules", stores_fused_projections(model_dir) ? "qkv_proj" : "q_proj,v_proj"},
              {"training.lr", "3e-4"}};
  else if (out.name == "balanced")
    values = {{"lora.r", "16"}, {"lora.alpha", "32"}, {"lora.target_modules", "all-linear"}, {"training.lr", "2e-4"}};
  else if (out.name == "quality")
    values = {{"lora.r", "64"},
              {"lora.alpha", "128"},
              {"lora.target_modules", "all-linear"},
              {"lora.use_rslora", "true"},
              {"training.lr", "1e-4"},
              {"training.epochs", "2"}};
  else if (out.name == "auto")
    values = auto_values(load_model_config(model_dir).num_parameters(), &out.reason);
  // The learning rates above are SFT's. Preference losses are trained far more gently: LLaMA-Factory's
  // and Unsloth's LoRA DPO/KTO/ORPO examples use 5e-6 where their SFT examples use 1e-4 to 2e-4, so a
  // preference method gets the preset's rate / 40 (balanced: 5e-6).
  const std::string method = s.get_string("training.method");
  if (method != "sft")
    for (auto& [key, value] : values)
      if (key == "training.lr") {
        value = fmt::format("{:g}", std::stod(value) / kPreferenceLrDivisor);
        if (!out.reason.empty()) out.reason += "; ";
        out.reason += fmt::format("--method {}: the SFT learning rate / {:g}", method, kPreferenceLrDivisor);
      }
  for (auto& [key, value] : values) {
    if (s.source(key) != SettingSource::Default) {
      out.kept.push_back(key);
      continue;
    }
    s.set(key, value, SettingSource::Preset);
    out.values.emplace_back(key, value);
  }
  return out;
}

nlohmann::json PresetApplied::to_json() const {
  nlohmann::json applied = nlohmann::json::object();
  for (const auto& [k, v] : values) applied[k] = v;
  return {{"name", name}, {"reason", reason}, {"applied", applied}, {"kept_from_user", kept}};
}

std::string PresetApplied::describe() const {
  if (name == "none") return "";
  std::string s = fmt::format("preset {}", name);
  if (!reason.empty()) s += " (" + reason + ")";
  s += ":";
  for (const auto& [k, v] : values) s += fmt::format(" {}={}", k, v);
  if (!kept.empty()) s += fmt::format("; yours kept: {}", fmt::join(kept, ", "));
  return s;
}

}  // namespace bp
