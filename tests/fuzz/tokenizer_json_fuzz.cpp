// libFuzzer target for tokenizer.json (text/tokenizer.h, Tokenizer::from_json_text). The
// property: any input builds a tokenizer or throws bp::Error with DEP_MODEL_LOAD_FAILED (a
// malformed file, token ids outside the vocabulary) or INPUT_JSON_TOO_DEEP; a tokenizer that
// loads encodes and decodes a fixed text without crashing. An id of 1e9 once allocated an
// id-sized table; 100,000 levels of nesting once overflowed the stack.
//
// Build and run: see docs/fuzzing.md; tests/fuzz/fuzz_replay_test.cpp replays it in CI.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto tok = bp::Tokenizer::from_json_text(text, "fuzz-tokenizer.json");
    const std::vector<int32_t> ids = tok->encode("Hello wörld, <s> 123 \xF0\x9F\x99\x82!", true);
    for (int32_t id : ids)
      if (id < 0 || id >= tok->vocab_size()) std::abort();
    (void)tok->decode(ids, false);
  } catch (const bp::Error& e) {
    if (e.code() != bp::ErrorCode::DEP_MODEL_LOAD_FAILED && e.code() != bp::ErrorCode::INPUT_JSON_TOO_DEEP)
      std::abort();
  }
  return 0;
}
