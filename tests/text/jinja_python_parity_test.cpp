// The Jinja interpreter against Python's Jinja2 set up as transformers' apply_chat_template sets it
// up (tests/oracles/render_jinja2.py): where Python renders, the text must match byte for byte;
// where Python raises, we must raise too. Issue 37 found each of these differences by testing real
// chat templates against Jinja2.
#include <gtest/gtest.h>

#include <filesystem>

#include "text/data_test_util.h"
#include "text/jinja2_oracle.h"

namespace bp::test {
namespace {

using json = nlohmann::ordered_json;

struct Snippet {
  std::string tmpl;
  json context = json::object();
};

// One oracle call for all snippets; each must render as Jinja2 renders it (or raise where it raises).
void expect_as_jinja2(const std::vector<Snippet>& snippets) {
  json cases = json::array();
  for (const auto& s : snippets) cases.push_back({{"template", s.tmpl}, {"context", s.context}});
  constexpr int64_t kNowEpochS = 1795262400;  // strftime_now's clock, the same on both sides
  const json want = render_with_jinja2(cases, kNowEpochS);
  ASSERT_EQ(want.size(), snippets.size());
  for (size_t k = 0; k < snippets.size(); ++k) {
    SCOPED_TRACE("template: " + json(snippets[k].tmpl).dump() + " context: " + snippets[k].context.dump());
    const json got = render_with_ours(snippets[k].tmpl, snippets[k].context, kNowEpochS);
    ASSERT_EQ(got["ok"], want[k]["ok"]) << "Jinja2: " << want[k].dump() << "\nours: " << got.dump();
    if (want[k]["ok"].get<bool>()) {
      EXPECT_EQ(got["text"], want[k]["text"]);
    }
  }
}

std::string with_crlf(const std::string& lf) {
  std::string out;
  for (char c : lf) {
    if (c == '\n') out += '\r';
    out += c;
  }
  return out;
}

// Item 1: Jinja2 turns every \r\n and \r of the template source into \n (newline_sequence), before
// trim_blocks / lstrip_blocks; a template saved on Windows renders as the LF one.
TEST(JinjaPythonParity, CrlfTemplateSourceRendersLikeLf) {
  expect_as_jinja2({
      {"a\r\n{% if true %}\r\n  b\r\n{% endif %}\r\nc\r\n"},
      {"x\r\n  {% for i in [1, 2] %}\r\n{{ i }}\r\n  {% endfor %}\r\ny\r\n\r\n"},
      {"a\rb\r\n{# c #}\r\nd"},
      {"{{ 'one\r\ntwo' }}|{{ 'esc\\r\\n' }}"},  // a raw CRLF inside a literal too; escapes stay
  });
  const std::string lf = read_text_file(template_path("qwen2.5"));
  const json ctx{{"messages", json::array({{{"role", "user"}, {"content", "Hi"}},
                                           {{"role", "assistant"}, {"content", "Hello.\nBye."}}})},
                 {"add_generation_prompt", false}};
  const json crlf_render = render_with_ours(with_crlf(lf), ctx);
  ASSERT_TRUE(crlf_render["ok"].get<bool>()) << crlf_render.dump();
  EXPECT_EQ(crlf_render["text"].get<std::string>().find('\r'), std::string::npos);
  EXPECT_EQ(crlf_render, render_with_ours(lf, ctx));
  expect_as_jinja2({{with_crlf(lf), ctx}});
}

// Item 4: obj[key] is Jinja2's getitem: a failed lookup is undefined, never an error (Llama-3.2-Vision
// tests content['type'] on string contents), and undefined behaves as Jinja2's Undefined.
TEST(JinjaPythonParity, FailedSubscriptIsUndefined) {
  const json ctx{{"s", "hello"}, {"xs", json::array({1, 2})}, {"d", json{{"a", 1}}}, {"nothing", nullptr}};
  expect_as_jinja2({
      {"{{ s['type'] }}|{{ s['type'] is defined }}|{{ s['type'] == 'image' }}|{{ s['type'] | length }}", ctx},
      {"{{ xs['a'] is defined }}|{{ xs[5] is defined }}|{{ d[0] is defined }}|{{ 5['x'] is defined }}", ctx},
      {"{{ nothing['x'] is defined }}|{{ nothing.x is defined }}|{{ s[1.5] is defined }}|{{ s['upper']() }}", ctx},
      {"{% for c in [s, {'type': 'image'}] %}{% if c['type'] == 'image' %}<img>{% else %}{{ c }}{% endif %}"
       "{% endfor %}",
       ctx},
      {"{{ s['type'] | default('none') }}|{{ s['type'] | string }}|{{ s['type'] | trim }}|"
       "{% for x in s['type'] %}x{% endfor %}|{{ s['type'] | items | list }}|{{ not s['type'] }}",
       ctx},
      {"{{ s['type']['x'] }}", ctx},     // a subscript of undefined raises
      {"{{ s['type'].x }}", ctx},        // so does an attribute
      {"{{ s['type'] | tojson }}", ctx}  // and json.dumps
  });
  // The Llama-3.2-Vision pattern: a message whose content is a string, tested for parts.
  const std::string vision =
      "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% endif %}"
      "{% for part in m['content'] %}{% if part['type'] == 'image' %}<|image|>{% endif %}{% endfor %}"
      "{% if m['content']['type'] == 'text' %}T{% endif %}{% endfor %}";
  expect_as_jinja2({{vision, json{{"messages", json::array({{{"role", "user"}, {"content", "Hi"}}})}}}});
}

// Item 4 too: Python only adds a string to a string ('a' + 1 raises; @huggingface/jinja concatenates).
TEST(JinjaPythonParity, AddingANonStringToAStringRaises) {
  expect_as_jinja2({{"{{ 'n=' + 7 }}"}, {"{{ 'a' + true }}"}, {"{{ 7 ~ 'x' }}|{{ 'a' + 'b' }}"}});
}

// `x in None` raises (TypeError: argument of type 'NoneType' is not iterable), as a message's null
// content does in Qwen3's and gpt-oss's templates; `x in undefined` is false, and undefined is
// iterable (issue 43: tool-call messages with null or no content).
TEST(JinjaPythonParity, InNoneRaisesInUndefinedIsFalse) {
  const json ctx{{"m", json{{"content", nullptr}}}};
  expect_as_jinja2({{"{{ '</think>' in m.content }}", ctx},
                    {"{{ '</think>' not in m.content }}", ctx},
                    {"{{ 'x' in m.missing }}|{{ 'x' not in nothing }}", ctx},
                    {"{{ 1 in 'abc' }}", ctx},
                    // Undefined is iterable (empty) and a sequence, as a message without content is.
                    {"{{ m.missing is iterable }}|{{ m.missing is sequence }}|{{ m.missing is mapping }}|"
                     "{{ m.content is iterable }}|{% for x in m.missing %}x{% endfor %}|{{ m.missing | length }}",
                     ctx}});
}

// Item 2: a list or dict prints as Python's repr, not JSON.
TEST(JinjaPythonParity, ContainersPrintAsPythonRepr) {
  const json ctx{{"d", json{{"a", 1}, {"b", json::array({true, nullptr})}}},
                 {"xs", json::array({"it's", "say \"hi\"", "both ' and \"", "back\\slash", "tab\tnl\nend", 1.5, 2.0, -3,
                                     "\x01\x7f", "é ✓ \u00a0\u2028\u200b", "日本"})},
                 {"nested", json{{"k", json{{"x", json::array({json::object(), json::array()})}}}}}};
  expect_as_jinja2({
      {"{{ d }}|{{ d | string }}|{{ [d] }}", ctx},
      {"{{ xs }}", ctx},
      {"{{ nested }}|{{ nested.k }}|{{ [] }}|{{ {} }}|{{ [none, true, false] }}", ctx},
      {"{{ 'x' ~ d }}|{{ xs | join(', ') }}|{{ [xs[0]] | join }}", ctx},
      {"{% set ns = namespace(a=1, b='two') %}{{ ns }}", ctx},
      {"{{ [[1, 2], ['a']] }}|{{ {'k': 'v'} | string | length }}", ctx},
  });
}

// Item 5: integer dict keys (Seed-OSS's thinking-budget table) and f(*args) / f(**kwargs) calls.
TEST(JinjaPythonParity, IntegerKeysAndStarArguments) {
  expect_as_jinja2({
      {"{% set t = {0: 0, 512: 128, 1024: 256} %}{{ t[512] }}|{{ t }}|{{ t | tojson }}|{{ 512 in t }}|"
       "{{ '512' in t }}|{{ t.get(1024) }}|{{ t['512'] is defined }}"},
      {"{% set t = {4096: 'c', 512: 'a', 1024: 'b'} %}{% for k, v in t | dictsort %}{{ k }}={{ v }};{% endfor %}|"
       "{% for k in t %}{{ k + 1 }},{% endfor %}|{{ t.keys() | list }}|{{ t.items() | list | length }}"},
      {"{% set d = {'b': 1, 'A': 2, 'a': 3} %}{% for k, v in d | dictsort %}{{ k }}{% endfor %}|"
       "{% for k, v in d | dictsort(true) %}{{ k }}{% endfor %}|{% for k, v in d | dictsort(by='value', reverse=true) "
       "%}{{ k }}{% endfor %}"},
      {"{% macro f(a, b, c='C') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ f(*[1, 2]) }}|{{ f(1, *[2, 3]) }}|"
       "{{ f(**{'a': 'x', 'b': 'y'}) }}|{{ f(*['p'], **{'b': 'q', 'c': 'r'}) }}"},
      {"{{ range(*[1, 7, 2]) | list }}|{{ namespace(**{'a': 1}).a }}"},
  });
  // Seed-OSS renders as Jinja2 renders it (it was refused for its integer keys).
  const std::string seed = read_text_file(template_path("seed-oss"));
  const json msgs = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                 {{"role", "user"}, {"content", "Hi"}},
                                 {{"role", "assistant"}, {"content", "Hello."}}});
  expect_as_jinja2({{seed, {{"messages", msgs}, {"add_generation_prompt", true}}},
                    {seed, {{"messages", msgs}, {"add_generation_prompt", true}, {"thinking_budget", 700}}},
                    {seed, {{"messages", msgs}, {"add_generation_prompt", false}, {"thinking_budget", 0}}}});
}

