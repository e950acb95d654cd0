// `backprop data report` and `backprop data split` as a user runs them (the real binary): every
// finding kind planted at a known line and found there, the --json counts, --fail-on's exit codes,
// exact token lengths with --model, and split's determinism, fraction and near-duplicate groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "support/test_util.h"

namespace bp {
namespace {

nlohmann::json chat(const std::string& q, const std::string& a) {
  return {{"messages", {{{"role", "user"}, {"content", q}}, {{"role", "assistant"}, {"content", a}}}}};
}

std::string question(int i) {
  const char* names[] = {"Tom", "Mia", "Ben", "Sue", "Max", "Lily", "Sam", "Zoe", "Ivy", "Leo"};
  return "Question " + std::to_string(i) + ": " + names[i % 10] + " keeps ball number " + std::to_string(i * 7) +
         " in the shed behind house " + std::to_string(i * 13) + " on street " + std::to_string(i * 31) +
         " of the town by the river. Where is the ball of " + names[i % 10] + "?";
}

// Planted at known lines (1-based): 11 duplicates 4; 21 is 6 with one more word; 26 has an empty
// answer; 31 starts with the assistant; 34 is 3000 words. The eval file: line 2 is training line 8,
// line 4 is training line 13 with another answer.
void write_files(const std::string& dir) {
  std::vector<nlohmann::json> rows;
  for (int i = 0; i < 40; ++i) rows.push_back(chat(question(i), "Answer: in the shed."));
  rows[10] = rows[3];
  rows[20] = chat(question(5) + " Please.", "Answer: in the shed.");
  rows[25] = chat("Hi", "");
  rows[30] = {{"messages", {{{"role", "assistant"}, {"content", "x"}}, {{"role", "user"}, {"content", "y"}}}}};
  std::string many;
  for (int k = 0; k < 3000; ++k) many += "word ";
  rows[33] = chat(many, "Answer: long.");
  std::ofstream t(dir + "/train.jsonl");
  for (const auto& r : rows) t << r.dump() << "\n";
  std::vector<nlohmann::json> ev;
  for (int i = 0; i < 5; ++i)
    ev.push_back(chat("Eval " + std::to_string(i) + ": what is in the box?", "Answer: a cat."));
  ev[1] = rows[7];
  ev[3] = chat(question(12), "Answer: somewhere else.");
  std::ofstream e(dir + "/eval.jsonl");
  for (const auto& r : ev) e << r.dump() << "\n";
}

nlohmann::json report_json(const std::string& args, int* rc = nullptr) {
  std::string out;
  const int code = test::run_command(test::backprop_exe() + " data report " + args + " --json 2>/dev/null", &out);
  if (rc) *rc = code;
  return nlohmann::json::parse(out.substr(out.find('{')));
}

// kind -> the set of (line, other_line) found.
std::map<std::string, std::set<std::pair<int64_t, int64_t>>> by_kind(const nlohmann::json& j) {
  std::map<std::string, std::set<std::pair<int64_t, int64_t>>> m;
  for (const auto& f : j["findings"]) m[f["kind"]].insert({f["line"], f.value("other_line", int64_t{0})});
  return m;
}

TEST(DataCli, ReportFindsEveryPlantedProblemAtItsLine) {
  test::TempDir tmp;
  write_files(tmp.path);
  int rc = -1;
  const auto j =
      report_json(tmp.path + "/train.jsonl --eval-data " + tmp.path + "/eval.jsonl --max-seq-length 512", &rc);
  EXPECT_EQ(rc, 0) << "no --fail-on: the report itself succeeds";
  const auto f = by_kind(j);
  using P = std::set<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(f.at("duplicate"), (P{{11, 4}}));
  EXPECT_EQ(f.at("near_duplicate"), (P{{21, 6}}));
  EXPECT_EQ(f.at("empty_target"), (P{{26, 0}}));
  EXPECT_EQ(f.at("bad_row"), (P{{31, 0}}));
  EXPECT_EQ(f.at("too_long"), (P{{34, 0}}));
  EXPECT_EQ(f.at("contamination"), (P{{2, 8}}));
  EXPECT_EQ(f.at("near_contamination"), (P{{4, 13}}));
  EXPECT_EQ(j["counts"]["near_duplicate"], 1);
  EXPECT_EQ(j["train"]["rows"], 40);
  EXPECT_EQ(j["train"]["good_rows"], 38);  // less the bad row and the empty answer
  EXPECT_EQ(j["train"]["length_unit"], "characters");
  int64_t in_histogram = 0;
  for (const auto& b : j["train"]["histogram"]) in_histogram += b["rows"].get<int64_t>();
  EXPECT_EQ(in_histogram, 38) << j["train"].dump();
  EXPECT_EQ(j["train"]["histogram"].back()["rows"], 1) << "one row above max_seq_length";
  for (const auto& x : j["findings"])
    if (x["kind"] == "near_duplicate") {
      EXPECT_GE(x["similarity"].get<double>(), 0.8);
    }
}

// Tool-calling rows (issue 43): two rows that differ only in a call's arguments are not exact
// duplicates (the call is what they teach), the same row twice is; a malformed call is a bad_row naming
// bad_tool_call; --tools is read (a missing file is refused).
TEST(DataCli, ToolCallsCountInDuplicatesAndBadCallsAreBadRows) {
  test::TempDir tmp;
  const auto row = [](const std::string& args) {
    return nlohmann::json{
        {"messages",
         {{{"role", "user"}, {"content", "What is the weather like in the city right now, please tell me?"}},
          {{"role", "assistant"},
           {"content", nullptr},
           {"tool_calls", {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", args}}}}}}},
          {{"role", "tool"}, {"content", "3 C"}},
          {{"role", "assistant"}, {"content", "It is 3 degrees right now in the city you asked about."}}}}};
  };
  std::ofstream(tmp.path + "/t.jsonl") << row("{\"city\": \"Oslo\"}").dump() << "\n"
                                       << row("{\"city\": \"Lima\"}").dump() << "\n"
                                       << row("{\"city\": \"Oslo\"}").dump() << "\n"
                                       << row("{oops").dump() << "\n";
  std::ofstream(tmp.path + "/tools.json") << R"([{"type": "function", "function": {"name": "get_weather"}}])";
  int rc = -1;
  const auto j = report_json(tmp.path + "/t.jsonl --tools " + tmp.path + "/tools.json", &rc);
  EXPECT_EQ(rc, 0);
  const auto f = by_kind(j);
  using P = std::set<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(f.at("duplicate"), (P{{3, 1}})) << j.dump();
  EXPECT_EQ(f.at("bad_row"), (P{{4, 0}}));
  for (const auto& x : j["findings"])
    if (x["kind"] == "bad_row") {
      EXPECT_NE(x["message"].get<std::string>().find("bad_tool_call"), std::string::npos);
    }
  std::string out;
  EXPECT_NE(
      test::run_command(
          test::backprop_exe() + " data report " + tmp.path + "/t.jsonl --tools " + tmp.path + "/missing.json", &out),
      0)
      << out;
}

TEST(DataCli, FailOnGatesTheExitCode) {
  test::TempDir tmp;
  write_files(tmp.path);
  std::string out;
  const std::string base = test::backprop_exe() + " data report " + tmp.path + "/train.jsonl --max-seq-length 512 ";
  EXPECT_EQ(test::run_command(base + "--fail-on duplicate,near_contamination", &out), 1) << out;
  EXPECT_NE(out.find("FAIL: --fail-on found duplicate"), std::string::npos) << out;
  // No eval file: no contamination, so that gate passes.
  EXPECT_EQ(test::run_command(base + "--fail-on contamination,near_contamination", &out), 0) << out;
  EXPECT_EQ(test::run_command(base + "--fail-on any", &out), 1) << out;
  EXPECT_EQ(test::run_command(base + "--fail-on duplicates", &out), 1) << out;  // a typo is an error, not a pass
  EXPECT_NE(out.find("INPUT_VALIDATION_FAILED"), std::string::npos) << out;
  EXPECT_NE(out.find("near_duplicate"), std::string::npos) << "the message lists the kinds: " << out;
  // A clean file passes every gate.
  {
    std::ofstream c(tmp.path + "/clean.jsonl");
    for (int i = 0; i < 10; ++i) c << chat(question(i), "Answer: in the shed.").dump() << "\n";
  }
  EXPECT_EQ(test::run_command(test::backprop_exe() + " data report " + tmp.path + "/clean.jsonl --fail-on any", &out),
            0)
      << out;
  EXPECT_NE(out.find("OK: nothing found"), std::string::npos) << out;
}

// With the model: lengths in its tokens, and a row whose answer lies past max_seq_length is one
// training would skip (not merely truncate).
TEST(DataCli, ReportWithTheModelCountsTokens) {
  test::TempDir tmp;
  write_files(tmp.path);
  const auto j =
      report_json(tmp.path + "/train.jsonl --max-seq-length 512 --model " + test::source_dir() + "/models/tiny-chat");
  EXPECT_EQ(j["train"]["length_unit"], "tokens");
  bool found = false;
  for (const auto& f : j["findings"])
    if (f["kind"] == "too_long") {
      found = true;
      EXPECT_EQ(f["line"], 34);
      EXPECT_NE(f["message"].get<std::string>().find("training skips it"), std::string::npos) << f.dump();
    }
  EXPECT_TRUE(found) << j.dump(2);
}

// A chat template whose {% generation %} block holds nothing: every label is -100, so every row
// trains on nothing (the loss-is-0 bug): each row is an empty_target, with its line.
TEST(DataCli, ATemplateThatMasksEveryAnswerMakesEveryRowAnEmptyTarget) {
  test::TempDir tmp;
  {
    std::ofstream f(tmp.path + "/rows.jsonl");
    for (int i = 0; i < 3; ++i) f << chat(question(i), "Answer: in the shed.").dump() << "\n";
    std::ofstream t(tmp.path + "/masked.jinja");
    t << "{% for m in messages %}<|{{ m.role }}|>{% if m.role == 'assistant' %}{% generation %}{% endgeneration %}"
         "{{ m.content }}{% else %}{{ m.content }}{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}<|assistant|>{% endif %}";
  }
  const auto j = report_json(tmp.path + "/rows.jsonl --model " + test::source_dir() +
                             "/models/tiny-chat --chat-template " + tmp.path + "/masked.jinja");
  const auto f = by_kind(j);
  using P = std::set<std::pair<int64_t, int64_t>>;
  ASSERT_TRUE(f.count("empty_target")) << j.dump(2);
  EXPECT_EQ(f.at("empty_target"), (P{{1, 0}, {2, 0}, {3, 0}}));
  // The shipped template trains the answers: nothing to report.
  const auto ok = report_json(tmp.path + "/rows.jsonl --model " + test::source_dir() + "/models/tiny-chat");
  EXPECT_EQ(ok["counts"]["empty_target"], 0) << ok.dump(2);
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> v;
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

TEST(DataCli, SplitIsDeterministicKeepsNearDuplicatesTogetherAndLosesNothing) {
  test::TempDir tmp;
  {
    std::ofstream f(tmp.path + "/rows.jsonl");
    for (int i = 0; i < 200; ++i) f << chat(question(i), "Answer: in the shed.").dump() << "\n";
    for (int i = 0; i < 10; ++i)  // rows 201-210: near-duplicates of rows 1-10
      f << chat(question(i) + " Please.", "Answer: in the shed.").dump() << "\n";
  }
  std::string out;
  const std::string cmd =
      test::backprop_exe() + " data split " + tmp.path + "/rows.jsonl --eval-fraction 0.2 --seed 5 ";
  ASSERT_EQ(test::run_command(
                cmd + "--train-out " + tmp.path + "/a.train.jsonl --eval-out " + tmp.path + "/a.eval.jsonl", &out),
            0)
      << out;
  ASSERT_EQ(test::run_command(cmd, &out), 0) << out;  // default names beside the input
  EXPECT_EQ(lines_of(tmp.path + "/a.train.jsonl"), lines_of(tmp.path + "/rows.train.jsonl"));
  EXPECT_EQ(lines_of(tmp.path + "/a.eval.jsonl"), lines_of(tmp.path + "/rows.eval.jsonl"));
  const auto train = lines_of(tmp.path + "/rows.train.jsonl"), eval = lines_of(tmp.path + "/rows.eval.jsonl");
  EXPECT_NEAR(static_cast<double>(eval.size()), 42.0, 3.0);
  std::multiset<std::string> all(train.begin(), train.end());
  all.insert(eval.begin(), eval.end());
  const auto input = lines_of(tmp.path + "/rows.jsonl");
  EXPECT_EQ(all, std::multiset<std::string>(input.begin(), input.end())) << "every row once, byte for byte";
  const std::set<std::string> in_eval(eval.begin(), eval.end());
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(in_eval.count(input[static_cast<size_t>(i)]), in_eval.count(input[static_cast<size_t>(200 + i)]))
        << "row " << i + 1 << " and its near-duplicate " << 201 + i << " on different sides";
  EXPECT_NE(out.find("10 groups of near-duplicates (20 rows)"), std::string::npos) << out;
  // Another seed, another split.
  ASSERT_EQ(test::run_command(test::backprop_exe() + " data split " + tmp.path +
                                  "/rows.jsonl --eval-fraction 0.2 --seed 6 --eval-out " + tmp.path + "/b.eval.jsonl",
                              &out),
            0)
      << out;
  EXPECT_NE(lines_of(tmp.path + "/b.eval.jsonl"), eval);
}

TEST(DataCli, BadInputIsRefusedWithACode) {
  test::TempDir tmp;
  std::string out;
  const std::string bp = test::backprop_exe();
  EXPECT_EQ(test::run_command(bp + " data report " + tmp.path + "/missing.jsonl", &out), 1) << out;
  EXPECT_NE(out.find("INPUT_DATASET_NOT_FOUND"), std::string::npos) << out;
  {
    std::ofstream f(tmp.path + "/arr.json");
    f << "[" << chat("a", "b").dump() << ", " << chat("c", "d").dump() << "]\n";
  }
  EXPECT_EQ(test::run_command(bp + " data split " + tmp.path + "/arr.json", &out), 1) << out;
  EXPECT_NE(out.find("not JSONL"), std::string::npos) << out;
  {
    std::ofstream f(tmp.path + "/ok.jsonl");
    for (int i = 0; i < 4; ++i) f << chat(question(i), "x").dump() << "\n";
  }
  EXPECT_EQ(test::run_command(bp + " data split " + tmp.path + "/ok.jsonl --eval-fraction 1.5", &out), 1) << out;
  EXPECT_NE(out.find("--eval-fraction must be in (0, 1)"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(bp + " data split " + tmp.path + "/ok.jsonl --train-out " + tmp.path + "/ok.jsonl", &out),
            1)
      << out;
  EXPECT_NE(out.find("not the input"), std::string::npos) << out;
  EXPECT_EQ(lines_of(tmp.path + "/ok.jsonl").size(), 4u) << "the input is untouched";
  EXPECT_EQ(test::run_command(bp + " data report " + tmp.path + "/ok.jsonl --near-duplicate-threshold 0", &out), 1)
      << out;
}

}  // namespace
}  // namespace bp
