// The demo base model shipped in models/tiny-chat (issue 8): its tokenizer, chat template and
// config agree with each other and with an independent tokenizer (@huggingface/tokenizers via
// tests/oracles/tokenize.mjs), and the trained weights load, fit the size budget and speak.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/generate.h"
#include "model/loader.h"
#include "support/test_util.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace bp {
namespace {

using nlohmann::json;

std::string demo_dir() {
  return test::source_dir() + "/models/tiny-chat";
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  return json::parse(f);
}

const Conversation kConv = {{"user", "Tom has a red ball. What does Tom have?"}, {"assistant", "Answer: a red ball."}};

TEST(DemoModel, ChatTemplateRendersChatMLWithSeparatorTokens) {
  auto tok = Tokenizer::from_dir(demo_dir());
  const ChatTemplate tmpl = ChatTemplate::from_tokenizer(*tok);
  ASSERT_FALSE(tmpl.is_fallback()) << tmpl.warning();
  EXPECT_EQ(tmpl.render(kConv, false),
            "<s><|im_start|>user<|im_sep|>Tom has a red ball. What does Tom have?<|im_end|>"
            "<|im_start|>assistant<|im_sep|>Answer: a red ball.<|im_end|>");
  EXPECT_EQ(tmpl.render({kConv[0]}, true),
            "<s><|im_start|>user<|im_sep|>Tom has a red ball. What does Tom have?<|im_end|>"
            "<|im_start|>assistant<|im_sep|>");
}

TEST(DemoModel, SpecialTokensHaveTheirOwnIdsAndRoundTrip) {
  auto tok = Tokenizer::from_dir(demo_dir());
  EXPECT_EQ(tok->vocab_size(), 515);
  EXPECT_EQ(tok->token_to_id("<|im_start|>"), 512);
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), 513);
  EXPECT_EQ(tok->token_to_id("<|im_sep|>"), 514);
  for (int32_t id : {1, 2, 512, 513, 514}) EXPECT_TRUE(tok->is_special(id)) << id;
  EXPECT_EQ(tok->bos_id(), 1);
  ASSERT_FALSE(tok->eos_ids().empty());
  EXPECT_EQ(tok->eos_ids()[0], 513);  // <|im_end|> ends turns and text rows

  const ChatTemplate tmpl = ChatTemplate::from_tokenizer(*tok);
  const std::string text = tmpl.render(kConv, false);
  const std::vector<int32_t> ids = tok->encode(text, false);
  ASSERT_GE(ids.size(), 8u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 512);
  EXPECT_EQ(ids.back(), 513);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 514), 2);
  // Words after a special token get the same "▁word" token as inside a sentence.
  const std::vector<int32_t> answer = tok->encode("Answer: a red ball.", false);
  const std::vector<int32_t> tail(ids.end() - 1 - static_cast<std::ptrdiff_t>(answer.size()), ids.end() - 1);
  EXPECT_EQ(tail, answer);
  EXPECT_EQ(tok->decode(answer, true), "Answer: a red ball.");

  // Loss mask: exactly the answer and its <|im_end|>.
  const TokenizedConversation tc = tokenize_conversation(tmpl, *tok, kConv);
  ASSERT_EQ(tc.ids, ids);
  const size_t n_loss = static_cast<size_t>(std::count(tc.loss_mask.begin(), tc.loss_mask.end(), 1));
  EXPECT_EQ(n_loss, answer.size() + 1);
  for (size_t i = ids.size() - n_loss; i < ids.size(); ++i) EXPECT_EQ(tc.loss_mask[i], 1) << i;
}

TEST(DemoModel, ConfigAgreesWithTheTokenizer) {
  auto tok = Tokenizer::from_dir(demo_dir());
  const ModelConfig cfg = load_model_config(demo_dir());
  EXPECT_EQ(cfg.vocab_size, tok->vocab_size());
  EXPECT_EQ(cfg.bos_token_id, tok->bos_id());
  ASSERT_FALSE(cfg.eos_token_ids.empty());
  EXPECT_EQ(cfg.eos_token_ids[0], tok->eos_ids()[0]);
  const json tc = read_json(demo_dir() + "/tokenizer_config.json");
  EXPECT_EQ(tc.at("model_max_length").get<int64_t>(), cfg.max_position_embeddings);
}

// The same ids as @huggingface/tokenizers on rendered chats and corpus-like text.
TEST(DemoModel, TokenizerMatchesHuggingFaceTokenizers) {
  std::string out;
  ASSERT_EQ(test::run_command("command -v node", &out), 0)
      << "node is not installed: the tokenizer oracle needs Node.js, then `cd tests/oracles && npm ci`";
  test::TempDir dir;
  auto tok = Tokenizer::from_dir(demo_dir());
  const ChatTemplate tmpl = ChatTemplate::from_tokenizer(*tok);
  const std::vector<std::string> corpus = {
      tmpl.render(kConv, false),
      tmpl.render({kConv[0]}, true),
      tmpl.render({{"user", "Hi!"}, {"assistant", "Hello!"}, {"user", "Tell me a story."}}, true),
      "Once upon a time, there was a little girl named Lily. \"Where is my ball?\" she cried.",
      "<|im_start|>user<|im_sep|>What do bunnies eat?<|im_end|><|im_start|>assistant<|im_sep|>Bunnies eat carrots.",
      "Kate has an orange lamp.\n\nWhat pet does Eric have?",
  };
  {
    std::ofstream f(dir.path + "/corpus.json");
    f << json(corpus).dump();
  }
  const std::string src = test::source_dir();
  const std::string cmd = "cd " + src + "/tests/oracles && node tokenize.mjs --corpus " + dir.path +
                          "/corpus.json --out " + dir.path + " --model demo=" + demo_dir();
  ASSERT_EQ(test::run_command(cmd, &out), 0) << "tokenizer oracle failed (run `cd tests/oracles && npm ci`):\n"
                                             << cmd << "\n"
                                             << out;
  const json expected = read_json(dir.path + "/demo/expected.json");
  ASSERT_EQ(expected.size(), corpus.size());
  for (size_t k = 0; k < corpus.size(); ++k) {
    EXPECT_EQ(json(tok->encode(corpus[k], false)).dump(), expected[k].at("ids").dump()) << corpus[k];
    EXPECT_EQ(json(tok->encode(corpus[k], true)).dump(), expected[k].at("ids_special").dump()) << corpus[k];
    EXPECT_EQ(tok->decode(expected[k].at("ids_special").get<std::vector<int32_t>>(), true),
              expected[k].at("decoded_skip").get<std::string>())
        << corpus[k];
  }
}

}  // namespace
}  // namespace bp
