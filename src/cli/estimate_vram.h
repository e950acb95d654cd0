// `backprop estimate-vram` as a function: the memory plan for the settings' model and training
// shape, as the JSON `--json` prints and as the text table. The command prints one of them; the
// Python package's Trainer.estimate_vram returns the JSON as an object.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/settings.h"

namespace bp::cli {

// The settings `estimate-vram` takes (its flags).
inline constexpr std::string_view kEstimateVramSettingKeys[] = {"model.path",
                                                                "model.offline",
                                                                "training.mode",
                                                                "lora.r",
                                                                "lora.dropout",
                                                                "lora.target_modules",
                                                                "lora.use_dora",
                                                                "lora.init_lora_weights",
                                                                "training.batch_size",
                                                                "training.micro_batch_size",
                                                                "training.max_seq_length",
                                                                "training.gradient_checkpointing",
                                                                "model.base_dtype",
                                                                "training.vram_gb",
                                                                "training.threads",
                                                                "model.device",
                                                                "training.matmul_dtype",
                                                                "training.method",
                                                                "training.nproc",
                                                                "training.shard_optimizer"};

struct VramReport {
  nlohmann::json json;  // what `estimate-vram --json` prints
  std::string text;     // what it prints without --json
};

// Reads model.path (config.json only; a hub name fetches the config), training.*, lora.* and
// model.* as the command binds them. Errors: CONFIG_INVALID without a model, the loader's.
VramReport estimate_vram_report(const Settings& st);

}  // namespace bp::cli
