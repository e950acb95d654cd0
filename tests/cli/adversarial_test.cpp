// The adversarial corpus (tests/adversarial/cases.json, issue 13) through the real binary: every
// hostile or unlucky input ends with its expected exit code and error code, never with a signal,
// RUNTIME_INTERNAL or a hang (each command runs under `timeout 30`; a kill reads as 128 + 9).
// One gtest per case (parameterised), so `ctest -R Adversarial` lists them by name.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json load_cases() {
  std::ifstream in(test::source_dir() + "/tests/adversarial/cases.json");
  return json::parse(in)["cases"];
}

std::string substitute(std::string s, const std::string& tmp) {
  const std::pair<std::string, std::string> vars[] = {
      {"{tmp}", tmp}, {"{model}", tmp + "/model"}, {"{src}", test::source_dir()}};
  for (const auto& [k, v] : vars)
    for (size_t p = s.find(k); p != std::string::npos; p = s.find(k, p + v.size())) s.replace(p, k.size(), v);
  return s;
}

// "text", or a list of "text" and ["text", count] pieces.
std::string content_of(const json& spec, const std::string& tmp) {
  if (spec.is_string()) return substitute(spec.get<std::string>(), tmp);
  std::string out;
  for (const json& piece : spec) {
    if (piece.is_string()) {
      out += substitute(piece.get<std::string>(), tmp);
    } else {
      const std::string unit = piece[0].get<std::string>();
      for (int64_t i = 0, n = piece[1].get<int64_t>(); i < n; ++i) out += unit;
    }
  }
  return out;
}

// Merges `patch` into `target` one level deep per object (the tokenizer's "model" keeps its other keys).
void merge(json& target, const json& patch) {
  for (const auto& [k, v] : patch.items()) {
    if (v.is_object() && target.contains(k) && target[k].is_object())
      merge(target[k], v);
    else
      target[k] = v;
  }
}

void set_up(const json& c, const std::string& tmp) {
  if (c.value("model", false))
    fs::copy(test::source_dir() + "/models/tiny-chat", tmp + "/model", fs::copy_options::recursive);
  // Named copies: iterating items() of a temporary would dangle.
  const json dirs = c.value("dirs", json::array()), files = c.value("files", json::object());
  const json json_set = c.value("json_set", json::object()), truncate = c.value("truncate", json::object());
  const json links = c.value("links", json::object()), fifos = c.value("fifos", json::array());
  for (const json& d : dirs) {
    fs::remove_all(tmp + "/" + d.get<std::string>());  // may replace a file of the model
    fs::create_directories(tmp + "/" + d.get<std::string>());
  }
  for (const auto& [path, spec] : files.items()) {
    fs::remove_all(tmp + "/" + path);
    std::ofstream(tmp + "/" + path, std::ios::binary) << content_of(spec, tmp);
  }
  for (const auto& [path, patch] : json_set.items()) {
    std::ifstream in(tmp + "/" + path);
    json j = json::parse(in);
    in.close();
    merge(j, patch);
    std::ofstream(tmp + "/" + path, std::ios::binary) << j.dump();
  }
  for (const auto& [path, bytes] : truncate.items()) fs::resize_file(tmp + "/" + path, bytes.get<uint64_t>());
  for (const auto& [path, target] : links.items()) {
    fs::remove_all(tmp + "/" + path);
    fs::create_symlink(target.get<std::string>(), tmp + "/" + path);
  }
  for (const json& f : fifos) {
    const std::string p = tmp + "/" + f.get<std::string>();
    fs::remove_all(p);
    ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0) << p;
  }
}

class Adversarial : public ::testing::TestWithParam<json> {};

TEST_P(Adversarial, EndsWithItsErrorCodeNeverASignalOrAHang) {
  const json& c = GetParam();
  test::TempDir dir;
  ASSERT_NO_FATAL_FAILURE(set_up(c, dir.path));
  const std::string cmd = "cd " + dir.path + " && env " + substitute(c.value("env", ""), dir.path) +
                          " timeout -s KILL 30 " + test::backprop_exe() + " " +
                          substitute(c["args"].get<std::string>(), dir.path) + " </dev/null";
  std::string out;
  const int rc = test::run_command(cmd, &out);
  SCOPED_TRACE(cmd + "\n" + out.substr(0, 4000));
  ASSERT_LT(rc, 128) << "ended by a signal (137: killed after 30 s)";
  EXPECT_EQ(rc, c["exit"].get<int>());
  EXPECT_NE(out.find("[" + c["code"].get<std::string>() + "]"), std::string::npos) << "expected " << c["code"];
  EXPECT_EQ(out.find("RUNTIME_INTERNAL"), std::string::npos);
  if (c.contains("message")) {
    EXPECT_NE(out.find(c["message"].get<std::string>()), std::string::npos) << "expected " << c["message"];
  }
}

INSTANTIATE_TEST_SUITE_P(Corpus, Adversarial, ::testing::ValuesIn(load_cases().get<std::vector<json>>()),
                         [](const ::testing::TestParamInfo<json>& info) {
                           return info.param["name"].get<std::string>();
                         });

TEST(AdversarialCorpus, EveryCaseHasANameAnExitCodeAndAnErrorCode) {
  const json cases = load_cases();
  EXPECT_GE(cases.size(), 30u);
  std::set<std::string> names;
  for (const json& c : cases) {
    ASSERT_TRUE(c.contains("name") && c.contains("args") && c.contains("exit") && c.contains("code")) << c.dump();
    EXPECT_TRUE(names.insert(c["name"].get<std::string>()).second) << "duplicate " << c["name"];
    EXPECT_NE(c["code"], "RUNTIME_INTERNAL");
  }
}

}  // namespace
}  // namespace bp
