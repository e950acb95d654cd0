// What resuming a run needs besides the checkpoint store (train/checkpoint.h): the check that a
// verified checkpoint can really be resumed by this run, and the trimming of metrics.jsonl.
//
// The check runs while the newest checkpoint is chosen, so a checkpoint that is intact on disk
// but unusable (trainer_state.json fields of the wrong JSON type, non-finite trainable weights)
// is skipped like a damaged one (STATE_CHECKPOINT_INVALID) and the next older one is used. A
// checkpoint of the other training mode (LoRA vs full) is not damaged: that is CONFIG_INVALID,
// telling which --mode resumes it.
#pragma once

#include <cstdint>
#include <string>

#include "model/transformer.h"
#include "train/checkpoint.h"

namespace bp {

// "lora" / "full": the value stored as trainer_state.json "mode".
const char* train_mode_name(TrainMode mode);

// Throws STATE_CHECKPOINT_INVALID when a trainer_state.json field the trainer reads is missing or
// of the wrong type, or trainable.safetensors is unreadable or holds a NaN/Inf; CONFIG_INVALID
// when the checkpoint was trained in another mode than `mode`.
void check_resumable_checkpoint(const CheckpointInfo& checkpoint, TrainMode mode);

// Rewrites metrics.jsonl without the records of steps after `step` (a resumed run writes them
// again) and without a torn last line; records without a step (events) stay. No file: no-op.
void truncate_metrics_after_step(const std::string& path, int64_t step);

}  // namespace bp
