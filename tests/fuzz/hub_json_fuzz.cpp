// libFuzzer target for the Hugging Face hub's JSON answers the downloader reads (hub/hf_answers.h):
// the model info (commit and file listing) and a model.safetensors.index.json's weight_map. The
// same bytes go to both parsers. The property: any input is rejected with bp::Error
// (DEP_MODEL_DOWNLOAD_FAILED, DEP_MODEL_LOAD_FAILED, INPUT_JSON_TOO_DEEP) or gives a 40-hex commit
// and file names that pass remote_file_problem (hub/hf_names.h): relative, no '..', no '\', no
// control bytes, so no name from a hub leads out of the cache (issue 37).
//
// Build and run: see docs/fuzzing.md; tests/fuzz/fuzz_replay_test.cpp replays it in CI.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "hub/hf_answers.h"
#include "hub/hf_cache.h"
#include "hub/hf_names.h"

namespace {
bool accepted(const bp::Error& e) {
  return e.code() == bp::ErrorCode::DEP_MODEL_DOWNLOAD_FAILED || e.code() == bp::ErrorCode::DEP_MODEL_LOAD_FAILED ||
         e.code() == bp::ErrorCode::INPUT_JSON_TOO_DEEP;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const bp::hub::HubModelInfo info = bp::hub::parse_model_info(text, "fuzz-info", "org/fuzz");
    if (!bp::hub::is_commit_sha(info.sha)) std::abort();
    for (const auto& f : info.files)
      if (!bp::hub::remote_file_problem(f).empty()) std::abort();
  } catch (const bp::Error& e) {
    if (!accepted(e)) std::abort();
  }
  try {
    for (const auto& shard : bp::hub::parse_index_shards(text, "fuzz-index.json", "org/fuzz"))
      if (!bp::hub::remote_file_problem(shard).empty()) std::abort();
  } catch (const bp::Error& e) {
    if (!accepted(e)) std::abort();
  }
  return 0;
}
