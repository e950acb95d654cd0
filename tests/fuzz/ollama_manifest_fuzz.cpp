// libFuzzer target for an Ollama manifest (hub/ollama_source.h, `--model ollama:NAME`): the JSON
// that names a model's blobs. The property: any input is rejected with bp::Error
// (DEP_MODEL_LOAD_FAILED, INPUT_JSON_TOO_DEEP) or gives layers whose digest is 64 hex digits, so
// blobs/sha256-<hex> never names a path outside the store (issue 37: wrong JSON types once ended
// in RUNTIME_INTERNAL).
//
// Build and run: see docs/fuzzing.md; tests/fuzz/fuzz_replay_test.cpp replays it in CI.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "hub/ollama_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    for (const bp::hub::OllamaLayer& l : bp::hub::parse_ollama_manifest(text, "fuzz-manifest")) {
      if (l.digest_hex.size() != 64 || l.digest_hex.find_first_not_of("0123456789abcdef") != std::string::npos)
        std::abort();
      if (!l.has_size && l.size != 0) std::abort();
    }
  } catch (const bp::Error& e) {
    if (e.code() != bp::ErrorCode::DEP_MODEL_LOAD_FAILED && e.code() != bp::ErrorCode::INPUT_JSON_TOO_DEEP)
      std::abort();
  }
  return 0;
}
