// Tool-calling and reasoning data as the chat template sees it (issue 43): rows with tools, tool
// calls, tool results and reasoning render byte for byte as Python's Jinja2 renders them under
// transformers' apply_chat_template (tests/oracles/render_jinja2.py, row cases), on every real
// template of tests/text/data/templates; the loss mask covers exactly the assistant's text and tool
// calls; validate's per-line reasons for malformed calls; ShareGPT's function_call/observation;
// --template-kwargs, --reasoning, --tools and --tool-arguments.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "core/settings.h"
#include "text/chat_template.h"
#include "text/data_test_util.h"
#include "text/dataset.h"
#include "text/jinja2_oracle.h"

namespace bp::test {
namespace {

using json = nlohmann::ordered_json;

constexpr int64_t kNow = 1795262400;  // strftime_now's clock on both sides

const json kTools = json::array({json{
    {"type", "function"},
    {"function",
     json{{"name", "get_weather"},
          {"description", "The weather in a city, now"},
          {"parameters", json{{"type", "object"},
                              {"properties", json{{"city", json{{"type", "string"}, {"description", "City name"}}}}},
                              {"required", json::array({"city"})}}}}}}});

json msg(const char* role, const std::string& content) {
  return json{{"role", role}, {"content", content}};
}

json call(const std::string& id, const std::string& name, const json& arguments) {
  return json{{"id", id}, {"type", "function"}, {"function", json{{"name", name}, {"arguments", arguments}}}};
}

// The rows every template is tried with (OpenAI messages format, one JSONL line each).
std::vector<json> tool_rows() {
  const json args_text = "{\"city\": \"Oslo\", \"units\": \"metric\"}";
  const json args_obj = json{{"city", "Oslo"}, {"units", "metric"}};
  std::vector<json> rows;
  // 1. OpenAI's own form: content null on the calling turn, arguments a JSON string, tools per row.
  rows.push_back(
      {{"messages", json::array({msg("system", "You are helpful."), msg("user", "Weather in Oslo?"),
                                 json{{"role", "assistant"},
                                      {"content", nullptr},
                                      {"tool_calls", json::array({call("call00001", "get_weather", args_text)})}},
                                 json{{"role", "tool"},
                                      {"tool_call_id", "call00001"},
                                      {"name", "get_weather"},
                                      {"content", "{\"temp\": 3, \"sky\": \"snow\"}"}},
                                 msg("assistant", "It is 3 degrees and snowing in Oslo.")})},
       {"tools", kTools}});
  // 2. The same with content "" and arguments an object, no system message.
  rows.push_back(
      {{"messages", json::array({msg("user", "Weather in Oslo?"),
                                 json{{"role", "assistant"},
                                      {"content", ""},
                                      {"tool_calls", json::array({call("call00001", "get_weather", args_obj)})}},
                                 json{{"role", "tool"}, {"tool_call_id", "call00001"}, {"content", "3 C, snow"}},
                                 msg("assistant", "3 degrees, snowing.")})},
       {"tools", kTools}});
  // 3. Two calls at once and their two results; text before the calls; tools as a JSON string.
  rows.push_back(
      {{"messages",
        json::array({msg("user", "Oslo and Bergen?"),
                     json{{"role", "assistant"},
                          {"content", "Checking both."},
                          {"tool_calls", json::array({call("call00001", "get_weather", args_obj),
                                                      call("call00002", "get_weather", "{\"city\": \"Bergen\"}")})}},
                     json{{"role", "tool"}, {"tool_call_id", "call00001"}, {"content", "3 C"}},
                     json{{"role", "tool"}, {"tool_call_id", "call00002"}, {"content", "7 C"}},
                     msg("assistant", "Oslo 3, Bergen 7.")})},
       {"tools", kTools.dump()}});
  // 4. No tools at all: the template sees tools=None. Arrow-style nulls on every message.
  rows.push_back({{"messages", json::array({json{{"role", "user"},
                                                 {"content", "Hi"},
                                                 {"tool_calls", nullptr},
                                                 {"tool_call_id", nullptr},
                                                 {"name", nullptr}},
                                            json{{"role", "assistant"},
                                                 {"content", "Hello."},
                                                 {"tool_calls", json::array()},
                                                 {"tool_call_id", nullptr},
                                                 {"name", nullptr}}})}});
  // 5. Reasoning: two user turns, reasoning_content on both assistant turns; the row's own
  //    template variables.
  rows.push_back(
      {{"messages",
        json::array({msg("user", "2+2?"), json{{"role", "assistant"}, {"content", "4."}, {"reasoning_content", "Add."}},
                     msg("user", "And 3+3?"),
                     json{{"role", "assistant"}, {"content", "6."}, {"reasoning_content", "Add again."}}})},
       {"chat_template_kwargs", json{{"enable_thinking", false}}}});
  // 6. A call to finish on (function-calling datasets often end at the call), with no content key.
  rows.push_back(
      {{"messages", json::array({msg("user", "Weather in Oslo?"),
                                 json{{"role", "assistant"},
                                      {"tool_calls", json::array({call("call00001", "get_weather", args_text)})}}})},
       {"tools", kTools}});
  return rows;
}

std::string jsonl(const std::vector<json>& rows) {
  std::string s;
  for (const json& r : rows) s += r.dump() + "\n";
  return s;
}

struct Ours {
  bool ok = false;
  std::string text;
};

Ours render_ours(const ChatTemplate& tmpl, const Conversation& conv, bool gen) {
  try {
    return {true, tmpl.render(conv, gen)};
  } catch (const Error&) {
    return {false, ""};
  }
}

const char* mode_name(ToolArguments a) {
  return a == ToolArguments::Object ? "object" : "string";
}

// Item 1 of the issue's check: every real template, every row, both argument forms and both values
// of add_generation_prompt render as transformers renders them (or fail where it fails).
TEST(ToolRows, RenderAsTransformersOnEveryRealTemplate) {
  const std::vector<json> rows = tool_rows();
  json cases = json::array();
  struct Mine {
    std::string name;
    std::string row;
    bool gen;
    Ours ours;
  };
  std::vector<Mine> mine;
  int templates = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() + "/tests/text/data/templates")) {
    if (entry.path().extension() != ".jinja") continue;
    ++templates;
    const std::string source = read_text_file(entry.path().string());
    ChatTemplate tmpl(source, "<s>", "</s>");
    tmpl.fix_clock(kNow);
    for (ToolArguments mode : {ToolArguments::Object, ToolArguments::String}) {
      DatasetLoadOptions lo;
      lo.tool_arguments = mode;
      const LoadedDataset ds = parse_dataset(jsonl(rows), "rows.jsonl", lo);
      ASSERT_TRUE(ds.issues.empty()) << ds.issues[0].message;
      ASSERT_EQ(ds.rows.size(), rows.size());
      for (size_t r = 0; r < rows.size(); ++r)
        for (bool gen : {false, true}) {
          cases.push_back({{"template", source},
                           {"row", rows[r]},
                           {"special_tokens", {{"bos_token", "<s>"}, {"eos_token", "</s>"}}},
                           {"add_generation_prompt", gen},
                           {"tool_arguments", mode_name(mode)}});
          mine.push_back({entry.path().filename().string() + " " + mode_name(mode), rows[r].dump(), gen,
                          render_ours(tmpl, ds.rows[r].conv, gen)});
        }
    }
  }
  ASSERT_GE(templates, 30);
  const json want = render_with_jinja2(cases, kNow);
  ASSERT_EQ(want.size(), mine.size());
  int rendered = 0;
  for (size_t k = 0; k < mine.size(); ++k) {
    SCOPED_TRACE(mine[k].name + " gen=" + std::to_string(mine[k].gen) + " row " + mine[k].row);
    ASSERT_EQ(mine[k].ours.ok, want[k]["ok"].get<bool>()) << want[k].dump();
    if (!mine[k].ours.ok) continue;
    EXPECT_EQ(mine[k].ours.text, want[k]["text"].get<std::string>());
    ++rendered;
  }
  EXPECT_GT(rendered, 500);  // most templates render most rows: the comparison is not vacuous
}

