// The dataset reader over a few thousand deterministic random mutations of a valid file (the
// in-CI counterpart of tests/fuzz/jsonl_fuzz.cpp): never a crash, only catalog errors, every
// record accounted for as a row or an issue with a line number inside the file, and the good rows
// tokenize and pack.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/error.h"
#include "text/data_test_util.h"
#include "text/dataset.h"
#include "text/packing.h"

namespace bp::test {
namespace {

const char* kValid =
    R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi ✓"}, {"role": "assistant", "content": "Yo"}]})"
    "\n"
    R"({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A\n\"quoted\""}]})"
    "\n"
    R"({"instruction": "Do", "input": "it", "output": "Done", "system": "sys"})"
    "\n"
    R"({"text": "plain text row"})"
    "\n"
    R"([{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}])"
    "\n";

// Preference rows of every form (issue 38), and a KTO row.
const char* kValidPreference =
    R"({"prompt": "Q ✓", "chosen": "good", "rejected": "bad"})"
    "\n"
    R"({"prompt": [{"role": "user", "content": "Q"}], "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]})"
    "\n"
    R"({"chosen": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "a"}], "rejected": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "b"}]})"
    "\n"
    R"({"prompt": "Q", "completion": "c", "label": false})"
    "\n";

struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  size_t below(size_t n) { return n ? static_cast<size_t>(next() % n) : 0; }
};

std::string mutate(std::string s, Rng& r) {
  static const std::string kInteresting = "{}[]\":,\\\n \t0-1eE.nulltruefalse\xC3\xFF\xED\xA0\x80";
  const int edits = 1 + static_cast<int>(r.below(4));
  for (int e = 0; e < edits; ++e) {
    const size_t pos = r.below(s.size() + 1);
    switch (r.below(8)) {
      case 7:  // turn the file into a (usually broken) JSON array
        s.insert(s.begin(), '[');
        break;
      case 0:  // flip a byte
        if (!s.empty()) s[r.below(s.size())] = static_cast<char>(r.next());
        break;
      case 1:  // insert an interesting byte
        s.insert(pos, 1, kInteresting[r.below(kInteresting.size())]);
        break;
      case 2:  // delete a range
        s.erase(pos, 1 + r.below(16));
        break;
      case 3: {  // duplicate a range
        const size_t from = r.below(s.size() + 1);
        s.insert(pos, s.substr(from, 1 + r.below(40)));
        break;
      }
      case 4:  // truncate
        s.resize(pos);
        break;
      case 5:  // deep nesting
        s.insert(pos, std::string(1 + r.below(200), r.below(2) ? '[' : '{'));
        break;
      default:  // swap a key for another known one
        if (auto k = s.find("\"role\""); k != std::string::npos) s.replace(k, 6, r.below(2) ? "\"from\"" : "\"text\"");
        break;
    }
  }
  return s;
}

// Parses `iterations` mutations of `valid` (formats in turn) and checks the contract; counts the
// rows and issues seen.
void mutate_and_check(const char* valid, const std::vector<DatasetFormat>& formats, int iterations, uint64_t seed,
                      int* rows_seen, int* issues_seen) {
  const auto level = spdlog::get_level();
  spdlog::set_level(spdlog::level::err);  // thousands of "skipped/truncated" warnings otherwise
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>"});
  ChatTemplate tmpl("", "", "");
  Rng rng{seed};
  for (int iter = 0; iter < iterations; ++iter) {
    const std::string content = mutate(valid, rng);
    const int64_t lines = 1 + std::count(content.begin(), content.end(), '\n');
    const DatasetFormat fmt = formats[static_cast<size_t>(iter) % formats.size()];
    const char* name = iter % 7 == 0 ? "m.txt" : "m.jsonl";
    try {
      const LoadedDataset ds = parse_dataset(content, name, {.format = fmt, .max_length = 40});
      ASSERT_EQ(static_cast<int64_t>(ds.rows.size() + ds.issues.size()), ds.total_rows) << content;
      for (const auto& i : ds.issues) {
        ASSERT_GE(i.line, 1) << content;
        ASSERT_LE(i.line, lines) << content;
        ASSERT_FALSE(i.message.empty());
      }
      for (const auto& row : ds.rows) ASSERT_TRUE(row.is_text ? is_valid_utf8(row.text) : !row.conv.empty());
      *rows_seen += static_cast<int>(ds.rows.size());
      *issues_seen += static_cast<int>(ds.issues.size());
      const TokenizedDataset td = tokenize_dataset(ds, tok, tmpl, {.max_seq_length = 48});
      std::vector<const Sample*> ptrs;
      for (const auto& s : td.samples) ptrs.push_back(&s);
      if (!ptrs.empty()) {
        const PackedBatch b = pack_samples(ptrs);
        ASSERT_EQ(b.cu_seqlens.back(), b.num_tokens());
      }
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), ErrorCode::INPUT_DATASET_PARSE_FAILED) << e.what() << "\n" << content;
    }
  }
  spdlog::set_level(level);
}

TEST(DatasetMutation, ThousandsOfMutationsNeverCrash) {
  struct Case {
    const char* valid;
    std::vector<DatasetFormat> formats;
    int iterations;
    uint64_t seed;
    int at_least;  // rows and issues each: the mutations exercise both paths
  };
  const Case cases[] = {
      {kValid, {DatasetFormat::Auto, DatasetFormat::OpenAI, DatasetFormat::Text}, 3000, 0x9E3779B97F4A7C15ull, 1000},
      {kValidPreference,
       {DatasetFormat::Auto, DatasetFormat::Preference, DatasetFormat::Unpaired},
       1500,
       0x2545F4914F6CDD1Dull,
       300}};
  for (const Case& c : cases) {
    int rows_seen = 0, issues_seen = 0;
    mutate_and_check(c.valid, c.formats, c.iterations, c.seed, &rows_seen, &issues_seen);
    EXPECT_GT(rows_seen, c.at_least) << c.valid;
    EXPECT_GT(issues_seen, c.at_least) << c.valid;
  }
}

}  // namespace
}  // namespace bp::test
