// The flags of `backprop train`, shared by the commands that run training (train, multi-run).
#pragma once

#include <CLI/CLI.hpp>

#include "train/trainer.h"

namespace bp::cli {

// Binds the flag of every setting `train` takes (train/train_options.h train_use) to `sub`.
void bind_train_settings(CLI::App& sub);

// TrainOptions from this invocation's settings with --preset applied (train/presets.h); prints
// what the preset set (stdout, or stderr with --json) and saves it in the run's settings.json.
TrainOptions train_options_with_preset(bool json);

}  // namespace bp::cli