Conversation row_conv(const json& row, const DatasetLoadOptions& lo = {}) {
  const LoadedDataset ds = parse_dataset(row.dump() + "\n", "row.jsonl", lo);
  EXPECT_TRUE(ds.issues.empty()) << ds.issues[0].message;
  return ds.rows.empty() ? Conversation{} : ds.rows[0].conv;
}

struct MaskCase {
  const char* name;
  std::vector<std::string> specials;
  int bos, eos;
  size_t row;  // index into tool_rows()
  std::vector<std::string> expected_spans;
};

// Item 2: the mask is the assistant's text, its tool calls as the template writes them and its end
// of turn; tool results, user and system text and the assistant header are not trained. Several of
// these templates render earlier messages differently once later ones follow (Mistral's tools and
// system prompt go with the last user message, Hermes and Qwen close a tool result differently when
// it is last, Qwen3 writes a think block only on the last turn), so their masks come from locating
// the message in the full render (chat_template.h).
TEST(ToolRows, LossMaskIsTheAssistantTextAndToolCalls) {
  const std::vector<std::string> chatml = {"<|im_start|>", "<|im_end|>"};
  const std::vector<std::string> llama = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                          "<|eot_id|>"};
  const std::vector<std::string> mistral = {"<s>",
                                            "</s>",
                                            "[INST]",
                                            "[/INST]",
                                            "[TOOL_CALLS]",
                                            "[TOOL_RESULTS]",
                                            "[/TOOL_RESULTS]",
                                            "[AVAILABLE_TOOLS]",
                                            "[/AVAILABLE_TOOLS]",
                                            "[CALL_ID]",
                                            "[ARGS]",
                                            "[TOOL_CONTENT]",
                                            "[SYSTEM_PROMPT]",
                                            "[/SYSTEM_PROMPT]"};
  const std::string qwen_call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", "
      "\"units\": \"metric\"}}\n</tool_call><|im_end|>\n";
  const std::vector<MaskCase> cases = {
      {"qwen2.5", chatml, -1, 1, 0, {qwen_call, "It is 3 degrees and snowing in Oslo.<|im_end|>\n"}},
      {"qwen2.5",
       chatml,
       -1,
       1,
       2,
       {"Checking both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"units\": "
        "\"metric\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
        "\"Bergen\"}}\n</tool_call><|im_end|>\n",
        "Oslo 3, Bergen 7.<|im_end|>\n"}},
      // Qwen3 writes the (empty) think block only on the last turn: the calling turn is trained as the
      // full render has it, without one.
      {"qwen3", chatml, -1, 1, 1, {qwen_call, "<think>\n\n</think>\n\n3 degrees, snowing.<|im_end|>\n"}},
      {"hermes3-tool-use", chatml, -1, 1, 0, {qwen_call, "It is 3 degrees and snowing in Oslo.<|im_end|>\n"}},
      {"llama3.1",
       llama,
       0,
       3,
       0,
       {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"units\": \"metric\"}}<|eot_id|>",
        "It is 3 degrees and snowing in Oslo.<|eot_id|>"}},
      {"llama3.3",
       llama,
       0,
       3,
       1,
       {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"units\": \"metric\"}}<|eot_id|>",
        "3 degrees, snowing.<|eot_id|>"}},
      {"mistral-nemo",
       mistral,
       0,
       1,
       0,
       {"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"units\": \"metric\"}, \"id\": "
        "\"call00001\"}]</s>",
        "It is 3 degrees and snowing in Oslo.</s>"}},
      {"mistral-small3.2",
       mistral,
       0,
       1,
       0,
       {"[TOOL_CALLS]get_weather[CALL_ID]call00001[ARGS]{\"city\": \"Oslo\", \"units\": \"metric\"}</s>",
        "It is 3 degrees and snowing in Oslo.</s>"}},
      // The call to finish on: its tokens are the whole target.
      {"qwen2.5", chatml, -1, 1, 5, {qwen_call}},
  };
  const std::vector<json> rows = tool_rows();
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.name) + " row " + std::to_string(c.row + 1));
    FakeTokenizer tok(c.specials, read_text_file(template_path(c.name)), c.bos, c.eos);
    ChatTemplate tmpl = ChatTemplate::from_tokenizer(tok);
    tmpl.fix_clock(kNow);
    const Conversation conv = row_conv(rows[c.row]);
    const TokenizedConversation tc = tokenize_conversation(tmpl, tok, conv);
    EXPECT_EQ(tok.decode(tc.ids), tmpl.render(conv, false));
    EXPECT_EQ(masked_spans(tok, tc), c.expected_spans);
    // Truncated (training keeps only the first tokens): the mask is the same as far as it goes.
    const size_t keep = tc.ids.size() * 2 / 3;
    const TokenizedConversation cut = tokenize_conversation(tmpl, tok, conv, false, keep);
    ASSERT_GE(cut.ids.size(), keep);
    for (size_t t = 0; t < keep; ++t) ASSERT_EQ(cut.loss_mask[t], tc.loss_mask[t]) << "token " << t;
  }
}

