// `backprop train` with no model and no data: the quick start (README's first command).
// Fine-tunes the shipped demo model (models/tiny-chat) with LoRA on examples/quickstart_sharegpt.jsonl,
// evaluates before and after on the held-out file (eval loss and exact match of greedy answers),
// shows one generation before and after, writes the adapter and a GGUF export, and says what to
// run next. Any flag or setting given still applies (e.g. --steps 5 in tests); only settings left
// at their defaults get the quick-start values.
#pragma once

#include "core/settings.h"

namespace bp::cli {

// True when the command line names no model, data, init config or resume target.
bool is_quickstart(const Settings& s);
int run_quickstart(Settings settings, bool json);

}  // namespace bp::cli
