// `backprop validate`: text and --json reports, exit codes, missing / empty / all-bad files, preference
// data and --method.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/test_util.h"

namespace bp::test {
namespace {

std::string validate(const std::string& args, int* rc) {
  std::string out;
  *rc = run_command(backprop_exe() + " validate " + args, &out);
  return out;
}

// The JSON document in the output (spdlog lines may precede it).
nlohmann::json json_of(const std::string& out) {
  const size_t start = out.find('{');
  EXPECT_NE(start, std::string::npos) << out;
  return nlohmann::json::parse(out.substr(start == std::string::npos ? 0 : start));
}

TEST(ValidateCli, ReportsEveryBadRowWithLineAndReason) {
  TempDir dir;
  const std::string path = dir.path + "/d.jsonl";
  std::ofstream(path) << R"({"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]})"
                         "\n"
                      << "not json\n"
                      << R"({"conversations": [{"from": "human", "value": "Q"}, {"from": "bot", "value": "A"}]})"
                         "\n"
                      << R"({"conversations": [{"from": "gpt", "value": "A"}]})"
                         "\n"
                      << R"({"conversations": [{"from": "human", "value": ""}, {"from": "gpt", "value": "A"}]})"
                         "\n";
  int rc = 0;
  std::string out = validate("'" + path + "'", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("format sharegpt, 5 rows, 1 good, 4 bad"), std::string::npos) << out;
  EXPECT_NE(out.find("line 2: not_json"), std::string::npos) << out;
  EXPECT_NE(out.find("line 3: unknown_role"), std::string::npos) << out;
  EXPECT_NE(out.find("line 4: wrong_role_order"), std::string::npos) << out;
  EXPECT_NE(out.find("line 5: empty_turn"), std::string::npos) << out;
  EXPECT_NE(out.find("estimated at 4 bytes per token"), std::string::npos) << out;

  out = validate("'" + path + "' --json --max-errors 2", &rc);
  EXPECT_EQ(rc, 1);
  const nlohmann::json j = json_of(out);
  EXPECT_EQ(j["format"], "sharegpt");
  EXPECT_EQ(j["total_rows"], 5);
  EXPECT_EQ(j["bad_rows"], 4);
  ASSERT_EQ(j["issues"].size(), 2u);
  EXPECT_EQ(j["issues"][0]["line"], 2);
  EXPECT_EQ(j["issues"][0]["reason"], "not_json");
  EXPECT_EQ(j["issues"][1]["line"], 3);
  EXPECT_EQ(j["issues_truncated"], true);
  EXPECT_EQ(j["valid"], false);
  EXPECT_EQ(j["length_check"], "estimate");

  // Forcing another format makes every row miss its field.
  out = validate("'" + path + "' --json --format alpaca", &rc);
  EXPECT_EQ(json_of(out)["issues"][0]["reason"], "missing_field");
}

TEST(ValidateCli, CleanFileExactLengthsWithModel) {
  TempDir dir;
  const std::string path = dir.path + "/ok.jsonl";
  std::ofstream(path) << "{\"text\": \"Once upon a time\"}\n{\"text\": \"" << std::string(300, 'a') << "\"}\n";
  int rc = 0;
  std::string out = validate("'" + path + "' --model '" + shared_dir() + "/models/stories260K' --max-length 100", &rc);
  EXPECT_EQ(rc, 0) << "a long row is truncated by training, not skipped: " << out;
  EXPECT_NE(out.find("2 rows, 2 good, 0 bad"), std::string::npos) << out;
  EXPECT_NE(out.find("line 2: long: "), std::string::npos) << out;
  EXPECT_NE(out.find("1 rows are longer than 100 tokens: training keeps their start"), std::string::npos) << out;
  EXPECT_NE(out.find("exact token counts"), std::string::npos) << out;
  const auto j = json_of(
      validate("'" + path + "' --json --model '" + shared_dir() + "/models/stories260K' --max-seq-length 100", &rc));
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(j["valid"], true);
  EXPECT_EQ(j["long_rows"], 1);
  EXPECT_EQ(j["long"][0]["line"], 2);
  EXPECT_EQ(j["bad_rows"], 0);
  out = validate("'" + path + "' --max-length 0", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("OK: every row is valid"), std::string::npos) << out;
}