// On every template that renders a row: tool results, user and system text are never trained, and
// the final answer is (an invariant beside the hand-checked masks above).
TEST(ToolRows, ToolResultsAndPromptsAreNeverTrainedOnAnyTemplate) {
  const std::vector<json> rows = tool_rows();
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() + "/tests/text/data/templates")) {
    if (entry.path().extension() != ".jinja") continue;
    FakeTokenizer tok({}, read_text_file(entry.path().string()), -1, -1);
    ChatTemplate tmpl = ChatTemplate::from_tokenizer(tok);
    tmpl.fix_clock(kNow);
    for (size_t r : {0, 1, 2}) {
      SCOPED_TRACE(entry.path().filename().string() + " row " + std::to_string(r + 1));
      const Conversation conv = row_conv(rows[r]);
      TokenizedConversation tc;
      try {
        tc = tokenize_conversation(tmpl, tok, conv);
      } catch (const Error&) {
        continue;  // the template refuses the row (Llama 3.1 takes one call at a time, ...)
      }
      std::string trained;
      for (const std::string& s : masked_spans(tok, tc)) trained += s + "\x01";
      for (const char* never :
           {"Weather in Oslo?", "Oslo and Bergen?", "You are helpful.", "snow\"}", "3 C, snow", "7 C"})
        EXPECT_EQ(trained.find(never), std::string::npos) << never << " is trained: " << trained;
      const std::string& answer = conv.back().content;
      const std::string full = tmpl.render(conv, false);
      if (full.find(answer) != std::string::npos) {
        EXPECT_NE(trained.find(answer), std::string::npos) << answer << " is not trained: " << trained;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
}

// A null content beside tool calls (OpenAI's form) fails in Qwen3's template as in Python (`'</think>' in
// None`): the template's error, with the way out named.
TEST(ToolRows, NullContentATemplateCannotTakeSaysWhatToWrite) {
  ChatTemplate qwen3(read_text_file(template_path("qwen3")), "", "<|im_end|>");
  try {
    qwen3.render(row_conv(tool_rows()[0]), false);
    FAIL() << "Qwen3 cannot take content null";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED);
    EXPECT_NE(std::string(e.what()).find("content is null or missing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("write \"content\": \"\" there"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(qwen3.render(row_conv(tool_rows()[1]), false));  // content ""
}

// Item 3: LLaMA-Factory's ShareGPT tool roles are OpenAI messages: a row renders as its OpenAI twin.
TEST(ToolRows, ShareGptFunctionCallAndObservationAreToolCallsAndResults) {
  const json sharegpt{
      {"conversations",
       json::array(
           {json{{"from", "human"}, {"value", "Weather in Oslo?"}},
            json{{"from", "function_call"},
                 {"value", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"units\": \"metric\"}}"}},
            json{{"from", "observation"}, {"value", "3 C, snow"}},
            json{{"from", "gpt"}, {"value", "3 degrees, snowing."}}})},
      {"system", "You are helpful."},
      {"tools", kTools.dump()}};
  const json openai{
      {"messages",
       json::array({msg("system", "You are helpful."), msg("user", "Weather in Oslo?"),
                    json{{"role", "assistant"},
                         {"content", ""},
                         {"tool_calls",
                          json::array({json{
                              {"type", "function"},
                              {"function", json{{"name", "get_weather"},
                                                {"arguments", "{\"city\": \"Oslo\", \"units\": \"metric\"}"}}}}})}},
                    json{{"role", "tool"}, {"content", "3 C, snow"}}, msg("assistant", "3 degrees, snowing.")})},
      {"tools", kTools}};
  const Conversation a = row_conv(sharegpt), b = row_conv(openai);
  ASSERT_EQ(a.size(), 5u);
  EXPECT_EQ(a[2].role, "assistant");
  EXPECT_TRUE(a[2].has_tool_calls());
  EXPECT_EQ(a[2].extra["tool_calls"][0]["function"]["arguments"], (json{{"city", "Oslo"}, {"units", "metric"}}));
  EXPECT_EQ(a[3].role, "tool");
  EXPECT_EQ(a.tools, kTools);
  for (const char* name : {"qwen2.5", "qwen3", "llama3.1", "hermes3-tool-use"}) {
    SCOPED_TRACE(name);
    ChatTemplate tmpl(read_text_file(template_path(name)), "<s>", "</s>");
    tmpl.fix_clock(kNow);
    for (bool gen : {false, true}) EXPECT_EQ(tmpl.render(a, gen), tmpl.render(b, gen));
  }
  // Parallel calls: a list of calls in one function_call turn.
  const json parallel{
      {"conversations",
       json::array({json{{"from", "human"}, {"value", "Both?"}},
                    json{{"from", "function_call"},
                         {"value", json::array({json{{"name", "f"}, {"arguments", json::object()}},
                                                json{{"name", "g"}, {"arguments", "{\"x\": 1}"}}})}},
                    json{{"from", "observation"}, {"value", "r1"}}, json{{"from", "observation"}, {"value", "r2"}},
                    json{{"from", "gpt"}, {"value", "Done."}}})}};
  const Conversation p = row_conv(parallel);
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(p[1].extra["tool_calls"].size(), 2u);
  EXPECT_EQ(p[1].extra["tool_calls"][1]["function"]["arguments"], (json{{"x", 1}}));
}

// Item 4: validate's reasons, each on its line.
TEST(ToolRows, MalformedToolCallsAreReportedByLine) {
  const json good = tool_rows()[0];
  const auto with_call = [](const json& c) {
    return json{{"messages",
                 json::array({msg("user", "Q"), json{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", c}},
                              json{{"role", "tool"}, {"content", "r"}}, msg("assistant", "A")})}};
  };
  const std::vector<json> rows = {
      good,                                                                                       // 1
      with_call(json::array({call("a", "f", "{\"city\": \"Oslo\"")})),                            // 2 not JSON
      with_call(json::array({call("a", "f", "[1, 2]")})),                                         // 3 not an object
      with_call(json::array({json{{"type", "function"}, {"function", {{"arguments", "{}"}}}}})),  // 4 no name
      with_call(json{{"name", "f"}}),                                                             // 5 not a list
      json{{"messages",
            json::array(
                {msg("user", "Q"),  // 6 unknown id
                 json{{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call("a", "f", "{}")})}},
                 json{{"role", "tool"}, {"tool_call_id", "b"}, {"content", "r"}}, msg("assistant", "A")})}},
      json{{"messages",
            json::array(
                {msg("user", "Q"),  // 7 two results, one call
                 json{{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call("a", "f", "{}")})}},
                 json{{"role", "tool"}, {"content", "r"}}, json{{"role", "tool"}, {"content", "s"}},
                 msg("assistant", "A")})}},
      json{{"messages", json::array({json{{"role", "user"},
                                          {"content", "Q"},  // 8 a user calling
                                          {"tool_calls", json::array({call("a", "f", "{}")})}},
                                     msg("assistant", "A")})}},
      json{{"messages", json::array({msg("user", "Q"), msg("assistant", "A")})}, {"tools", "not json"}},  // 9
      json{{"messages", json::array({msg("user", "Q"), msg("tool", "r"), msg("assistant", "A")})}},       // 10
      json{{"messages",
            json::array(
                {msg("user", "Q"),  // 11 user after a call
                 json{{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call("a", "f", "{}")})}},
                 msg("user", "Q2"), msg("assistant", "A")})}},
      with_call(json::array({call("a", "f", 7)})),                                          // 12 arguments a number
      with_call(json::array({json{{"type", "function"}, {"function", {{"name", "f"}}}}})),  // 13 no arguments
      json{{"messages", json::array({msg("user", "Q"), msg("assistant", "A")})},            // 14 tools of strings
           {"tools", json::array({"get_weather"})}},
      json{{"messages", json::array({msg("user", "Q"),  // 15 a plain empty answer
                                     json{{"role", "assistant"}, {"content", nullptr}}})}},
      good,  // 16
  };
  const LoadedDataset ds = parse_dataset(jsonl(rows), "calls.jsonl");
  EXPECT_EQ(ds.rows.size(), 2u);
  expect_issues(ds, {{2, RowProblem::BadToolCall},
                     {3, RowProblem::BadToolCall},
                     {4, RowProblem::BadToolCall},
                     {5, RowProblem::BadToolCall},
                     {6, RowProblem::BadToolCall},
                     {7, RowProblem::BadToolCall},
                     {8, RowProblem::BadToolCall},
                     {9, RowProblem::BadTools},
                     {10, RowProblem::WrongRoleOrder},
                     {11, RowProblem::WrongRoleOrder},
                     {12, RowProblem::BadToolCall},
                     {13, RowProblem::BadToolCall},
                     {14, RowProblem::BadTools},
                     {15, RowProblem::EmptyTurn}});
  const auto message_at = [&](int64_t line) {
    for (const RowIssue& i : ds.issues)
      if (i.line == line) return i.message;
    return std::string();
  };
  EXPECT_NE(message_at(2).find("turn 2 (assistant): tool call 1 (f): 'arguments' is not valid JSON"), std::string::npos)
      << message_at(2);
  EXPECT_NE(message_at(3).find("must be a JSON object, found a JSON array"), std::string::npos) << message_at(3);
  EXPECT_NE(message_at(6).find("tool_call_id 'b', which no call of turn 2 has (its ids: a)"), std::string::npos)
      << message_at(6);
  EXPECT_NE(message_at(11).find("expected 'tool'"), std::string::npos) << message_at(11);
  EXPECT_STREQ(row_problem_name(RowProblem::BadToolCall), "bad_tool_call");
  EXPECT_STREQ(row_problem_name(RowProblem::BadTools), "bad_tools");
}

