// What resuming a run needs besides the checkpoint store (train/checkpoint.h): the check that a
// verified checkpoint can really be resumed by this run, and the trimming of metrics.jsonl.
//
// The check runs while the newest checkpoint is chosen, so a checkpoint that is intact on disk
// but unusable (trainer_state.json fields of the wrong JSON type, non-finite trainable weights)
// is skipped like a damaged one (STATE_CHECKPOINT_INVALID) and the next older one is used. A
// checkpoint of the other training mode (LoRA vs full) is not damaged: that is
// CONFIG_RESUME_MISMATCH, telling which --mode resumes it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "io/safetensors.h"
#include "model/transformer.h"
#include "train/checkpoint.h"
#include "train/train_options.h"

namespace bp {

// "lora" / "full": the value stored as trainer_state.json "mode".
const char* train_mode_name(TrainMode mode);

// Throws STATE_CHECKPOINT_INVALID when a trainer_state.json field the trainer reads is missing or
// of the wrong type, or trainable.safetensors is unreadable or holds a NaN/Inf; CONFIG_RESUME_MISMATCH
// when the checkpoint was trained in another mode than `mode`.
void check_resumable_checkpoint(const CheckpointInfo& checkpoint, TrainMode mode);

// Rewrites metrics.jsonl without the records of steps after `step` (a resumed run writes them
// again) and without a torn last line; records without a step (events) stay. No file: no-op.
void truncate_metrics_after_step(const std::string& path, int64_t step);

// The eval loss before training (the step-0 eval record of metrics.jsonl), for a resumed run's summary.
std::optional<double> step_zero_eval_loss(const std::string& metrics_path);

// What a --resume value other than "latest" names: the path as given when it exists, else a run id
// under `output_root`. A checkpoint folder (holding manifest.json) belongs to the run two levels up.
std::string resume_path(const std::string& resume, const std::string& output_root);
bool is_checkpoint_folder(const std::string& path);

// The checkpoint a --resume value names: "latest" (the newest valid one under the output folder, or
// under the runs folder), a run id, a run folder or a checkpoint folder; `run_dir` gets its run
// folder. Damaged checkpoints are skipped with a warning. nullopt when none is found.
std::optional<CheckpointInfo> find_resume_checkpoint(const TrainOptions& o, std::string* run_dir,
                                                     const std::function<void(const std::string&)>& warn);

// `t` readable by host code: itself on the CPU, else a host copy (a model trained on a device
// writes its checkpoints and adapter from such copies; reading them back copies to the device).
inline Tensor host_readable(const Tensor& t) {
  return t.device().type == DeviceType::CPU ? t : t.to(Device{});
}

// A checkpoint's trainable.safetensors: the trainable parameters by name (host copies of a
// device model's), and back into the model's device (STATE_CHECKPOINT_INVALID when one is missing).
NamedTensors trainable_tensors(Model& m);
// Before anything is written: the checkpoint's trainable tensors are exactly this model's (names and
// shapes), and a LoRA checkpoint that records its alpha and rsLoRA (trainer_state.json "lora")
// has this run's. Else CONFIG_RESUME_MISMATCH naming the checkpoint's LoRA shape and the asked one.
void check_trainable_matches(const CheckpointInfo& checkpoint, Model& m, const TrainOptions& o);
// trainer_state.json's "lora": r, alpha, use_rslora and the resolved target modules.
nlohmann::json lora_state_json(const LoraConfig& lora);
void restore_trainable(Model& m, const std::string& file);

}  // namespace bp
