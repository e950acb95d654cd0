// A chat template's own failures are the template's fault, reported once with a chat-template
// error code that names it: a render budget it runs past (every string it builds counts), and an
// error inside the template (issue 37).
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"
#include "support/expect_error.h"
#include "text/chat_template.h"
#include "text/data_test_util.h"
#include "text/dataset.h"
#include "text/jinja_eval.h"

namespace bp::test {
namespace {

// Item 7: a string a template doubles in a loop stops at data.template_max_bytes, whatever
// operator builds it; before, `~` was not counted and memory grew until the process died.
TEST(ChatTemplateBudget, EveryStringTheTemplateBuildsCounts) {
  const jinja::RenderLimits small{.max_steps = 200000, .max_bytes = 1 << 20};
  const char* doubling[] = {
      "{% set s = 'x' %}{% for i in range(64) %}{% set s = s ~ s %}{% endfor %}",
      "{% set s = 'x' %}{% for i in range(26) %}{% set s = s ~ s %}{% endfor %}",  // 64 MiB unchecked
      "{% set s = 'x' %}{% for i in range(64) %}{% set s = s + s %}{% endfor %}",
      "{% set s = 'x' %}{% for i in range(64) %}{% set s = s * 2 %}{% endfor %}",
      "{% set s = 'x' %}{% for i in range(64) %}{% set s = [s, s] | join %}{% endfor %}",
      "{% set s = 'x' %}{% for i in range(64) %}{% set s = s | replace('x', 'xx') %}{% endfor %}",
      "{% set s = 'x' %}{% for i in range(64) %}{% set s %}{{ s }}{{ s }}{% endset %}{% endfor %}",
      "{% set s = 'x' %}{% for i in range(64) %}{% set s = (s ~ s) | upper %}{% endfor %}",
      "{% set s = 'x' %}{% for i in range(64) %}{% set s = [s, s] | string %}{% endfor %}",
      "{{ 'ab' * 4611686018427387904 }}",
  };
  for (const char* src : doubling) {
    SCOPED_TRACE(src);
    try {
      jinja::Template(src).render_json(nlohmann::ordered_json::object(), 0, small);
      ADD_FAILURE() << "rendered past the size budget";
    } catch (const jinja::JinjaError& e) {
      EXPECT_EQ(e.kind(), jinja::JinjaError::Kind::Budget) << e.what();
    }
    const ChatTemplateSource s{ChatTemplateSource::Kind::ModelFile, src, "/m/chat_template.jinja"};
    std::string msg;
    EXPECT_EQ(code_of([&] { ChatTemplate(s, "", "", small); }, &msg), ErrorCode::INPUT_CHAT_TEMPLATE_BUDGET) << msg;
    EXPECT_NE(msg.find("/m/chat_template.jinja"), std::string::npos) << msg;
    EXPECT_NE(msg.find("data.template_max_bytes"), std::string::npos) << msg;
  }
  // The same loops a few rounds long fit: the budget stopped them, not the construct.
  EXPECT_EQ(jinja::Template("{% set ns = namespace(s='x') %}{% for i in range(4) %}{% set ns.s = ns.s ~ ns.s %}"
                            "{% endfor %}{{ ns.s }}")
                .render_json(nlohmann::ordered_json::object(), 0, small),
            std::string(16, 'x'));
}

// Item 4: an error inside the template (here `.y` of an undefined value, on rows whose content is
// "boom") is the template's fault: INPUT_CHAT_TEMPLATE_UNSUPPORTED naming the template (not
// INPUT_VALIDATION_FAILED, a bad row's code), and a dataset stops at the first row it fails on,
// naming that row once, instead of listing every row as bad.
const char* const kFailsOnBoom =
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% if m['content'] == 'boom' %}"
    "{{ m['content']['type'].y }}{% endif %}{% endfor %}";

TEST(ChatTemplateFault, AnErrorInsideTheTemplateIsTheTemplatesFault) {
  const ChatTemplateSource src{ChatTemplateSource::Kind::ModelFile, kFailsOnBoom, "/m/chat_template.jinja"};
  const ChatTemplate t(src, "", "");
  EXPECT_EQ(t.render({{"user", "fine"}}, false), "user: fine\n");
  std::string msg;
  EXPECT_EQ(code_of([&] { t.render({{"user", "boom"}}, false); }, &msg), ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED);
  EXPECT_NE(msg.find("/m/chat_template.jinja"), std::string::npos) << msg;
  EXPECT_NE(msg.find("template line 2"), std::string::npos) << msg;
  // raise_exception stays the conversation's fault: the row is bad, the template is fine.
  const ChatTemplate strict(ChatTemplateSource{ChatTemplateSource::Kind::ModelFile,
                                               "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user "
                                               "first') }}{% endif %}ok",
                                               "/m/strict.jinja"},
                            "", "");
  EXPECT_EQ(code_of([&] { strict.render({{"assistant", "a"}}, false); }), ErrorCode::INPUT_VALIDATION_FAILED);
}

TEST(ChatTemplateFault, DatasetStopsAtTheFirstRowTheTemplateFailsOn) {
  TempDir dir;
  const std::string path = dir.path + "/d.jsonl";
  {
    std::ofstream f(path);
    f << R"({"messages": [{"role": "user", "content": "fine"}, {"role": "assistant", "content": "ok"}]})"
      << "\n";
    for (int k = 0; k < 3; ++k)
      f << R"({"messages": [{"role": "user", "content": "boom"}, {"role": "assistant", "content": "ok"}]})"
        << "\n";
  }
  const FakeTokenizer tok;
  const ChatTemplate t(ChatTemplateSource{ChatTemplateSource::Kind::ModelFile, kFailsOnBoom, "/m/chat_template.jinja"},
                       "", "");
  DatasetLoadOptions lo;
  lo.max_length = 4096;
  lo.tokenizer = &tok;
  lo.chat_template = &t;
  std::string msg;
  // What `backprop validate --model` does: one template error naming row 2, not three bad rows.
  EXPECT_EQ(code_of([&] { load_dataset(path, lo); }, &msg), ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED);
  EXPECT_NE(msg.find("/m/chat_template.jinja"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 2 of " + path), std::string::npos) << msg;
  EXPECT_EQ(msg.find("line 3"), std::string::npos) << msg;
  // What training does with rows loaded without the length check.
  const LoadedDataset ds = load_dataset(path);
  EXPECT_EQ(ds.rows.size(), 4u);
  EXPECT_EQ(code_of([&] { tokenize_dataset(ds, tok, t, {.max_seq_length = 4096}); }, &msg),
            ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED);
  EXPECT_NE(msg.find("line 2 of " + path), std::string::npos) << msg;
}

}  // namespace
}  // namespace bp::test