// Item 2 of the feature: --template-kwargs reach the template (Qwen3's enable_thinking: its empty
// think block moves into the generation prompt and is no longer trained), a row's own
// chat_template_kwargs win, and reserved names are refused.
TEST(ToolRows, TemplateKwargsReachTheTemplateAndTheMask) {
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>"}, read_text_file(template_path("qwen3")), -1, 1);
  ChatTemplate tmpl = ChatTemplate::from_tokenizer(tok);
  const Conversation conv = {{"user", "Q"}, {"assistant", "A."}};
  EXPECT_EQ(masked_spans(tok, tokenize_conversation(tmpl, tok, conv)),
            std::vector<std::string>{"<think>\n\n</think>\n\nA.<|im_end|>\n"});
  tmpl.set_template_kwargs(parse_template_kwargs("{\"enable_thinking\": false}"));
  EXPECT_EQ(tmpl.render(conv, true).substr(tmpl.render(conv, false).size()),
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(masked_spans(tok, tokenize_conversation(tmpl, tok, conv)), std::vector<std::string>{"A.<|im_end|>\n"});
  Conversation own = conv;
  own.template_kwargs = json{{"enable_thinking", true}};  // the row's own wins
  EXPECT_EQ(masked_spans(tok, tokenize_conversation(tmpl, tok, own)),
            std::vector<std::string>{"<think>\n\n</think>\n\nA.<|im_end|>\n"});
  for (const char* bad : {"{\"tools\": []}", "{\"messages\": 1}", "[1]", "enable_thinking=false"}) try {
      tmpl.set_template_kwargs(parse_template_kwargs(bad));
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::CONFIG_INVALID_SETTING) << e.what();
    }
  // The setting itself refuses what is no JSON object, at the settings layer.
  Settings s;
  EXPECT_NO_THROW(s.set("data.template_kwargs", "{\"enable_thinking\": false}"));
  try {
    s.set("data.template_kwargs", "{enable_thinking: false}");
    ADD_FAILURE() << "not JSON was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::CONFIG_INVALID_SETTING);
  }
}

