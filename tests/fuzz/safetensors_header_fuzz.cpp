// libFuzzer target for the safetensors header parser (not part of the gtest globs: the file name
// does not end in _test.cpp). The property: any input either parses into entries whose byte
// ranges lie inside the input, or throws bp::Error(DEP_MODEL_LOAD_FAILED). Any other exception,
// crash or out-of-bounds read is a bug.
//
// Real fuzzing (clang only):
//   CXX=clang++ CC=clang cmake -S . -B build-fuzz -DBACKPROP_FUZZ=ON -DBACKPROP_BUILD_BENCH=OFF
//   cmake --build build-fuzz --target safetensors_header_fuzz -j2
//   ./build-fuzz/tests/fuzz/safetensors_header_fuzz -max_total_time=60
// tests/io/safetensors_fuzz_test.cpp includes this file and drives it with deterministic
// mutations of a valid header, so CI runs the same property without libFuzzer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const bp::SafetensorsHeader h = bp::parse_safetensors_header(data, size, "fuzz-input");
    for (const bp::SafetensorsEntry& e : h.entries) {
      // Every accepted range must lie inside the input; touch its bytes so ASan checks it.
      if (e.begin > e.end || h.data_offset + e.end > size) std::abort();
      volatile uint8_t sink = 0;
      for (uint64_t i = e.begin; i < e.end; i += 4096) sink = sink ^ data[h.data_offset + i];
      if (e.end > e.begin) sink = sink ^ data[h.data_offset + e.end - 1];
      (void)sink;
    }
  } catch (const bp::Error& e) {
    if (e.code() != bp::ErrorCode::DEP_MODEL_LOAD_FAILED) std::abort();
  }
  return 0;
}
