// libFuzzer target for the dataset reader (not part of the gtest build; tests/CMakeLists.txt only
// globs *_test.cpp). The deterministic gtest counterpart is tests/text/dataset_mutation_test.cpp.
//
// Build and run (clang with libFuzzer), from the repository root after a normal build:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Isrc -Ibuild/generated \
//     tests/fuzz/jsonl_fuzz.cpp src/text/dataset*.cpp src/text/data_cursor.cpp src/text/packing.cpp
//     src/text/chat_template.cpp \
//     src/text/jinja_*.cpp -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL \
//     src/core/error.cpp -lfmt -lspdlog -o build/jsonl_fuzz
//   ./build/jsonl_fuzz -max_total_time=60
//
// Contract checked: whatever the bytes, parsing never crashes, never throws anything but
// bp::Error(INPUT_DATASET_PARSE_FAILED) (JSON objects of no known format), and every record ends
// up as either a good row or a reported issue.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "text/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view content(reinterpret_cast<const char*>(data), size);
  const bp::DatasetFormat formats[] = {bp::DatasetFormat::Auto, bp::DatasetFormat::ShareGPT, bp::DatasetFormat::OpenAI,
                                       bp::DatasetFormat::Alpaca, bp::DatasetFormat::Text};
  for (const char* name : {"fuzz.jsonl", "fuzz.txt"}) {
    for (bp::DatasetFormat f : formats) {
      try {
        bp::DatasetLoadOptions opts;
        opts.format = f;
        opts.max_length = 64;
        const bp::LoadedDataset ds = bp::parse_dataset(content, name, opts);
        if (static_cast<int64_t>(ds.rows.size() + ds.issues.size()) != ds.total_rows) std::abort();
        try {
          bp::check_dataset(ds, false);
        } catch (const bp::Error& e) {
          if (e.code() != bp::ErrorCode::INPUT_DATASET_INVALID) std::abort();
        }
      } catch (const bp::Error& e) {
        if (e.code() != bp::ErrorCode::INPUT_DATASET_PARSE_FAILED) std::abort();
      }
    }
  }
  return 0;
}
