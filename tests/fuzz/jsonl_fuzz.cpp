// libFuzzer target for the dataset reader (not part of the gtest build; tests/CMakeLists.txt only
// globs *_test.cpp). The deterministic gtest counterpart is tests/text/dataset_mutation_test.cpp.
//
// Build and run: see docs/fuzzing.md; tests/fuzz/fuzz_replay_test.cpp replays it in CI.
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

namespace {
void parse_once(std::string_view content, const char* name, bp::DatasetFormat format) {
  try {
    bp::DatasetLoadOptions opts;
    opts.format = format;
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
}  // namespace

// Four parses per input (it was ten: every format for both file kinds, 62 executions/s): format
// detection on JSONL, one forced format chosen by the input's size (so the corpus covers all six
// over its inputs), plain-text paragraphs, and the same bytes as a CSV file (text/dataset_csv.cpp:
// quotes, line breaks in fields, header checks).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view content(reinterpret_cast<const char*>(data), size);
  const bp::DatasetFormat forced[] = {bp::DatasetFormat::ShareGPT,   bp::DatasetFormat::OpenAI,
                                      bp::DatasetFormat::Alpaca,     bp::DatasetFormat::Text,
                                      bp::DatasetFormat::Preference, bp::DatasetFormat::Unpaired};
  parse_once(content, "fuzz.jsonl", bp::DatasetFormat::Auto);
  parse_once(content, "fuzz.jsonl", forced[size % 6]);
  parse_once(content, "fuzz.txt", bp::DatasetFormat::Auto);
  parse_once(content, "fuzz.csv", bp::DatasetFormat::Auto);
  return 0;
}
