// `backprop generate` as a function: the JSON `--json` prints (prompt and output ids, completion,
// text, stop reason, speed, sampling). The command prints it or the answer; the Python package's
// Trainer.generate returns it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/settings.h"

namespace bp::cli {

struct GenerateArgs {
  std::string model_dir, adapter_dir, prompt, system;
  int64_t max_new_tokens = 64;
  float temperature = 0.8f;
  float top_p = 0.95f;
  int64_t top_k = 40;
  std::string seed;  // "" = random; else 0 .. 2^64-1, as training.seed
};

// Reads generate.chat and model.offline from `st`.
nlohmann::json generate_report(const GenerateArgs& a, const Settings& st);

}  // namespace bp::cli
