// libFuzzer target for a model's config.json (model/config.h) and the memory plan built from it
// (train/memory_plan.h, what `estimate-vram` prints). The property: any input is rejected with
// bp::Error (DEP_MODEL_LOAD_FAILED, INPUT_JSON_TOO_DEEP; INPUT_VALIDATION_FAILED from the plan)
// or gives a config whose parameter count and plan are computed without overflow (UBSan checks
// the signed arithmetic: heads x head_dim of 2^22 once overflowed 64 bits).
//
// Build and run: see docs/fuzzing.md; tests/fuzz/fuzz_replay_test.cpp replays it in CI.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "core/file_read.h"
#include "model/config.h"
#include "train/memory_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const nlohmann::json j = bp::parse_json_bounded(text, "fuzz-config.json", "config");
    if (j.is_discarded()) return 0;
    const bp::ModelConfig cfg = bp::ModelConfig::from_json(j, "fuzz-config.json");
    if (cfg.num_parameters() < 1) std::abort();
    bp::MemorySettings ms;
    ms.micro_batch_tokens = 64;
    ms.threads = 1;
    ms.lora.r = 8;
    const bp::MemoryPlan plan = bp::plan_memory(cfg, ms);
    if (plan.total() < plan.trainable) std::abort();
  } catch (const bp::Error& e) {
    if (e.code() != bp::ErrorCode::DEP_MODEL_LOAD_FAILED && e.code() != bp::ErrorCode::INPUT_JSON_TOO_DEEP &&
        e.code() != bp::ErrorCode::INPUT_VALIDATION_FAILED)
      std::abort();
  }
  return 0;
}