TEST(ValidateCli, MissingEmptyAndAllBadFiles) {
  TempDir dir;
  int rc = 0;
  std::string out = validate("'" + dir.path + "/missing.jsonl' --json", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(json_of(out)["code"], "INPUT_DATASET_NOT_FOUND");
  out = validate("'" + dir.path + "/missing.jsonl'", &rc);
  EXPECT_NE(out.find("[INPUT_DATASET_NOT_FOUND]"), std::string::npos) << out;

  std::ofstream(dir.path + "/empty.jsonl") << "\n";
  out = validate("'" + dir.path + "/empty.jsonl' --json", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(json_of(out)["error_code"], "INPUT_DATASET_INVALID");

  std::ofstream(dir.path + "/bad.jsonl") << "x\ny\n";
  out = validate("'" + dir.path + "/bad.jsonl'", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("[INPUT_DATASET_INVALID] every row is bad"), std::string::npos) << out;
}

}  // namespace
}  // namespace bp::test

namespace bp::test {
namespace {

// Issue 15: `validate --model DIR --show N` prints what training will see, trained spans marked,
// rendered with the template training uses (chat_template.jinja, or --chat-template).
TEST(ValidateCli, ShowPrintsRenderedSamplesWithTrainedSpans) {
  TempDir dir;
  const std::string model = shared_dir() + "/models/stories260K";
  ASSERT_TRUE(std::filesystem::exists(model + "/tokenizer.json"));
  std::filesystem::copy_file(model + "/tokenizer.json", dir.path + "/tokenizer.json");
  std::ofstream(dir.path + "/chat_template.jinja")
      << "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant: {% endif %}";
  const std::string data = dir.path + "/d.jsonl";
  std::ofstream(data)
      << R"({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello there"}]})"
         "\n"
      << R"({"conversations": [{"from": "human", "value": "Bye"}, {"from": "gpt", "value": "See you"}]})"
         "\n";
  int rc = 0;
  std::string out = validate("'" + data + "' --model '" + dir.path + "' --show 1", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("Chat template: the model's chat_template.jinja"), std::string::npos) << out;
  EXPECT_NE(out.find("sample from line 1"), std::string::npos) << out;
  EXPECT_EQ(out.find("sample from line 2"), std::string::npos) << out;  // only N = 1
  EXPECT_NE(out.find("Hello there\n[/TRAIN]"), std::string::npos) << out;
  EXPECT_NE(out.find("user: Hi\nassistant:"), std::string::npos) << out;
  const size_t prompt = out.find("user: Hi\nassistant:");
  EXPECT_EQ(out.find("[TRAIN]", prompt), out.find("[TRAIN]", prompt + 1)) << out;  // the prompt is not trained

  out = validate("'" + data + "' --model '" + dir.path + "' --show 5 --chat-template chatml --json", &rc);
  const nlohmann::json j = json_of(out);
  ASSERT_EQ(j["samples"].size(), 2u) << out;
  EXPECT_EQ(j["chat_template"]["source"], "--chat-template");
  const std::string trained = j["samples"][1]["trained"][0];
  EXPECT_NE(trained.find("See you<|im_end|>"), std::string::npos) << out;
  EXPECT_EQ(trained.find("Bye"), std::string::npos) << out;

  out = validate("'" + data + "' --show 1", &rc);  // no tokenizer to render with
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--show needs --model"), std::string::npos) << out;

  // A template we cannot run is refused with its code, not replaced by ChatML.
  std::ofstream(dir.path + "/chat_template.jinja") << "{% for m in messages %}{{ m.content | wordcount }}{% endfor %}";
  out = validate("'" + data + "' --model '" + dir.path + "'", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("INPUT_CHAT_TEMPLATE_UNSUPPORTED"), std::string::npos) << out;
  EXPECT_NE(out.find("filter 'wordcount'"), std::string::npos) << out;
}

