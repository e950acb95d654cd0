// Jinja interpreter cases checked by hand: Python/Jinja2 semantics where @huggingface/jinja
// differs from Python (booleans print as True/False, str.strip(chars)), error kinds, and the
// whitespace-control preprocessing.
#include <gtest/gtest.h>

#include "text/jinja_eval.h"
#include "text/jinja_lexer.h"

namespace bp::jinja {
namespace {

std::string render(const std::string& src, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object()) {
  return Template(src).render_json(ctx);
}

TEST(Jinja, PythonSemanticsWhereTheNpmOracleDiffers) {
  // transformers renders with Python Jinja2: str.strip/lstrip/rstrip take a character set (Qwen3's
  // reasoning_content.strip('\n') keeps spaces), booleans and None print like Python.
  EXPECT_EQ(render("{{ 'xxhixx'.strip('x') }}|{{ '\\n  a \\n'.strip('\\n') }}|{{ '\\n\\nb'.lstrip('\\n') }}"),
            "hi|  a |b");
  EXPECT_EQ(render("{{ true }}{{ 1 > 2 }}{{ none }}"), "TrueFalseNone");
  EXPECT_EQ(render("{{ 2.0 }}|{{ 1.5 }}|{{ 7 / 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}"), "2.0|1.5|3.5|-4|2");
}

TEST(Jinja, TrimAndLstripBlocksAsTransformers) {
  EXPECT_EQ(preprocess_template("  {% if x %}\nA\n  {% endif %}\nB\n"), "{% if x %}\nA\n{% endif %}\nB");
  EXPECT_EQ(render("a\n    {%- if true %}\n  b  {% endif -%}  \nc"), "a  b  c");
}

TEST(Jinja, ErrorsHaveKinds) {
  auto kind_of = [](const std::string& src) {
    try {
      render(src, {{"m", nlohmann::ordered_json::array()}});
    } catch (const JinjaError& e) {
      return static_cast<int>(e.kind());
    }
    return -1;
  };
  EXPECT_EQ(kind_of("{% include 'x' %}"), static_cast<int>(JinjaError::Kind::Unsupported));
  EXPECT_EQ(kind_of("{{ 'x' | wordwrap }}"), static_cast<int>(JinjaError::Kind::Unsupported));
  EXPECT_EQ(kind_of("{{ 'x' is sameas_unknown_test }}"), static_cast<int>(JinjaError::Kind::Unsupported));
  EXPECT_EQ(kind_of("{{ 'x'.zfill(3) }}"), static_cast<int>(JinjaError::Kind::Unsupported));
  EXPECT_EQ(kind_of("{% if x %}no end"), static_cast<int>(JinjaError::Kind::Syntax));
  EXPECT_EQ(kind_of("{{ 'unterminated }}"), static_cast<int>(JinjaError::Kind::Syntax));
  EXPECT_EQ(kind_of("{{ m[0]['role'] }}"), static_cast<int>(JinjaError::Kind::Runtime));
  EXPECT_EQ(kind_of("{{ raise_exception('no') }}"), static_cast<int>(JinjaError::Kind::Raised));
  EXPECT_EQ(kind_of("{{ 1 / 0 }}"), static_cast<int>(JinjaError::Kind::Runtime));
}

TEST(Jinja, DeepNestingIsASyntaxErrorNotACrash) {
  for (const std::string& src : {"{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}",
                                 "{{ " + std::string(5000, '-') + "1 }}", "{{ " + std::string(5000, '[') + " }}"}) {
    try {
      render(src);
      FAIL() << "expected an error";
    } catch (const JinjaError& e) {
      EXPECT_EQ(e.kind(), JinjaError::Kind::Syntax) << e.what();
    }
  }
  std::string nested_ifs;
  for (int k = 0; k < 1000; ++k) nested_ifs += "{% if true %}";
  EXPECT_THROW(render(nested_ifs), JinjaError);
}

TEST(Jinja, ErrorMessageNamesTheConstruct) {
  try {
    render("line one\n{% include 'x.jinja' %}");
    FAIL() << "expected an error";
  } catch (const JinjaError& e) {
    EXPECT_NE(std::string(e.what()).find("statement 'include'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
}

TEST(Jinja, StrftimeNowUsesTheGivenClock) {
  // 2024-07-26 12:00:00 UTC; the day is the same in every time zone within +-11 h.
  Template t("{{ strftime_now('%d %b %Y') }}");
  EXPECT_EQ(t.render_json(nlohmann::ordered_json::object(), 1721995200), "26 Jul 2024");
}

TEST(Jinja, LoopControlsAndScoping) {
  EXPECT_EQ(
      render("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
             "{{ x }}{% endfor %}"),
      "13");
  // A set inside a loop does not leak out of it (Jinja2 scoping); a namespace does.
  EXPECT_EQ(render("{% set v = 'out' %}{% set ns = namespace(v='out') %}{% for x in [1] %}{% set v = 'in' %}"
                   "{% set ns.v = 'in' %}{% endfor %}{{ v }} {{ ns.v }}"),
            "out in");
}

}  // namespace
}  // namespace bp::jinja
