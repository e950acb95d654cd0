// Tokenizer unit tests on the real stories260K tokenizer (golden ids from llama2.c's run.c) and
// on small hand-made tokenizer.json files for the error paths and the added-token flags.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/test_util.h"

namespace bp {
namespace {

using nlohmann::json;

std::string stories_dir() {
  return test::shared_dir() + "/models/stories260K";
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

TEST(Tokenizer, Stories260KMatchesGoldenPromptIds) {
  auto tok = Tokenizer::from_dir(stories_dir());
  const json golden = read_json(stories_dir() + "/golden/greedy.json");
  ASSERT_GE(golden.at("samples").size(), 3u);
  for (const auto& s : golden["samples"]) {
    const auto prompt = s.at("prompt").get<std::string>();
    const auto input_ids = s.at("input_ids").get<std::vector<int32_t>>();
    EXPECT_EQ(tok->encode(prompt, /*add_special=*/true), input_ids) << prompt;
    // Without add_special the BOS is absent and nothing else changes.
    EXPECT_EQ(tok->encode(prompt, false), std::vector<int32_t>(input_ids.begin() + 1, input_ids.end())) << prompt;
    std::vector<int32_t> all = input_ids;
    const auto out = s.at("output_ids").get<std::vector<int32_t>>();
    all.insert(all.end(), out.begin(), out.end());
    EXPECT_EQ(tok->decode(all, /*skip_special=*/true), s.at("text").get<std::string>()) << prompt;
  }
}

TEST(Tokenizer, Stories260KSpecialTokensAndConfig) {
  auto tok = Tokenizer::from_dir(stories_dir());
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  ASSERT_EQ(tok->eos_ids().size(), 1u);
  EXPECT_EQ(tok->eos_ids()[0], 2);
  EXPECT_EQ(tok->pad_id(), -1);
  EXPECT_TRUE(tok->is_special(1));
  EXPECT_FALSE(tok->is_special(403));
  EXPECT_EQ(tok->token_to_id("<0x0A>"), 13);
  EXPECT_EQ(tok->id_to_token(13), "<0x0A>");
  EXPECT_EQ(tok->token_to_id("no such token"), -1);
  // "</s>" inside text is the special token, never split into pieces.
  const auto ids = tok->encode("a</s>b", false);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 2), ids.end());
  EXPECT_EQ(tok->decode(ids), "a</s> b");  // each side gets its own ▁; the decoder strips the first
  EXPECT_EQ(tok->decode(ids, true), "a b");
  // Characters missing from the 512-token vocab fall back to UTF-8 byte tokens and decode back.
  const std::string cjk = "\xE6\x97\xA5\xE6\x9C\xAC";  // 日本
  const auto cjk_ids = tok->encode(cjk, false);
  EXPECT_EQ(cjk_ids.size(), 7u);  // ▁ + 6 bytes
  EXPECT_EQ(tok->decode(cjk_ids), cjk);
}

TEST(Tokenizer, MissingFileNamesIt) {
  test::TempDir dir;
  try {
    Tokenizer::from_dir(dir.path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
    EXPECT_NE(std::string(e.what()).find(dir.path + "/tokenizer.json"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, InvalidJsonNamesFile) {
  test::TempDir dir;
  const std::string path = dir.path + "/tokenizer.json";
  write_file(path, "{\"model\": {\"type\": \"BPE\", ");
  try {
    Tokenizer::from_file(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("JSON"), std::string::npos) << e.what();
  }
  // Valid JSON of the wrong shape is also a load error, not a crash.
  write_file(path, R"({"model": {"type": "BPE", "vocab": [1, 2], "merges": []}})");
  EXPECT_THROW(Tokenizer::from_file(path), Error);
}

TEST(Tokenizer, UnsupportedModelTypeSaysWhatIsSupported) {
  test::TempDir dir;
  const std::string path = dir.path + "/tokenizer.json";
  for (const char* type : {"WordPiece", "Unigram"}) {
    write_file(path, std::string(R"({"model": {"type": ")") + type + R"(", "vocab": {"a": 0}}})");
    try {
      Tokenizer::from_file(path);
      FAIL() << "expected an error for " << type;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
      const std::string msg = e.what();
      EXPECT_NE(msg.find(type), std::string::npos) << msg;
      EXPECT_NE(msg.find("supported: BPE"), std::string::npos) << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace bp