// Item 6: Python's str methods and Jinja2's |title on non-ASCII text and \x1c-\x1f.
TEST(JinjaPythonParity, UnicodeStringMethods) {
  const json ctx{{"s", "\x1c\x1d a b \x1e\x1f\u0085\u00a0\u2000\u200a\u3000"},
                 {"t", "héllo wörld-ǆx (straße) they're aBc1d ΣΑΣ <i>"}};
  expect_as_jinja2({
      {"[{{ s.strip() }}]|[{{ s | trim }}]|[{{ s.lstrip() }}]|[{{ s.rstrip() }}]|{{ s.split() | length }}", ctx},
      {"{{ s.split() }}|{{ ('x' ~ s ~ 'y').split(none, 1) }}|{{ ' a  b c '.split(none, 1) }}|[{{ 'é è'.strip('è') "
       "}}]|[{{ 'ééa'.lstrip('é') }}]",
       ctx},
      {"{{ t | title }}", ctx},
      {"{{ t.title() }}", ctx},
      {"{{ t | capitalize }}|{{ t.capitalize() }}|{{ 'ǆa' | capitalize }}", ctx},
      {"{{ t.upper() }}|{{ t.lower() }}|{{ t | upper }}|{{ t | lower }}", ctx},
  });
}

// Item 3: Markup semantics. |safe (and |escape) make a Markup; adding a plain string to it escapes
// the plain one; `~`, join and transformers' tojson (json.dumps) give plain strings.
TEST(JinjaPythonParity, MarkupAsJinja2) {
  const json ctx{{"x", json{{"k", "<b>&'\""}}}, {"s", "<i>"}};
  expect_as_jinja2({
      {"{{ '<a>' | safe + x | tojson }}", ctx},
      {"{{ ('<a>' | safe) + x | tojson }}|{{ ('<a>' | safe) ~ x | tojson }}|{{ x | tojson + '<a>' | safe }}", ctx},
      {"{{ s | safe + s }}|{{ s + s | safe }}|{{ s | safe + s | safe }}|{{ s | e }}|{{ s | escape + s }}", ctx},
      {"{{ (s | safe + s) | length }}|{{ ((s | safe) * 2) + s }}|{{ ((s | safe) | upper) + s }}|"
       "{{ ((s | safe) | trim) + s }}|{{ (s | safe).replace('i', '&') }}|{{ ((s | safe)[1:]) + s }}",
       ctx},
      {"{{ [s | safe, s] | join + s }}|{{ (s | safe | string) + s }}|{{ s | safe == s }}|{{ (s | e) | e }}", ctx},
  });
}

