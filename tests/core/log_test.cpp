// Logger sinks: console (human and JSON) and JSON-lines file; run id on every record; secrets
// redacted in every sink; levels filter.
#include "core/log.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/redact.h"
#include "core/settings.h"
#include "core/uuid.h"
#include "support/test_util.h"

namespace bp {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

const char* kSecretLine = "auth Bearer abcdefghijklmnop password=hunter22 hf_ABCDEFGHIJKLMNOP --auth bob:pa55word";

void expect_no_secrets(const std::string& text) {
  for (const char* s : {"abcdefghijklmnop", "hunter22", "ABCDEFGHIJKLMNOP", "pa55word"})
    EXPECT_EQ(text.find(s), std::string::npos) << s << " leaked in: " << text;
  EXPECT_NE(text.find("***"), std::string::npos) << text;
}

class LogTest : public ::testing::Test {
 protected:
  void TearDown() override {
    log::init(log::LogOptions{});  // back to a plain stderr logger
  }
  test::TempDir dir;
};

TEST_F(LogTest, EverySinkRedactsAndFileRecordsCarryTheRunId) {
  for (std::string format : {"console", "json"}) {
    std::string console_path = dir.path + "/console_" + format + ".txt";
    std::string file_path = dir.path + "/log_" + format + ".jsonl";
    std::string extra_path = dir.path + "/extra_" + format + ".jsonl";
    FILE* console = std::fopen(console_path.c_str(), "w");
    ASSERT_NE(console, nullptr);
    log::LogOptions o;
    o.level = "debug";
    o.format = format;
    o.file = file_path;
    o.console = console;
    log::init(o);
    log::add_file(extra_path);
    spdlog::info("hello {}", 42);
    spdlog::warn("{}", kSecretLine);
    spdlog::debug("debug line");
    spdlog::trace("trace line is below the level");
    log::flush();
    log::init(log::LogOptions{});  // releases the sinks
    std::fclose(console);

    std::string console_text = slurp(console_path);
    expect_no_secrets(console_text);
    EXPECT_NE(console_text.find("hello 42"), std::string::npos);
    EXPECT_NE(console_text.find("debug line"), std::string::npos);
    EXPECT_EQ(console_text.find("trace line"), std::string::npos);
    if (format == "json") {
      auto recs = json_lines(console_text);
      ASSERT_EQ(recs.size(), 3u);
      EXPECT_EQ(recs[0]["run_id"], log::run_id());
    } else {
      EXPECT_NE(console_text.find("[info] hello 42"), std::string::npos) << console_text;
    }
    for (const auto& path : {file_path, extra_path}) {
      std::string text = slurp(path);
      expect_no_secrets(text);
      auto recs = json_lines(text);
      ASSERT_EQ(recs.size(), 3u) << text;
      for (const auto& r : recs) {
        EXPECT_EQ(r["run_id"], log::run_id());
        EXPECT_TRUE(is_uuid4(r["run_id"].get<std::string>()));
        EXPECT_TRUE(r.contains("ts") && r.contains("level") && r.contains("msg"));
      }
      EXPECT_EQ(recs[0]["msg"], "hello 42");
      EXPECT_EQ(recs[0]["level"], "info");
      EXPECT_EQ(recs[1]["level"], "warning");
    }
  }
}

// The Python package's logging: console records go to the handler (spdlog's level, the redacted
// message, no time prefix) instead of the FILE*; the file sinks are unchanged; JSON format keeps
// its console lines.
TEST_F(LogTest, ConsoleHandlerGetsLevelAndRedactedMessage) {
  std::vector<std::pair<int, std::string>> got;
  const std::string console_path = dir.path + "/console.txt";
  FILE* console = std::fopen(console_path.c_str(), "w");
  ASSERT_NE(console, nullptr);
  log::LogOptions o;
  o.level = "info";
  o.console = console;
  o.file = dir.path + "/log.jsonl";
  o.console_handler = [&](int level, const std::string& message) { got.emplace_back(level, message); };
  log::init(o);
  spdlog::info("hello {}", 7);
  spdlog::warn("{}", kSecretLine);
  spdlog::debug("below the level");
  log::flush();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], std::make_pair(static_cast<int>(spdlog::level::info), std::string("hello 7")));
  EXPECT_EQ(got[1].first, static_cast<int>(spdlog::level::warn));
  expect_no_secrets(got[1].second);
  EXPECT_EQ(json_lines(slurp(dir.path + "/log.jsonl")).size(), 2u);
  o.format = "json";
  log::init(o);
  spdlog::info("as json");
  log::init(log::LogOptions{});
  std::fclose(console);
  EXPECT_EQ(got.size(), 2u) << "json format writes its records to the console stream";
  EXPECT_NE(slurp(console_path).find("as json"), std::string::npos);
  EXPECT_EQ(slurp(console_path).find("hello 7"), std::string::npos);
}

TEST_F(LogTest, SettingsDriveLevelFileAndRedaction) {
  std::string file_path = dir.path + "/s.jsonl";
  Settings s = Settings::load("", {}, {{"logging.level", "warn"}, {"logging.file", file_path}});
  log::init_from_settings(s);
  spdlog::info("not written");
  spdlog::error("login with password=Plain-Pass-9 failed");
  log::flush();
  std::string text = slurp(file_path);
  EXPECT_EQ(text.find("not written"), std::string::npos);
  EXPECT_EQ(text.find("Plain-Pass-9"), std::string::npos) << text;
  EXPECT_NE(text.find("login with password=*** failed"), std::string::npos) << text;
  // security.redact_secrets = false turns redaction off (for debugging a redaction mistake)
  const std::string off_path = dir.path + "/off.jsonl";
  log::init_from_settings(Settings::load("", {}, {{"logging.file", off_path}, {"security.redact_secrets", "false"}}));
  spdlog::error("login with password=Plain-Pass-9 failed");
  log::flush();
  log::init(log::LogOptions{});
  EXPECT_NE(slurp(off_path).find("Plain-Pass-9"), std::string::npos);
  set_redaction_enabled(true);
}

TEST_F(LogTest, BadOptionsThrowCatalogErrors) {
  log::LogOptions o;
  o.level = "loud";
  EXPECT_THROW(log::init(o), Error);
  o.level = "info";
  o.file = dir.path + "/no/such/dir/log.jsonl";
  try {
    log::init(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
    EXPECT_NE(std::string(e.what()).find("log.jsonl"), std::string::npos);
  }
}

TEST_F(LogTest, RunIdIsStableAndBeginRunCanAdoptAnId) {
  std::string id = log::run_id();
  EXPECT_TRUE(is_uuid4(id));
  EXPECT_EQ(log::run_id(), id);
  EXPECT_FALSE(log::run_started());
  std::string resumed = uuid4();
  log::begin_run(resumed);
  EXPECT_TRUE(log::run_started());
  EXPECT_EQ(log::run_id(), resumed);
}

}  // namespace
}  // namespace bp
