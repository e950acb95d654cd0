// Presets (issue 21): `--preset NAME` gives starting values to settings the user left at their
// defaults. Explicit flags, TOML keys and BACKPROPAGATE_* variables always win; what a preset
// applied is printed by the command and saved in the run's settings.json under "preset".
//
//   fast      lora.r 8, lora.alpha 16, target q_proj,v_proj, lr 3e-4
//   balanced  lora.r 16, lora.alpha 32, all-linear, lr 2e-4
//   quality   lora.r 64, lora.alpha 128, all-linear, rsLoRA, lr 1e-4, 2 epochs
//   auto      by the model's parameter count (config.json of --model):
//               < 100M   r 8,  alpha 16, lr 1e-3, max_seq_length 512
//               < 1B     r 16, alpha 32, lr 2e-4, max_seq_length 1024
//               < 10B    r 16, alpha 16, lr 1e-4, max_seq_length 2048
//               larger   r 8,  alpha 16, lr 1e-4, max_seq_length 2048
//             (the micro-batch always comes from the memory plan: micro_batch_size auto)
// With --method dpo|orpo|simpo|kto every learning rate above is divided by kPreferenceLrDivisor
// (balanced: 5e-6, the value LLaMA-Factory's and Unsloth's LoRA preference examples use).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace bp {

class Settings;

inline constexpr double kPreferenceLrDivisor = 40.0;

struct PresetApplied {
  std::string name;                                         // "none" when no preset was asked for
  std::string reason;                                       // auto: "model has 1.2M parameters (< 100M)"
  std::vector<std::pair<std::string, std::string>> values;  // key, value actually applied
  std::vector<std::string> kept;                            // keys the user had set (preset value not used)
  nlohmann::json to_json() const;
  std::string describe() const;  // one line for the console; "" for none
};

// Applies training.preset to `s` in place (source Preset for each value applied).
// `model_dir`: the resolved model folder (auto reads its config.json).
PresetApplied apply_preset(Settings& s, const std::string& model_dir);

}  // namespace bp
