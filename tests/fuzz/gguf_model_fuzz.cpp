// libFuzzer target for the whole GGUF-to-model path of `--model FILE.gguf` (issue 37): the GGUF
// image is parsed (io/gguf_reader.h), its metadata turned into config.json, tokenizer.json and
// tokenizer_config.json (hub::gguf_model_files, hub/gguf_source.h, Llama-3 rope scaling from
// rope_freqs.weight included), the files serialized as they would be written, the config parsed
// into a ModelConfig (model/config.h) and the tokenizer built from tokenizer.json, encoding and
// decoding a fixed text. The property: any input either goes all the way or throws bp::Error with
// DEP_MODEL_LOAD_FAILED. Any other exception (a JSON conversion or serialization error, which the CLI
// reports as RUNTIME_INTERNAL), a crash, an out-of-bounds access or an UBSan report is a bug: a head
// count of 0 once divided by zero, an empty rope_freqs.weight once dereferenced an empty vector,
// and metadata of the wrong type or non-UTF-8 tokens once escaped as JSON errors.
//
// Build and run: see docs/fuzzing.md; tests/fuzz/fuzz_replay_test.cpp replays it in CI.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "hub/gguf_source.h"
#include "io/gguf_reader.h"
#include "model/config.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const bp::GGUFReader r(data, size, "fuzz.gguf");
    const bp::hub::GGUFModelFiles f = bp::hub::gguf_model_files(r, "fuzz.gguf");
    const std::string tokenizer_text = f.tokenizer.dump();
    (void)f.tokenizer_config.dump();
    const bp::ModelConfig cfg = bp::ModelConfig::from_json(nlohmann::json::parse(f.config.dump()), "fuzz-config.json");
    if (cfg.num_parameters() < 1 || cfg.vocab_size < 1 || cfg.head_dim < 2) std::abort();
    if (f.tokenizer["model"]["vocab"].size() > 4096) return 0;  // the BPE merges of large vocabularies: slow, not new
    const auto tok = bp::Tokenizer::from_json_text(tokenizer_text, "fuzz-tokenizer.json");
    const std::vector<int32_t> ids = tok->encode("Hello wörld, <s> 123 \xF0\x9F\x99\x82!", true);
    for (int32_t id : ids)
      if (id < 0 || id >= tok->vocab_size()) std::abort();
    (void)tok->decode(ids, false);
  } catch (const bp::Error& e) {
    if (e.code() != bp::ErrorCode::DEP_MODEL_LOAD_FAILED) std::abort();
  }
  return 0;
}