// Every --format name the help and docs/settings.md advertise is taken (QA: txt was refused with
// "unknown format 'txt'"): txt reads any file as plain text, messages is openai.
TEST(ValidateCli, AdvertisedFormatNamesAreAccepted) {
  TempDir dir;
  const std::string notes = dir.path + "/notes.md";
  std::ofstream(notes) << "One paragraph.\n\nAnother.\n";
  int rc = 0;
  std::string out = validate("'" + notes + "' --format txt", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("format text, 2 rows, 2 good, 0 bad"), std::string::npos) << out;
  const std::string chat = dir.path + "/chat.jsonl";
  std::ofstream(chat) << R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]})"
                         "\n";
  out = validate("'" + chat + "' --format messages", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("format openai, 1 rows"), std::string::npos) << out;
  out = validate("'" + chat + "' --format jsonl", &rc);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("use one of auto, sharegpt, openai, messages, alpaca, text, txt, preference, kto, csv, tsv"),
            std::string::npos)
      << out;
}

// Preference data (issue 38): each bad-row kind with its line, and --method (WRONG_SHAPE).
const char* kPair = R"({"prompt": "Q", "chosen": "good", "rejected": "bad"})";
const char* kKto = R"({"prompt": "Q", "completion": "good", "label": true})";

TEST(ValidateCli, ReportsEachBadRowKindWithItsLine) {
  TempDir dir;
  const std::string path = dir.path + "/pairs.jsonl";
  std::ofstream(path) << kPair << "\n"
                      << R"({"prompt": "Q", "chosen": "good"})"
                      << "\n"
                      << R"({"prompt": "Q", "chosen": ["good"], "rejected": "bad"})"
                      << "\n"
                      << R"({"prompt": "Q", "chosen": "same", "rejected": "same"})"
                      << "\n"
                      << R"({"prompt": "Q", "chosen": "", "rejected": "bad"})"
                      << "\n"
                      << R"({"chosen": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "a"}], )"
                      << R"("rejected": [{"role": "user", "content": "Q2"}, {"role": "assistant", "content": "b"}]})"
                      << "\n";
  int rc = 0;
  std::string out = validate("'" + path + "'", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("format preference, 6 rows, 1 good, 5 bad"), std::string::npos) << out;
  for (const char* want : {"line 2: missing_field", "line 3: wrong_type", "line 4: identical_pair",
                           "line 5: empty_completion", "line 6: prompt_mismatch"})
    EXPECT_NE(out.find(want), std::string::npos) << want << "\n" << out;

  out = validate("'" + path + "' --json --method dpo", &rc);
  EXPECT_EQ(rc, 1);
  const nlohmann::json j = json_of(out);
  EXPECT_EQ(j["format"], "preference");
  EXPECT_EQ(j["shape"], "pair");
  EXPECT_EQ(j["method"], "dpo");
  EXPECT_FALSE(j.contains("shape_problem")) << out;
  EXPECT_TRUE(j["error_code"].is_null()) << out;  // bad rows are skipped, not fatal
  const std::vector<std::pair<int, std::string>> want = {
      {2, "missing_field"}, {3, "wrong_type"}, {4, "identical_pair"}, {5, "empty_completion"}, {6, "prompt_mismatch"}};
  ASSERT_EQ(j["issues"].size(), want.size()) << out;
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(j["issues"][k]["line"], want[k].first);
    EXPECT_EQ(j["issues"][k]["reason"], want[k].second);
  }
}

TEST(ValidateCli, AFileThatDoesNotFitTheMethodFailsWithTheCode) {
  TempDir dir;
  const std::string kto = dir.path + "/kto.jsonl";
  std::ofstream(kto) << kKto << "\n";
  const std::string pairs = dir.path + "/pairs.jsonl";
  std::ofstream(pairs) << kPair << "\n";
  int rc = 0;
  // Without a method the file is only checked; KTO rows fit kto.
  std::string out = validate("'" + kto + "'", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("format kto"), std::string::npos) << out;
  EXPECT_EQ(out.find("WRONG_SHAPE"), std::string::npos) << out;
  out = validate("'" + kto + "' --method kto", &rc);
  EXPECT_EQ(rc, 0) << out;

  out = validate("'" + kto + "' --method dpo", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("[INPUT_DATASET_WRONG_SHAPE]"), std::string::npos) << out;
  EXPECT_NE(out.find("kto data"), std::string::npos) << out;
  out = validate("'" + kto + "' --method dpo --json", &rc);
  EXPECT_EQ(rc, 1);
  nlohmann::json j = json_of(out);
  EXPECT_EQ(j["error_code"], "INPUT_DATASET_WRONG_SHAPE");
  EXPECT_EQ(j["valid"], false);

  // Pairs: dpo and kto (unpaired) take them; sft does not.
  EXPECT_EQ((validate("'" + pairs + "' --method dpo", &rc), rc), 0);
  EXPECT_EQ((validate("'" + pairs + "' --method kto", &rc), rc), 0);
  out = validate("'" + pairs + "' --method sft --json", &rc);
  EXPECT_EQ(rc, 1) << out;
  j = json_of(out);
  EXPECT_EQ(j["error_code"], "INPUT_DATASET_WRONG_SHAPE");
  EXPECT_NE(j["shape_problem"].get<std::string>().find("preference data"), std::string::npos) << out;
}

