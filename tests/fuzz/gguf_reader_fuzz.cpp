// libFuzzer target for the GGUF reader (io/gguf_reader.h), parsing an in-memory image. The
// property: any input either parses into tensors whose bytes lie inside the input, or throws
// bp::Error(DEP_MODEL_LOAD_FAILED). Small tensors are dequantized so ASan checks every byte read.
// Any other exception, crash, out-of-bounds read or UBSan report (the element count once
// overflowed 64 bits; zero-size tensors once reached memcpy(NULL, ..., 0)) is a bug.
//
// Build and run: see docs/fuzzing.md. tests/fuzz/fuzz_replay_test.cpp runs this target over a
// seed corpus and deterministic mutations in CI.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "io/gguf_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const bp::GGUFReader r(data, size, "fuzz.gguf");
    for (const bp::GGUFTensorInfo& t : r.tensors()) {
      if (t.data < data || t.data + t.nbytes > data + size) std::abort();
      if (t.numel() <= (int64_t{1} << 16)) {
        const std::vector<float> v = r.dequantize(t);
        if (static_cast<int64_t>(v.size()) != t.numel()) std::abort();
      }
    }
  } catch (const bp::Error& e) {
    if (e.code() != bp::ErrorCode::DEP_MODEL_LOAD_FAILED) std::abort();
  }
  return 0;
}