// --reasoning keep|drop: what reaches the template of earlier turns' reasoning. Qwen3 drops it
// itself (keep and drop render the same); a template that writes every turn's reasoning shows the
// difference. Trained where rendered.
TEST(ToolRows, ReasoningKeepOrDropFollowsTheTemplate) {
  const json row = tool_rows()[4];
  const std::string every_turn =
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>{{ m.reasoning_content }}"
      "</think>{% endif %}{% if m.thinking %}<t>{{ m.thinking }}</t>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  FakeTokenizer tok({"<|im_start|>", "<|im_end|>"}, every_turn, -1, 1);
  ChatTemplate tmpl = ChatTemplate::from_tokenizer(tok);
  DatasetLoadOptions drop;
  drop.reasoning = ReasoningMode::Drop;
  const Conversation kept = row_conv(row), dropped = row_conv(row, drop);
  EXPECT_EQ(masked_spans(tok, tokenize_conversation(tmpl, tok, kept)),
            (std::vector<std::string>{"<think>Add.</think>4.<|im_end|>\n", "<think>Add again.</think>6.<|im_end|>\n"}));
  EXPECT_EQ(masked_spans(tok, tokenize_conversation(tmpl, tok, dropped)),
            (std::vector<std::string>{"4.<|im_end|>\n", "<think>Add again.</think>6.<|im_end|>\n"}));
  // `thinking` (Ollama's and gpt-oss's key) is reasoning too.
  json thinking = row;
  for (auto& m : thinking["messages"])
    if (m.contains("reasoning_content")) {
      m["thinking"] = m["reasoning_content"];
      m.erase("reasoning_content");
    }
  EXPECT_EQ(masked_spans(tok, tokenize_conversation(tmpl, tok, row_conv(thinking, drop))),
            (std::vector<std::string>{"4.<|im_end|>\n", "<t>Add again.</t>6.<|im_end|>\n"}));
  // Qwen3 shows only the reasoning after the last user message, whatever we pass.
  FakeTokenizer qtok({"<|im_start|>", "<|im_end|>"}, read_text_file(template_path("qwen3")), -1, 1);
  ChatTemplate qwen3 = ChatTemplate::from_tokenizer(qtok);
  Conversation k = kept, d = dropped;
  k.template_kwargs = d.template_kwargs = nullptr;
  EXPECT_EQ(qwen3.render(k, false), qwen3.render(d, false));
  EXPECT_EQ(masked_spans(qtok, tokenize_conversation(qwen3, qtok, k)),
            (std::vector<std::string>{"4.<|im_end|>\n", "<think>\nAdd again.\n</think>\n\n6.<|im_end|>\n"}));
}

