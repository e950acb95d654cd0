// Issue 15 and issue 13 on chat templates: the one reader of a model folder's template (the
// .jinja file wins over tokenizer_config.json), --chat-template FILE|chatml, refusal (never a silent
// ChatML) of a template we cannot run, the render budget against hostile templates, generation
// blocks as the loss mask, and work bounded by what training keeps (100,000-turn and multi-MB rows).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "support/expect_error.h"
#include "text/chat_template.h"
#include "text/data_test_util.h"
#include "text/dataset.h"

namespace bp::test {
namespace {

const char* kTurnTemplate =
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}[assistant]{% "
    "endif %}";

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(ChatTemplateSource, JinjaFileWinsOverTokenizerConfigKey) {
  TempDir dir;
  write(dir.path + "/tokenizer_config.json", R"({"chat_template": "from json {{ messages | length }}"})");
  ChatTemplateSource s = read_model_chat_template(dir.path);
  EXPECT_EQ(s.kind, ChatTemplateSource::Kind::ModelConfigKey);
  EXPECT_EQ(s.text, "from json {{ messages | length }}");
  write(dir.path + "/chat_template.jinja", "from file {{ messages | length }}");
  s = read_model_chat_template(dir.path);
  EXPECT_EQ(s.kind, ChatTemplateSource::Kind::ModelFile);
  EXPECT_EQ(s.text, "from file {{ messages | length }}");
  EXPECT_NE(s.describe().find("chat_template.jinja"), std::string::npos) << s.describe();
  EXPECT_STREQ(s.kind_name(), "file");
}

TEST(ChatTemplateSource, ListOfNamedTemplatesPicksDefault) {
  TempDir dir;
  write(dir.path + "/tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(read_model_chat_template(dir.path).text, "D");
  write(dir.path + "/tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "R"}]})");
  EXPECT_EQ(read_model_chat_template(dir.path).text, "R");
}

TEST(ChatTemplateSource, NoTemplateIsChatMLDefaultWithWarning) {
  TempDir dir;
  write(dir.path + "/tokenizer_config.json", R"({"eos_token": "</s>"})");
  const ChatTemplateSource s = read_model_chat_template(dir.path);
  EXPECT_EQ(s.kind, ChatTemplateSource::Kind::ChatMLDefault);
  ChatTemplate t(s, "", "");
  EXPECT_TRUE(t.is_fallback());
  EXPECT_NE(t.warning().find("ChatML"), std::string::npos);
  EXPECT_EQ(t.render({{"user", "hi"}}, false), "<|im_start|>user\nhi<|im_end|>\n");
}

TEST(ChatTemplateSource, ChatTemplateFlagChoosesFileOrChatML) {
  TempDir dir;
  const ChatTemplateSource own{ChatTemplateSource::Kind::ModelConfigKey, "OWN{{ messages[0].content }}", "x"};
  EXPECT_EQ(choose_chat_template(own, "").text, own.text);
  const ChatTemplateSource chatml = choose_chat_template(own, "chatml");
  EXPECT_EQ(chatml.kind, ChatTemplateSource::Kind::Explicit);
  ChatTemplate t(chatml, "", "");
  EXPECT_FALSE(t.is_fallback());  // chosen, so no warning
  EXPECT_TRUE(t.warning().empty());
  EXPECT_EQ(t.render({{"user", "hi"}}, false), "<|im_start|>user\nhi<|im_end|>\n");
  write(dir.path + "/mine.jinja", "MINE{{ messages[0].content }}");
  ChatTemplate f(choose_chat_template(own, dir.path + "/mine.jinja"), "", "");
  EXPECT_EQ(f.render({{"user", "hi"}}, false), "MINEhi");
  EXPECT_EQ(f.source().describe(), "--chat-template " + dir.path + "/mine.jinja");
  EXPECT_EQ(code_of([&] { choose_chat_template(own, dir.path + "/missing.jinja"); }),
            ErrorCode::INPUT_VALIDATION_FAILED);
}

TEST(ChatTemplateSource, TokenizerFromDirReadsTheJinjaFile) {
  // A model folder written by current transformers: the template only in chat_template.jinja.
  TempDir dir;
  const std::string model = shared_dir() + "/models/stories260K";
  ASSERT_TRUE(std::filesystem::exists(model + "/tokenizer.json"));
  std::filesystem::copy_file(model + "/tokenizer.json", dir.path + "/tokenizer.json");
  write(dir.path + "/chat_template.jinja", kTurnTemplate);
  auto tok = Tokenizer::from_dir(dir.path);
  EXPECT_EQ(tok->chat_template(), kTurnTemplate);
  ChatTemplate t = ChatTemplate::from_tokenizer(*tok);
  EXPECT_EQ(t.render({{"user", "a"}}, true), "[user]a</s>[assistant]");
}

TEST(ChatTemplateSource, UnrunnableTemplateIsRefusedNamingConstructAndLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% include 'other.jinja' %}", "statement 'include'"},
      {"{% for m in messages %}\n{{ m.content | wordcount }}{% endfor %}", "filter 'wordcount'"},
      {"{% for m in messages %}{{ m.content.zfill(4) }}{% endfor %}", "method 'zfill'"},
      {"{# a\ncomment #}\n{% for m in messages %}{% if m is divisibleby3 %}{% endif %}{% endfor %}",
       "test 'divisibleby3'"},
      {"{% for m in messages %}{{ m.content }", "unterminated tag"},
  };
  for (const auto& c : cases) {  // not a structured binding: clang 14 cannot capture one in the lambda
    const char* src = c.first;
    const char* construct = c.second;
    SCOPED_TRACE(src);
    std::string msg;
    EXPECT_EQ(code_of([&] { ChatTemplate(src, "", ""); }, &msg), ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED);
    EXPECT_NE(msg.find(construct), std::string::npos) << msg;
    EXPECT_NE(msg.find("template line"), std::string::npos) << msg;
  }
  std::string msg;
  code_of([&] { ChatTemplate("{# one\ntwo #}\n\n{{ x | nofilter }}", "", ""); }, &msg);
  EXPECT_NE(msg.find("template line 4"), std::string::npos) << msg;  // comment newlines count
}

TEST(ChatTemplateBudget, HostileTemplatesStopWithTheBudgetCode) {
  const jinja::RenderLimits small{.max_steps = 200000, .max_bytes = 1 << 20};
  const char* hostile[] = {
      // nested range(100000) loops
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
      // tojson of a self-doubling list
      ("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}"
       "{{ ns.l | tojson }}"),
      // a string doubled 40 times
      "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
      "{{ 'x' * 100000000 }}",
      "{% set l = [1] %}{% for i in range(10) %}{{ l.append(l) }}{% endfor %}{{ l | tojson }}",
  };
  for (const char* src : hostile) {
    SCOPED_TRACE(src);
    const ChatTemplateSource s{ChatTemplateSource::Kind::ModelFile, src, "/m/chat_template.jinja"};
    std::string msg;
    const ErrorCode code = code_of([&] { ChatTemplate(s, "", "", small); }, &msg);
    EXPECT_TRUE(code == ErrorCode::INPUT_CHAT_TEMPLATE_BUDGET || code == ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED)
        << msg;
    EXPECT_NE(msg.find("/m/chat_template.jinja"), std::string::npos) << msg;  // names the template
  }
  // Smaller loops of the same shape fit the same budget: the limit, not the construct, stopped them.
  const ChatTemplateSource fine{ChatTemplateSource::Kind::ModelFile,
                                "{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}ok", "f"};
  EXPECT_EQ(ChatTemplate(fine, "", "", small).render({{"user", "u"}}, false), "ok");
}

TEST(ChatTemplateBudget, BudgetIsASetting) {
  // data.template_max_steps reaches the renderer: the same template passes with a larger budget.
  const ChatTemplateSource s{ChatTemplateSource::Kind::ModelFile,
                             "{% for i in range(3000) %}{% endfor %}{{ messages[0].content }}", "f"};
  EXPECT_EQ(code_of([&] { ChatTemplate(s, "", "", {.max_steps = 2000, .max_bytes = 1 << 20}); }),
            ErrorCode::INPUT_CHAT_TEMPLATE_BUDGET);
  EXPECT_EQ(ChatTemplate(s, "", "", {.max_steps = 100000, .max_bytes = 1 << 20}).render({{"user", "u"}}, false), "u");
  const ChatTemplateSource big{ChatTemplateSource::Kind::ModelFile, "{{ messages[0].content * 3000 }}", "f"};
  EXPECT_EQ(code_of([&] { ChatTemplate(big, "", "", {.max_steps = 100000, .max_bytes = 2000}); }),
            ErrorCode::INPUT_CHAT_TEMPLATE_BUDGET);
}

// A tokenizer that counts the bytes it was asked to encode: work done, measured without a clock.
class CountingTokenizer : public FakeTokenizer {
 public:
  using FakeTokenizer::FakeTokenizer;
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const override {
    bytes_encoded += text.size();
    return FakeTokenizer::encode(text, add_special);
  }
  mutable size_t bytes_encoded = 0;
};

TEST(ChatTemplateCost, HundredThousandTurnsCostWhatTrainingKeeps) {
  CountingTokenizer tok({"</s>"}, kTurnTemplate);
  ChatTemplate tmpl = ChatTemplate::from_tokenizer(tok);
  Conversation conv;
  for (int k = 0; k < 100000; ++k) conv.push_back({k % 2 ? "assistant" : "user", k % 2 ? "yes" : "q?"});
  TokenizedConversation tc = tokenize_conversation(tmpl, tok, conv, false, 64);
  EXPECT_TRUE(tc.cut);
  ASSERT_GE(tc.ids.size(), 64u);
  // The quadratic algorithm encodes every prefix: ~100,000^2 / 2 * 12 bytes. Bounded work: a few
  // windows of 16 bytes per kept token, per assistant turn inside the window.
  EXPECT_LT(tok.bytes_encoded, 2'000'000u) << tok.bytes_encoded;
  // The mask inside the window equals that of the whole computation on the same window.
  const Conversation head(conv.begin(), conv.begin() + 12);
  TokenizedConversation whole = tokenize_conversation(tmpl, tok, head);
  for (size_t t = 0; t < 64; ++t) EXPECT_EQ(tc.loss_mask[t], whole.loss_mask[t]) << t;
  EXPECT_EQ(std::vector<int32_t>(tc.ids.begin(), tc.ids.begin() + 64),
            std::vector<int32_t>(whole.ids.begin(), whole.ids.begin() + 64));
}

TEST(ChatTemplateCost, HugeRowIsTokenizedOnlyUpToMaxSeqLength) {
  CountingTokenizer tok({"</s>"}, kTurnTemplate, -1, 0);
  ChatTemplate tmpl = ChatTemplate::from_tokenizer(tok);
  std::string huge;
  for (int k = 0; huge.size() < 8'000'000; ++k) huge += "word" + std::to_string(k % 97) + " ";
  LoadedDataset ds;
  ds.rows.push_back(DatasetRow{});
  ds.rows[0].line = 1;
  ds.rows[0].is_text = true;
  ds.rows[0].text = huge;
  ds.rows.push_back(DatasetRow{});
  ds.rows[1].line = 2;
  ds.rows[1].conv = {{"user", huge}, {"assistant", "ok"}};
  TokenizedDataset td = tokenize_dataset(ds, tok, tmpl, {.max_seq_length = 64});
  ASSERT_EQ(td.samples.size(), 1u);  // the chat row's assistant turn lies past the 64 kept tokens
  EXPECT_EQ(td.samples[0].ids.size(), 64u);
  EXPECT_EQ(td.truncated, 2);
  EXPECT_EQ(td.truncated_uncounted, 2);  // neither row was tokenized past the limit
  EXPECT_EQ(std::vector<int32_t>(td.samples[0].ids.begin(), td.samples[0].ids.end()),
            tok.FakeTokenizer::encode(huge.substr(0, 64)));
  EXPECT_LT(tok.bytes_encoded, 200'000u) << tok.bytes_encoded;  // not 16 MB
}

TEST(ChatTemplateCost, EncodePrefixAgreesWithWholeEncodeOnARealTokenizer) {
  const std::string model = shared_dir() + "/models/stories260K";
  ASSERT_TRUE(std::filesystem::exists(model + "/tokenizer.json"));
  auto tok = Tokenizer::from_dir(model);
  std::string text;
  for (int k = 0; text.size() < 60000; ++k)
    text += "Once upon a time, a little girl named Lily saw " + std::to_string(k) + " birds. ";
  const std::vector<int32_t> whole = tok->encode(text, true);
  for (size_t keep : {1u, 17u, 64u, 700u}) {
    bool cut = false;
    const std::vector<int32_t> part = encode_prefix(*tok, text, true, keep, &cut);
    EXPECT_TRUE(cut);
    ASSERT_EQ(part.size(), keep + 1);
    EXPECT_EQ(part, std::vector<int32_t>(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(keep + 1)));
  }
  bool cut = true;
  EXPECT_EQ(encode_prefix(*tok, "short", true, 64, &cut), tok->encode("short", true));
  EXPECT_FALSE(cut);
}

TEST(ChatTemplateGeneration, GenerationBlocksAreTheLossMask) {
  // A fine-tuning template that marks the assistant text itself (transformers'
  // return_assistant_tokens_mask): only what lies inside {% generation %} is trained.
  const char* src =
      "{% for m in messages %}{% if m.role == 'assistant' %}<A>{% generation %}{{ m.content }}</s>{% endgeneration "
      "%}{% else %}<U>{{ m.content }}</s>{% endif %}{% endfor %}";
  FakeTokenizer tok({"</s>", "<A>", "<U>"});
  ChatTemplate tmpl(src, "", "");
  EXPECT_TRUE(tmpl.uses_generation_blocks());
  TokenizedConversation tc =
      tokenize_conversation(tmpl, tok, {{"user", "hi"}, {"assistant", "yo"}, {"user", "x"}, {"assistant", "ok"}});
  std::string trained;
  for (size_t t = 0; t < tc.ids.size(); ++t)
    if (tc.loss_mask[t]) trained += tok.id_to_token(tc.ids[t]);
  EXPECT_EQ(trained, "yo</s>ok</s>");
  EXPECT_FALSE(ChatTemplate(kTurnTemplate, "", "").uses_generation_blocks());
}

}  // namespace
}  // namespace bp::test
