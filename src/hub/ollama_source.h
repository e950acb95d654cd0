// `--model ollama:NAME[:TAG]`: a model pulled with `ollama pull`, read straight from Ollama's store
// (no server needed):
//
//   $OLLAMA_MODELS (default ~/.ollama/models)
//     manifests/registry.ollama.ai/library/NAME/TAG   (NAME "user/model" -> .../user/model/TAG)
//     blobs/sha256-<hex>                               (the manifest's layer digests, ':' -> '-')
//
// The manifest's layer of media type application/vnd.ollama.image.model is the GGUF file, which is
// then read as any GGUF --model (gguf_source.h). Its template, system prompt and parameters layers
// are kept in ollama.json inside the folder that stands for the model, for export.
#pragma once

#include <string>

namespace bp::hub {

struct OllamaModel {
  std::string name, tag;      // "llama3.2", "1b" (tag defaults to "latest")
  std::string manifest_path;  // the manifest file read
  std::string gguf_path;      // the model blob
  std::string template_text;  // Go template of the Modelfile's TEMPLATE ("" when none)
  std::string system_prompt;  // SYSTEM ("" when none)
  std::string params_json;    // PARAMETER lines as Ollama stores them (JSON, "" when none)
  std::string adapter_path;   // an ADAPTER blob when the model has one ("" otherwise)
};

// True for "ollama:..." references.
bool is_ollama_reference(const std::string& reference);
// Reads the manifest of `reference` ("ollama:NAME[:TAG]") in `models_dir`. DEP_MODEL_LOAD_FAILED
// when the model is not pulled or a blob is missing (with `ollama pull NAME:TAG` as the fix).
OllamaModel find_ollama_model(const std::string& reference, const std::string& models_dir);

}  // namespace bp::hub