// --tools FILE: the tools of every row without its own; a row's own tools win. --tool-arguments
// string: objects become JSON text (DeepSeek's templates concatenate them).
TEST(ToolRows, DefaultToolsFileAndArgumentsAsText) {
  TempDir dir;
  const std::string path = write_file(dir, "tools.json", json{{"tools", kTools}}.dump());
  DatasetLoadOptions lo;
  lo.tools = load_tools_file(path);
  EXPECT_EQ(lo.tools, kTools);
  const json other = json::array({json{{"type", "function"}, {"function", json{{"name", "other"}}}}});
  const std::vector<json> rows = {
      json{{"messages", json::array({msg("user", "Q"), msg("assistant", "A")})}},
      json{{"messages", json::array({msg("user", "Q"), msg("assistant", "A")})}, {"tools", other}}};
  const LoadedDataset ds = parse_dataset(jsonl(rows), "rows.jsonl", lo);
  ASSERT_EQ(ds.rows.size(), 2u);
  EXPECT_EQ(ds.rows[0].conv.tools, kTools);
  EXPECT_EQ(ds.rows[1].conv.tools, other);
  for (const std::string bad : {"[1, 2]", "{\"tools\": {}}", "not json"}) {
    try {
      load_tools_file(write_file(dir, "bad.json", bad));
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::INPUT_DATASET_PARSE_FAILED) << e.what();
    }
  }
  EXPECT_THROW(load_tools_file(dir.path + "/missing.json"), Error);

  DatasetLoadOptions text;
  text.tool_arguments = ToolArguments::String;
  const Conversation c = row_conv(tool_rows()[1], text);
  EXPECT_EQ(c[1].extra["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Oslo\", \"units\": \"metric\"}");
  ChatTemplate deepseek(read_text_file(template_path("deepseek-v3")), "<s>", "</s>");
  const Conversation openai = row_conv(tool_rows()[0], text);
  EXPECT_NE(deepseek.render(openai, false).find("```json\n{\"city\": \"Oslo\", \"units\": \"metric\"}\n```"),
            std::string::npos)
      << deepseek.render(openai, false);
}

}  // namespace
}  // namespace bp::test
