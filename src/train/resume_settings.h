// The settings a resumed run continues with (`backprop train --resume` and the web UI's resume):
// the run's own settings.json, with the explicit flags, TOML keys and BACKPROPAGATE_* variables of
// this command over it where that is safe (more --steps, --save-every, --eval-every, logging,
// threads, memory). A setting that decides what the checkpoint holds or which samples come next
// (model, data, mode, LoRA shape, sequence length, batch geometry, seed, ...) is pinned: given with
// another value it is refused (CONFIG_RESUME_MISMATCH) before anything in the run folder changes.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace bp {

class Settings;
struct SettingSpec;

// Does a resumed run get this setting back from its settings.json? Every setting `train` takes
// (train/train_options.h) except where it goes and what it resumes (the resume sets those), the
// preset (its values are in the file already), secrets and test aids.
bool resumed_with_setting(const SettingSpec& spec);

// Must this setting keep the run's saved value on resume (it changes the trained tensors' shapes or
// the sample order, so the continuation would not be the same training)?
bool pinned_on_resume(std::string_view key);

// The run folder a --resume value names (a checkpoint folder, a run folder, a run id under
// `output_root`, or "latest": the newest run folder under `output_root` holding a checkpoint), or
// nullopt when none is found (the trainer then says so). Reads only folder listings.
std::optional<std::string> find_resume_run_dir(const std::string& resume, const std::string& output_root);

// Puts the run's saved settings (settings.json, `saved`) into `st` under what this command set
// explicitly: a resumed setting left at its default (or preset) takes the saved value; an explicit
// value of a pinned setting that differs from the saved one throws CONFIG_RESUME_MISMATCH listing
// every such setting with both values. training.preset is set to none (its values come back with
// the rest). `run_dir` names the run in the message.
void apply_resumed_settings(Settings& st, const nlohmann::json& saved, const std::string& run_dir);

// The whole of it for `train`: when st's training.resume names a run folder with a settings.json,
// apply_resumed_settings from it; "latest" is pinned to that folder (the run whose settings
// these are). Returns the saved "preset" record (null when nothing was resumed).
nlohmann::json resume_with_saved_settings(Settings& st);

}  // namespace bp
