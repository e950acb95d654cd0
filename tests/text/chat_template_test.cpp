// ChatTemplate: real templates, refusal (with its code) of a template we cannot run, and loss
// masks found by rendering (assistant content + end-of-turn token count; headers do not).
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "text/data_test_util.h"

namespace bp::test {
namespace {

const Conversation kConv = {
    {"system", "Sys"}, {"user", "Q1"}, {"assistant", "A1 first"}, {"user", "Q2"}, {"assistant", "A2 second"}};

struct MaskCase {
  const char* name;
  std::vector<std::string> specials;
  int bos, eos;  // indexes into specials
  Conversation conv;
  std::vector<std::string> expected_spans;
};

TEST(ChatTemplate, LossMasksCoverAssistantTurnsOnRealTemplates) {
  const Conversation no_sys(kConv.begin() + 1, kConv.end());
  const std::vector<MaskCase> cases = {
      {"qwen2.5", {"<|im_start|>", "<|im_end|>"}, -1, 1, kConv, {"A1 first<|im_end|>\n", "A2 second<|im_end|>\n"}},
      {"smollm2", {"<|im_start|>", "<|im_end|>"}, -1, 1, kConv, {"A1 first<|im_end|>\n", "A2 second<|im_end|>\n"}},
      // The original Llama-3 template appends an assistant header to every render: not trained.
      {"llama3",
       {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
       0,
       3,
       kConv,
       {"A1 first<|eot_id|>", "A2 second<|eot_id|>"}},
      {"llama3.1",
       {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
       0,
       3,
       kConv,
       {"A1 first<|eot_id|>", "A2 second<|eot_id|>"}},
      {"gemma3",
       {"<bos>", "<start_of_turn>", "<end_of_turn>", "<eos>"},
       0,
       3,
       kConv,
       {"A1 first<end_of_turn>\n", "A2 second<end_of_turn>\n"}},
      {"mistral", {"<s>", "</s>", "[INST]", "[/INST]"}, 0, 1, no_sys, {"A1 first</s>", "A2 second</s>"}},
      // Phi-3 ends a render without generation prompt with eos: the final eos is no assistant token.
      {"phi3",
       {"<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"},
       0,
       1,
       kConv,
       {"A1 first<|end|>\n", "A2 second<|end|>\n"}},
      // Qwen3 renders earlier assistant turns without the reasoning block, so prefixes are not
      // prefixes of the full render; the last turn keeps its (empty) think block.
      {"qwen3",
       {"<|im_start|>", "<|im_end|>"},
       -1,
       1,
       kConv,
       {"A1 first<|im_end|>\n", "<think>\n\n</think>\n\nA2 second<|im_end|>\n"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    FakeTokenizer tok(c.specials, read_text_file(template_path(c.name)), c.bos, c.eos);
    ChatTemplate tmpl = ChatTemplate::from_tokenizer(tok);
    ASSERT_FALSE(tmpl.is_fallback()) << tmpl.warning();
    TokenizedConversation tc = tokenize_conversation(tmpl, tok, c.conv);
    ASSERT_EQ(tc.ids.size(), tc.loss_mask.size());
    EXPECT_EQ(tok.decode(tc.ids), tmpl.render(c.conv, false));
    EXPECT_EQ(masked_spans(tok, tc), c.expected_spans);
    // Training on everything marks every token.
    TokenizedConversation all = tokenize_conversation(tmpl, tok, c.conv, true);
    EXPECT_EQ(all.ids, tc.ids);
    EXPECT_EQ(std::count(all.loss_mask.begin(), all.loss_mask.end(), 1), static_cast<long>(all.ids.size()));
  }
}

TEST(ChatTemplate, NoTemplateMeansChatMLWithWarning) {
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>"});
  ChatTemplate tmpl = ChatTemplate::from_tokenizer(tok);
  EXPECT_TRUE(tmpl.is_fallback());
  EXPECT_NE(tmpl.warning().find("no chat template"), std::string::npos) << tmpl.warning();
  EXPECT_EQ(tmpl.render({{"user", "hi"}}, true), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, UnsupportedConstructIsRefusedNotReplacedByChatML) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% include 'other.jinja' %}", "statement 'include'"},
      {"{% for m in messages %}{{ m.content | wordcount }}{% endfor %}", "filter 'wordcount'"},
      {"{% for m in messages %}{{ m.content.zfill(4) }}{% endfor %}", "method 'zfill'"},
      {"{% for m in messages %}{% if m is divisibleby3 %}{% endif %}{% endfor %}", "test 'divisibleby3'"},
  };
  for (const auto& [src, construct] : cases) {
    SCOPED_TRACE(src);
    try {
      ChatTemplate tmpl(src, "", "");
      ADD_FAILURE() << "a template we cannot run must not become ChatML";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED);
      EXPECT_NE(std::string(e.what()).find(construct), std::string::npos) << e.what();
    }
  }
}

TEST(ChatTemplate, TemplateRejectionIsAnInputError) {
  ChatTemplate tmpl(read_text_file(template_path("mistral")), "<s>", "</s>");
  EXPECT_FALSE(tmpl.is_fallback());
  try {
    tmpl.render({{"user", "a"}, {"user", "b"}}, false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
    EXPECT_NE(std::string(e.what()).find("must alternate"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bp::test
