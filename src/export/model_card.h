// The model card (`README.md`) a push uploads with the export: the Hub's YAML metadata block
// (https://huggingface.co/docs/hub/model-cards: base_model, library_name, pipeline_tag, tags,
// datasets, license) and a body with what the run was:
//
//   ---
//   base_model: Qwen/Qwen2.5-0.5B-Instruct      only a hub id (a local base is named in the body)
//   library_name: peft                          lora; transformers (merged); gguf (gguf, gguf-lora)
//   pipeline_tag: text-generation
//   license: apache-2.0                         the base's, when known (its card or the hub's cardData)
//   datasets: [org/name]                        a hf://datasets/ training file
//   tags: [backprop, lora, sft, ...]
//   ---
//   # <repo name>, how to use it, the training settings that differ from backprop's defaults,
//   the data (file, bytes and sha256 as found at push time), the results (training and held-out
//   loss, `backprop eval`'s metrics with their 95% bootstrap intervals), the backprop version and
//   the `backprop train` command that reproduces the run.
//
// Nothing secret goes in: settings marked secret are left out, and the card is built from the run's
// files, never from the environment.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace bp {

struct ModelCardInput {
  std::string repo_id;             // org/name pushed to
  std::string format;              // lora | merged | gguf | gguf-lora
  std::string run_dir;             // "" when the export's input was not a run
  std::string base_model;          // the base as the run named it (a hub id or a folder)
  std::string base_model_id;       // its hub id, "" when unknown
  std::string license;             // the base's licence id, "" when unknown
  std::vector<std::string> files;  // the files pushed beside the card
  nlohmann::json export_result;    // run_export's result (lora_r, quantization, ...)
};

std::string model_card_markdown(const ModelCardInput& in);

// A run file read as a JSON object (settings.json, summary.json, eval_results.json, adapter_config.json);
// nullopt when it is missing, too large, not JSON or not an object.
std::optional<nlohmann::json> read_json_object_file(const std::string& path);

// The hub id of a model reference: "org/name" itself, a folder inside a hub cache
// (.../models--org--name/snapshots/<sha>), else "".
std::string hub_id_of_model_ref(const std::string& ref);

// `license:` of a model card's YAML block ("" when there is none).
std::string license_from_card(const std::string& readme_text);

// The `backprop train` command line that reproduces a run: settings.json's values that differ
// from the defaults, as flags (as environment assignments where a setting has no flag).
std::string reproduce_command(const nlohmann::json& settings);

}  // namespace bp