json message(const char* role, const std::string& content) {
  return json{{"role", role}, {"content", content}};
}

// Every real template in tests/text/data/templates on a few conversations (tool calls included),
// against Jinja2: the whole check of issue 37, on the templates this repository ships.
TEST(JinjaPythonParity, RealTemplatesRenderAsJinja2) {
  const json tool_call{{"id", "call00001"},
                       {"type", "function"},
                       {"function", json{{"name", "get_weather"}, {"arguments", json{{"city", "Oslo"}}}}}};
  const json tools = json::array({json{{"type", "function"},
                                       {"function", json{{"name", "get_weather"},
                                                         {"description", "Weather (Wetter, 天气) <now>"},
                                                         {"parameters", json{{"type", "object"}}}}}}});
  const std::vector<json> conversations = {
      json::array({message("user", "Hello!")}),
      json::array({message("system", "Be kind.\n"), message("user", "One"), message("assistant", "Uno"),
                   message("user", "Two — zwei ✓ 'q' \"d\"")}),
      json::array({message("user", "Think"), message("assistant", "<think>\nr\n</think>\n\nThe answer.")}),
      json::array({message("user", "Weather?"),
                   json{{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({tool_call})}},
                   json{{"role", "tool"}, {"tool_call_id", "call00001"}, {"content", "{\"temp\": 3}"}},
                   message("assistant", "3 degrees.")}),
  };
  std::vector<Snippet> cases;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() + "/tests/text/data/templates")) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string source = read_text_file(entry.path().string());
    for (const auto& conv : conversations)
      for (bool gen : {false, true}) {
        json ctx{{"messages", conv}, {"add_generation_prompt", gen}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
        if (conv.size() == 4) ctx["tools"] = tools;
        cases.push_back({source, ctx});
      }
  }
  ASSERT_GT(cases.size(), 100u);
  expect_as_jinja2(cases);
}

}  // namespace
}  // namespace bp::test

