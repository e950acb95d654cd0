// What `backprop export INPUT` exports: INPUT resolved to an adapter or model folder, the run it
// belongs to, and where outputs go by default.
//
// INPUT may be what the user named anywhere else:
//   a run folder           <runs>/<run id>: its adapter/ (LoRA) or model/ (full fine-tuning);
//   the folder given to `train --output`: its only run, or the newest one (the note says which);
//   a run id               looked up under the runs folder (training.output, default runs/);
//   a checkpoint folder    checkpoints/checkpoint-N of a finished LoRA run: its trainable.safetensors
//                          holds PEFT-named tensors and the run's adapter_config.json gives r, alpha,
//                          targets (read through a temporary staging folder);
//   a PEFT adapter folder  adapter_config.json;
//   a model folder         config.json.
// Default outputs: <run>/export/... and <run>/merged/ in a run, <folder>-export/ next to a folder
// outside one. Errors are INPUT_VALIDATION_FAILED naming what was found instead.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace bp {

enum class ExportInputKind { Adapter, Model };

struct ExportInput {
  struct Staging;  // removes the checkpoint's staging folder when the last copy goes
  ExportInputKind kind = ExportInputKind::Adapter;
  std::string shown;  // what is reported as the input (a checkpoint: its own folder)
  std::string note;   // how INPUT was found when it named a runs folder or a run id; empty otherwise
  std::shared_ptr<Staging> staging;
  std::filesystem::path dir;       // the adapter or model folder read
  std::filesystem::path run_dir;   // the run folder holding it; empty outside a run
  std::filesystem::path out_root;  // default outputs: <run>/export or <dir>-export
  std::filesystem::path merged_default;
};

// `runs_root` is where run ids are looked up (training.output).
ExportInput resolve_export_input(const std::string& arg, const std::string& runs_root);

// The base model folder of an adapter: `model_path` (--model) when given, else adapter_config.json's
// base_model_name_or_path, tried as given and relative to the adapter folder. DEP_MODEL_LOAD_FAILED
// (suggesting --model, or how to fetch a hub name) when none is found.
// `resolve` turns a model reference into a folder (a hub name into its cache snapshot); unset =
// references are folders.
std::filesystem::path resolve_base_model(const ExportInput& in, const std::string& model_path,
                                         const std::function<std::string(const std::string&)>& resolve = {});

// An Ollama model name from the run (or folder) name: lower case, [a-z0-9_.-], starting with a
// letter or digit.
std::string derive_ollama_model_name(const ExportInput& in);

bool is_adapter_dir(const std::filesystem::path& p);  // holds adapter_config.json
bool is_model_dir(const std::filesystem::path& p);    // holds config.json
bool looks_like_run(const std::filesystem::path& p);  // holds checkpoints/, summary.json or metrics.jsonl

// The chat template an adapter was trained with (the trainer writes chat_template.jinja into the
// adapter folder and its run folder; another folder's is never taken), else the model's own
// (ChatMLDefault when it has none). `adapter_dir` "" = the model's own. generate and eval use it.
ChatTemplateSource adapter_chat_template_source(const Tokenizer& tok, const std::string& adapter_dir);
// The same as a ChatTemplate, with the tokenizer's bos/eos token strings.
ChatTemplate adapter_chat_template(const Tokenizer& tok, const std::string& adapter_dir);

}  // namespace bp
