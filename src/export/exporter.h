// `backprop export`: one request (what to export, in which format, where), one table of formats.
//
//   lora    load_peft_adapter against the base's config (a shape check), save_peft_adapter.
//   merged  load_model(base) + load_peft_adapter + export_merged_model (base dtype, sharded,
//           tokenizer files copied); a full model is re-saved with save_hf_model.
//   gguf    merge_lora_into when an adapter, export_gguf, then always a Modelfile next to the file,
//           named after it (model-q8_0.gguf: model-q8_0.Modelfile, so exports in one folder keep
//           theirs; make_modelfile); `ollama` registers it (register_with_ollama).
//   gguf-lora  the adapter as a GGUF LoRA file (export/gguf_lora.h) and a Modelfile FROM <base>
//           ADAPTER <file>: an Ollama base (--model ollama:NAME) is named by its model name and keeps
//           its manifest's template and system prompt (nothing re-quantized); a GGUF base by its file.
// Merging into a quantized GGUF base (merged, gguf) dequantizes it to f32, merges in f32 and writes
// the requested type; `messages` says so.
//
// Where an export may write (nothing already written is lost; INPUT_VALIDATION_FAILED otherwise):
//   a folder (lora, merged) is written whole: never a folder that is, or holds, anything the export
//     reads (the adapter, its run, the base model, a GGUF base file), nor a file, nor a non-empty
//     folder unless it holds an earlier export of the same format (its adapter_config.json /
//     config.json, and files only); replacing one says so in `messages`.
//   a file (gguf, gguf-lora) replaces only a GGUF file, never one the export reads or a file inside
//     a model or adapter folder it reads, nor anything that is not a regular file. --output DIR/,
//     an existing folder or a name without an extension is a folder: the default file name goes in it.
// --quantization set by the user for a format that has no such choice (lora, merged) is refused
// rather than ignored.
//
// A new format is one row of export_formats() plus its writer function here, and its name in the
// allowed values of the export.format setting (a test holds the two lists equal).
// The input is resolved by export/export_input.h; the base model of an adapter is
// request.model_path when given, else the adapter's base_model_name_or_path.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "export/gguf_export.h"

namespace bp {

struct ExportRequest {
  std::string input;  // run folder, runs folder, run id, checkpoint, adapter or model folder
  std::string format = "lora";
  GGUFQuant quantization = GGUFQuant::F16;
  bool quantization_given = false;  // set by the user (flag, environment, TOML), not the default
  std::string output;               // "" = the default place (export_input.h)
  std::string model_path;           // base model of an adapter; "" = the adapter's own reference
  std::string runs_root;            // where run ids are looked up (training.output)
  bool ollama = false;              // register the GGUF with Ollama
  std::string ollama_name;          // "" = derived from the run or folder name
  std::string ollama_host;          // "" = $OLLAMA_HOST, else 127.0.0.1:11434
  int ollama_max_attempts = 5;
  // Turns a model reference (folder, hub name org/name, GGUF file, ollama:NAME) into a folder;
  // the CLI passes its resolver (cache, download, progress bar). Unset: references are folders.
  std::function<std::string(const std::string&)> resolve_model;
};

struct ExportReport {
  nlohmann::json result;              // what `export --json` prints
  std::vector<std::string> written;   // paths written, for the text summary
  std::vector<std::string> next;      // commands to try next
  std::vector<std::string> warnings;  // shown on stderr by the text output
  std::vector<std::string> messages;  // facts about the export shown on stdout by the text output
  std::string note;                   // how the input was found (export_input.h), "" when named directly
};

struct ExportJob;  // the resolved request a writer works on (exporter.cpp)

struct ExportFormat {
  const char* name;
  const char* description;
  bool needs_adapter;  // a full model cannot be exported this way
  bool can_register_ollama;
  void (*write)(const ExportJob& job, ExportReport& report);
};

// The formats, in the order `--format` lists them.
const std::vector<ExportFormat>& export_formats();

// Resolves the input and writes the export. Errors: INPUT_VALIDATION_FAILED (bad input or
// combination), DEP_MODEL_LOAD_FAILED (no base model), RUNTIME_EXPORT_FAILED / STATE_DISK_FULL
// (writing), DEP_OLLAMA_REGISTRATION_FAILED (the files are kept; the suggestion says how to
// register them later).
ExportReport run_export(const ExportRequest& request);

}  // namespace bp
