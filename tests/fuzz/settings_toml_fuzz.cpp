// libFuzzer target for the TOML settings file (core/settings.h, Settings::apply_toml_string). The
// property: any input is applied or throws bp::Error(CONFIG_INVALID or CONFIG_INVALID_SETTING).
//
// Build and run: see docs/fuzzing.md; tests/fuzz/fuzz_replay_test.cpp replays it in CI.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "core/settings.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    bp::Settings s;
    s.apply_toml_string(text, "fuzz.toml");
    (void)s.to_json();
  } catch (const bp::Error& e) {
    if (e.code() != bp::ErrorCode::CONFIG_INVALID && e.code() != bp::ErrorCode::CONFIG_INVALID_SETTING) std::abort();
  }
  return 0;
}