namespace bp::test {

// Issue 42: Phi-4-mini's and SmolLM3's real chat templates (tests/text/data/templates/README.md)
// render as Jinja2 renders them: plain chats with and without a system message and the generation
// prompt, Phi-4-mini's tools string on the system message (and a null content, which Jinja2 refuses
// to concatenate), SmolLM3's reasoning switches (enable_thinking, /no_think and /think in the system
// message, /system_override), its xml_tools and python_tools lists and a tool result.
TEST(JinjaPythonParity, Phi4MiniAndSmolLM3RenderAsJinja2) {
  const auto m = [](const char* role, const json& content) { return json{{"role", role}, {"content", content}}; };
  const json chat = json::array({m("user", "Hi"), m("assistant", "\nHello!"), m("user", "And now?")});
  json with_system = chat;
  with_system.insert(with_system.begin(), m("system", "Be brief."));
  const json tool = {{"name", "get_weather"}, {"parameters", {{"city", {{"type", "string"}}}}}};
  std::vector<Snippet> cases;
  const std::string phi = read_text_file(template_path("phi4-mini"));
  const std::string smol = read_text_file(template_path("smollm3"));
  ASSERT_FALSE(phi.empty());
  ASSERT_FALSE(smol.empty());
  for (const std::string* t : {&phi, &smol})
    for (const json& msgs : {chat, with_system})
      for (bool gen : {false, true})
        cases.push_back({*t, {{"messages", msgs}, {"add_generation_prompt", gen}, {"eos_token", "<|endoftext|>"}}});
  json phi_tools = with_system;
  phi_tools[0]["tools"] = json::array({tool}).dump();
  cases.push_back({phi, {{"messages", phi_tools}, {"add_generation_prompt", true}, {"eos_token", "<|endoftext|>"}}});
  cases.push_back({phi, {{"messages", json::array({m("user", "Hi"), m("assistant", nullptr)})}}});
  for (const char* sys : {"Be brief. /no_think", "Think. /think", "Only this. /system_override"}) {
    json msgs = chat;
    msgs.insert(msgs.begin(), m("system", sys));
    cases.push_back({smol, {{"messages", msgs}, {"add_generation_prompt", true}}});
  }
  cases.push_back({smol, {{"messages", with_system}, {"enable_thinking", false}, {"add_generation_prompt", true}}});
  json with_tool = chat;
  with_tool.push_back(m("tool", "{\"temp\": 3}"));
  cases.push_back({smol,
                   {{"messages", with_tool},
                    {"xml_tools", json::array({tool})},
                    {"python_tools", json::array({tool, tool})},
                    {"add_generation_prompt", true}}});
  expect_as_jinja2(cases);
}

namespace {

// Gemma has no system role: Gemma 3's template folds a system message into the first user turn
// (the text is kept, as Jinja2 renders it), Gemma 2's refuses it (raises in both): never dropped.
TEST(JinjaPythonParity, GemmaFoldsOrRefusesTheSystemPromptNeverDropsIt) {
  const json conv = json::array({message("system", "Be brief."), message("user", "Hi")});
  const json ctx{{"messages", conv}, {"add_generation_prompt", true}, {"bos_token", "<bos>"}, {"eos_token", "<eos>"}};
  const std::string g3 = read_text_file(template_path("gemma3")), g2 = read_text_file(template_path("gemma2"));
  expect_as_jinja2({{g3, ctx}, {g2, ctx}});
  const json got = render_with_ours(g3, ctx);
  ASSERT_TRUE(got["ok"].get<bool>()) << got.dump();
  EXPECT_EQ(got["text"], "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_FALSE(render_with_ours(g2, ctx)["ok"].get<bool>());
}

}  // namespace
}  // namespace bp::test
