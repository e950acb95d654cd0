// `--model ollama:NAME[:TAG]`: a model pulled with `ollama pull`, read straight from Ollama's store
// (no server needed):
//
//   $OLLAMA_MODELS (default ~/.ollama/models)
//     manifests/registry.ollama.ai/library/NAME/TAG   (NAME "user/model" -> .../user/model/TAG,
//                                                      "host/user/model" -> manifests/host/user/model/TAG)
//     blobs/sha256-<hex>                               (the manifest's layer digests, ':' -> '-')
//
// The manifest's layer of media type application/vnd.ollama.image.model is the GGUF file, which is
// then read as any GGUF --model (gguf_source.h). Its template, system prompt and parameters layers
// are kept in ollama.json inside the folder that stands for the model, for export.
//
// Nothing is taken on trust (issue 37): NAME and TAG are names, never paths (1-3 '/'-separated
// components of [A-Za-z0-9._-] starting with a letter or digit; a tag likewise, no '/'), every
// layer must be {"mediaType": string, "digest": "sha256:<64 hex>", "size": unsigned integer}, and
// each blob used must have the manifest's size and sha256. Hashing a large model blob takes
// seconds, so a verified blob is remembered in <verified_dir>/sha256-<hex> (its size and mtime)
// and hashed again only when it changes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

struct OllamaLayer {
  std::string media_type;  // "application/vnd.ollama.image.model", ...
  std::string digest_hex;  // the 64 hex digits after "sha256:"
  uint64_t size = 0;
  bool has_size = false;
};

// The layers of a manifest's JSON text (`path` for messages). DEP_MODEL_LOAD_FAILED when it is not
// JSON, has no "layers" array, or a layer has a field of the wrong type or a digest that is not
// sha256:<64 hex>; INPUT_JSON_TOO_DEEP.
std::vector<OllamaLayer> parse_ollama_manifest(std::string_view text, const std::string& path);

// True for "ollama:..." references.
bool is_ollama_reference(const std::string& reference);
// Reads the manifest of `reference` ("ollama:NAME[:TAG]") in `models_dir`. INPUT_VALIDATION_FAILED
// for a name that is not one (a path, '..'); DEP_MODEL_LOAD_FAILED when the model is not pulled, a
// blob is missing, the manifest is malformed or a blob's size or sha256 differs from the manifest
// (with `ollama pull NAME:TAG` as the fix). `verified_dir` ("" = hash every time): see the file comment.
OllamaModel find_ollama_model(const std::string& reference, const std::string& models_dir,
                              const std::string& verified_dir = "");

}  // namespace bp::hub
