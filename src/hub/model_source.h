// The one resolver of `--model` (train, generate, estimate-vram, validate, export): turns a model
// reference into a local folder.
//
//   an existing path          -> itself (a Hugging Face folder, or for estimate-vram a config.json)
//   ollama:NAME[:TAG]         -> as a GGUF file, for the model blob in Ollama's store (ollama_source.h)
//   a GGUF file               -> a folder of config.json + tokenizer files standing for it (gguf_source.h)
//   another regular file      -> DEP_MODEL_LOAD_FAILED "not a GGUF file (magic ...)", unless it is JSON
//                                and not named *.gguf (a config.json, which estimate-vram reads)
//   org/name[@revision]       -> the snapshot folder in the Hugging Face cache (hf_cache.h), downloaded
//                                into it first when missing and not offline (hf_download.h)
//   anything else             -> returned unchanged, so the loader reports what is wrong with it
//
// A local folder named like a hub id (./org/name exists) wins over the hub, as in transformers.
#pragma once

#include <string>

#include "hub/hf_cache.h"

namespace bp::hub {

struct ModelSource {
  std::string path;       // what the loaders read
  std::string reference;  // what the user passed
  bool from_hub = false;
  bool from_ollama = false;                    // ollama:NAME[:TAG] (ollama_source.h); path as for a GGUF file
  std::string ollama_template, ollama_system;  // the manifest's TEMPLATE and SYSTEM, also in path/ollama.json
  bool from_gguf = false;                      // path is the folder standing for the GGUF file (gguf_source.h)
  bool downloaded = false;                     // this call fetched files
  std::string commit;                          // of the hub snapshot
};

// Throws INPUT_VALIDATION_FAILED for a revision that is not a branch, tag or commit name (hf_names.h),
// DEP_MODEL_LOAD_FAILED for a hub name that is not cached while offline, and the errors of
// download_snapshot.
ModelSource resolve_model_source(const std::string& reference, const HubOptions& o);

}  // namespace bp::hub
