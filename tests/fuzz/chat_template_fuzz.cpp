// libFuzzer target for chat templates (the Jinja subset, text/chat_template.h): the input is a
// template source, rendered over a fixed conversation. The property: any template renders, falls
// back to ChatML, or throws bp::Error (never RUNTIME_INTERNAL), and never crashes. Inputs are
// capped at 4 KiB so one execution stays short (run-time budgets for hostile templates are their
// own issue).
//
// Build and run: see docs/fuzzing.md; tests/fuzz/fuzz_replay_test.cpp replays it in CI.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  const std::string source(reinterpret_cast<const char*>(data), size);
  const bp::Conversation conv = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
  try {
    const bp::ChatTemplate t(source, "<s>", "</s>");
    (void)t.render(conv, true);
    (void)t.render(conv, false);
  } catch (const bp::Error& e) {
    if (e.code() == bp::ErrorCode::RUNTIME_INTERNAL) std::abort();
  }
  return 0;
}
