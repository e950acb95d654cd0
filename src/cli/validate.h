// `backprop validate FILE` as a function: the report `--json` prints, the text it prints otherwise
// and its exit status (0 every row valid, 1 bad rows or a dataset training would refuse). The
// Python package's backpropagate.validate returns the JSON.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/settings.h"

namespace bp::cli {

struct ValidateOptions {
  std::string file;
  std::string format = "auto";
  int64_t max_errors = 50;
  int64_t max_length = 2048;
  std::string model_dir;
  std::string chat_template;  // --chat-template FILE|chatml, as training (setting data.chat_template)
  int64_t show = 0;
  bool json = false;
};

struct ValidateReport {
  nlohmann::ordered_json json;
  std::string text;
  int exit_code = 0;
};

// Reads training.method (its data shape is checked only when set) and model.offline from `st`.
ValidateReport validate_report(const ValidateOptions& o, const Settings& st);

}  // namespace bp::cli