// Tool-calling rows (issue 43): a malformed call is bad_tool_call on its line; --show renders the
// tool call trained; --tools, --template-kwargs, --reasoning and --tool-arguments are taken and
// checked as training checks them.
TEST(ValidateCli, ToolCallsByLineAndTheirFlags) {
  TempDir dir;
  const std::string path = dir.path + "/tools.jsonl";
  const std::string tools =
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])";
  std::ofstream(path)
      << R"({"messages": [{"role": "user", "content": "Weather in Oslo?"}, {"role": "assistant", "content": null, )"
         R"("tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": )"
         R"("{\"city\": \"Oslo\"}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "3 C"}, )"
         R"({"role": "assistant", "content": "It is 3 degrees."}], "tools": )"
      << tools << "}\n"
      << R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": null, )"
         R"("tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]})"
         "\n";
  int rc = 0;
  std::string out = validate("'" + path + "'", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("format openai, 2 rows, 1 good, 1 bad"), std::string::npos) << out;
  EXPECT_NE(out.find("line 2: bad_tool_call: turn 2 (assistant): tool call 1 (f): 'arguments' is not valid JSON"),
            std::string::npos)
      << out;
  nlohmann::json j = json_of(validate("'" + path + "' --json", &rc));
  ASSERT_EQ(j["issues"].size(), 1u) << j.dump();
  EXPECT_EQ(j["issues"][0]["line"], 2);
  EXPECT_EQ(j["issues"][0]["reason"], "bad_tool_call");

  // The call trained, as Qwen2.5's template writes it (the tiny model's tokenizer, that template).
  const std::string model = "--model '" + source_dir() + "/models/tiny-chat' --chat-template '" + source_dir() +
                            "/tests/text/data/templates/qwen2.5.jinja'";
  j = json_of(validate("'" + path + "' --json --show 1 " + model, &rc));
  ASSERT_EQ(j["samples"].size(), 1u) << j.dump();
  std::string trained;
  for (const auto& piece : j["samples"][0]["trained"]) trained += piece.get<std::string>() + "|";
  EXPECT_NE(trained.find("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"), std::string::npos)
      << trained;
  EXPECT_NE(trained.find("It is 3 degrees."), std::string::npos) << trained;
  EXPECT_EQ(trained.find("3 C"), std::string::npos) << trained;
  const std::string text = j["samples"][0]["text"].get<std::string>();
  EXPECT_NE(text.find("\"name\": \"get_weather\""), std::string::npos)
      << "the row's tools reach the template: " << text;

  // The flags: taken, and refused as training refuses them.
  out = validate(
      "'" + path + "' --reasoning drop --tool-arguments string --template-kwargs '{\"enable_thinking\": false}'", &rc);
  EXPECT_EQ(rc, 1) << out;  // the bad row is still bad
  EXPECT_NE(out.find("1 good, 1 bad"), std::string::npos) << out;
  const std::string tools_file = dir.path + "/tools.json";
  std::ofstream(tools_file) << tools;
  out = validate("'" + path + "' --tools '" + tools_file + "'", &rc);
  EXPECT_NE(out.find("1 good, 1 bad"), std::string::npos) << out;
  out = validate("'" + path + "' --tools '" + dir.path + "/missing.json'", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("INPUT_DATASET_NOT_FOUND"), std::string::npos) << out;
  out = validate("'" + path + "' --template-kwargs 'enable_thinking=false'", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("CONFIG_INVALID_SETTING"), std::string::npos) << out;
  out = validate("'" + path + "' --reasoning sometimes", &rc);
  EXPECT_NE(rc, 0) << out;
}

}  // namespace
}  // namespace bp::test
