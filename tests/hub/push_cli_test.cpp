// `backprop push` and `backprop export --push-to-hub` end to end (the real binary) against the fake
// hub (fake_hub.h): a 2-step run trained on org/tiny (stories260K served by the fake hub) and
// evaluated with `backprop eval` is pushed as lora and gguf; the commit holds the export's files
// and a model card with the hub's YAML metadata (base model, library, licence from the base's
// cardData, tags), the changed settings, the data's sha256, eval results with intervals, the
// backprop version and the command that reproduces the run; 429/500 answers are retried; 401/403/
// 404 and bad names end in their catalog codes; the token (HF_TOKEN or the login file) appears in
// no output, log or file.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "build_info.h"
#include "hub/fake_hub.h"
#include "io/sha256.h"
#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

constexpr const char* kToken = "hf_PushCliSecret0123456789abcdefXYZ";
const std::string kSha = "fedcba9876543210fedcba9876543210fedcba98";

class PushCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    hub_ = new test::FakeHub;
    tmp_ = new test::TempDir;
    const fs::path d = fs::path(test::shared_dir()) / "models" / "stories260K";
    std::map<std::string, std::string> files;
    for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"})
      files[f] = test::read_bytes(d / f);
    hub_->add_repo("org/tiny", kSha, files);
    hub_->licenses["org/tiny"] = "apache-2.0";
    hub_->write_token = kToken;
    data_ = tmp_->path + "/data.jsonl";
    std::ofstream f(data_);
    const char* names[] = {"Lily", "Tom", "Ben", "Sue"};
    for (int i = 0; i < 12; ++i)
      f << "{\"instruction\": \"Who had a red ball?\", \"input\": \"\", \"output\": \"" << names[i % 4] << "\"}\n";
    f.close();
    std::string out;
    int rc = run_env(fmt::format("train --device cpu --json --model org/tiny --data {} --output {}/runs --steps 2 "
                                 "--batch-size 2 --threads 1 --lr 0.01 --lora-r 4 2>/dev/null",
                                 data_, tmp_->path),
                     &out);
    ASSERT_EQ(rc, 0) << out;
    run_dir_ = nlohmann::json::parse(out).at("output_dir").get<std::string>();
    rc = run_env(fmt::format("eval {} --eval-data {} --metric exact_match,token_f1 --max-examples 4 "
                             "--max-new-tokens 4 --resamples 50 2>&1",
                             run_dir_, data_),
                 &out);
    ASSERT_EQ(rc, 0) << out;
    ASSERT_TRUE(fs::is_regular_file(run_dir_ + "/eval_results.json")) << out;
  }
  static void TearDownTestSuite() {
    delete hub_;
    delete tmp_;
  }
  // The hub's environment with the token in HF_TOKEN (`token` "" = none, and no token file).
  static std::string env(const std::string& token = kToken) {
    return "env -u HF_TOKEN -u HF_HUB_OFFLINE -u HF_HOME -u HUGGING_FACE_HUB_TOKEN HF_ENDPOINT=" + hub_->endpoint() +
           " HF_HUB_CACHE=" + tmp_->path + "/cache HF_TOKEN_PATH=" + tmp_->path + "/no-token " +
           (token.empty() ? "" : "HF_TOKEN=" + token + " ");
  }
  static int run_env(const std::string& args, std::string* out, const std::string& token = kToken) {
    return test::run_command("(" + env(token) + test::backprop_exe() + " " + args + ")", out);
  }
  // Every file under the suite's folder (runs, exports, the card, upload state, logs, the cache)
  // and every output: the token must be in none of them.
  static void expect_token_nowhere(const std::string& output, const std::string& token = kToken) {
    EXPECT_EQ(output.find(token), std::string::npos) << output;
    for (const auto& e : fs::recursive_directory_iterator(tmp_->path)) {
      if (!e.is_regular_file()) continue;
      EXPECT_EQ(test::read_bytes(e.path().string()).find(token), std::string::npos) << e.path();
    }
    for (const auto& q : hub_->requests()) EXPECT_EQ(q.body.find(token), std::string::npos) << q.path;
  }
  static test::FakeCommit last_commit() {
    const auto c = hub_->commits();
    return c.empty() ? test::FakeCommit{} : c.back();
  }
  static test::FakeHub* hub_;
  static test::TempDir* tmp_;
  static std::string run_dir_, data_;
};
test::FakeHub* PushCli::hub_ = nullptr;
test::TempDir* PushCli::tmp_ = nullptr;
std::string PushCli::run_dir_, PushCli::data_;

TEST_F(PushCli, PushesTheAdapterWithAGeneratedModelCard) {
  std::string out;
  const std::string log = tmp_->path + "/push-log.jsonl", err = tmp_->path + "/push-stderr.txt";
  ASSERT_EQ(run_env("--log-file " + log + " --log-level debug push " + run_dir_ +
                        " --repo alice/tiny-lora --private --json 2>" + err,
                    &out),
            0)
      << out << test::read_bytes(err);
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["repo_url"], hub_->endpoint() + "/alice/tiny-lora");
  EXPECT_EQ(j["created_repo"], true);
  EXPECT_EQ(j["base_model"], "org/tiny");
  EXPECT_EQ(j["license"], "apache-2.0");
  EXPECT_TRUE(hub_->is_private("alice/tiny-lora"));
  const test::FakeCommit c = last_commit();
  ASSERT_EQ(c.repo, "alice/tiny-lora");
  EXPECT_EQ(c.lfs_paths, std::vector<std::string>{"adapter_model.safetensors"});
  EXPECT_EQ(c.files.at("adapter_model.safetensors"),
            test::read_bytes(run_dir_ + "/export/adapter/adapter_model.safetensors"));
  // The pushed adapter names its base by hub id, so PEFT finds it from anywhere.
  EXPECT_EQ(nlohmann::json::parse(c.files.at("adapter_config.json"))["base_model_name_or_path"], "org/tiny");
  const std::string card = c.files.at("README.md");
  EXPECT_EQ(card.rfind("---\nbase_model: org/tiny\nlibrary_name: peft\npipeline_tag: text-generation\nlicense: "
                       "apache-2.0\ntags:\n- backprop\n- lora\n- peft\n- sft\n---\n",
                       0),
            0u)
      << card;
  EXPECT_NE(card.find("| `lora.r` | `4` |"), std::string::npos) << card;
  EXPECT_NE(card.find("sha256 `" + sha256_file_hex(data_) + "`"), std::string::npos) << card;
  EXPECT_NE(card.find("| exact_match | "), std::string::npos) << card;
  EXPECT_NE(card.find("| token_f1 | "), std::string::npos) << card;
  EXPECT_NE(card.find("95% bootstrap intervals, 50 resamples"), std::string::npos) << card;
  EXPECT_NE(card.find(std::string("backprop ") + BP_VERSION), std::string::npos) << card;
  const size_t cmd = card.find("```sh\nbackprop train");
  ASSERT_NE(cmd, std::string::npos) << card;
  const std::string line = card.substr(cmd + 6, card.find('\n', cmd + 6) - cmd - 6);
  for (const std::string& flag :
       std::vector<std::string>{"--model org/tiny", "--data " + data_, "--steps 2", "--lora-r 4", "--lr 0.01"})
    EXPECT_NE(line.find(flag), std::string::npos) << flag << " in " << line;
  EXPECT_TRUE(fs::is_regular_file(run_dir_ + "/export/hub-push/README.md"));
  EXPECT_NE(test::read_bytes(log).find("created " + hub_->endpoint() + "/alice/tiny-lora"), std::string::npos);
  EXPECT_NE(test::read_bytes(err).find("[hub] uploading adapter_model.safetensors"), std::string::npos);
  expect_token_nowhere(out + test::read_bytes(log) + test::read_bytes(err));
}

TEST_F(PushCli, TheTokenFromTheLoginFileIsUsed) {
  const std::string token_file = tmp_->path + "/login-token";
  std::ofstream(token_file) << kToken << "\n";
  std::string out;
  // No HF_TOKEN: the token comes from HF_TOKEN_PATH, as huggingface-cli login writes it.
  ASSERT_EQ(test::run_command("(" + env("") + "HF_TOKEN_PATH=" + token_file + " " + test::backprop_exe() + " push " +
                                  run_dir_ + " --repo alice/from-login 2>&1)",
                              &out),
            0)
      << out;
  EXPECT_EQ(last_commit().repo, "alice/from-login");
  EXPECT_NE(out.find("Pushed lora to " + hub_->endpoint() + "/alice/from-login"), std::string::npos) << out;
  fs::remove(token_file);
  expect_token_nowhere(out);
}

TEST_F(PushCli, GgufFormatPushesTheGgufFileAndItsModelfile) {
  std::string out;
  ASSERT_EQ(run_env("push " + run_dir_ + " --repo alice/tiny-gguf --format gguf --revision gguf-f16 --json 2>/dev/null",
                    &out),
            0)
      << out;
  const test::FakeCommit c = last_commit();
  EXPECT_EQ(c.repo, "alice/tiny-gguf");
  EXPECT_EQ(c.revision, "gguf-f16");
  ASSERT_EQ(c.lfs_paths.size(), 1u);
  EXPECT_EQ(fs::path(c.lfs_paths[0]).extension(), ".gguf");
  EXPECT_EQ(c.files.at(c.lfs_paths[0]).substr(0, 4), "GGUF");
  const std::string modelfile = fs::path(c.lfs_paths[0]).stem().string() + ".Modelfile";
  ASSERT_EQ(c.files.count(modelfile), 1u);
  EXPECT_NE(c.files.at(modelfile).find("FROM ./" + c.lfs_paths[0] + "\n"), std::string::npos) << c.files.at(modelfile);
  EXPECT_EQ(c.files.at(modelfile).find(tmp_->path), std::string::npos) << c.files.at(modelfile);
  EXPECT_NE(c.files.at("README.md").find("library_name: gguf\n"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(out)["created_branch"], true);
  expect_token_nowhere(out);
}

TEST_F(PushCli, ExportPushToHubExportsAndPushes) {
  std::string out;
  ASSERT_EQ(run_env("export " + run_dir_ + " --format merged --push-to-hub alice/tiny-merged --json 2>/dev/null", &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["format"], "merged");
  EXPECT_EQ(j["push"]["repo_url"], hub_->endpoint() + "/alice/tiny-merged");
  const test::FakeCommit c = last_commit();
  EXPECT_EQ(c.repo, "alice/tiny-merged");
  EXPECT_EQ(c.files.count("config.json"), 1u);
  EXPECT_EQ(c.files.count("model.safetensors"), 1u);
  EXPECT_NE(c.files.at("README.md").find("library_name: transformers\n"), std::string::npos);
  expect_token_nowhere(out);
}

TEST_F(PushCli, RateLimitsAndServerErrorsAreRetriedWithBackoff) {
  hub_->fail("/api/repos/create", 429, 1, "0");
  hub_->fail("/commit/", 500, 1);
  std::string out;
  ASSERT_EQ(run_env("push " + run_dir_ + " --repo alice/retried --push-retry-wait 0 --json 2>/dev/null", &out), 0)
      << out;
  EXPECT_EQ(nlohmann::json::parse(out)["retries"], 2);
  EXPECT_EQ(last_commit().repo, "alice/retried");
  // Retries spent: the code and a retryable suggestion.
  hub_->fail("/commit/", 503, 2);  // the first try and the one retry: nothing stays armed
  EXPECT_EQ(run_env("push " + run_dir_ + " --repo alice/retried --push-retry-wait 0 --push-retries 1 2>&1", &out), 2);
  EXPECT_NE(out.find("DEP_HUB_UPLOAD_FAILED"), std::string::npos) << out;
  EXPECT_NE(out.find("503"), std::string::npos) << out;
  expect_token_nowhere(out);
}

TEST_F(PushCli, AuthNotFoundAndBadNamesEndInTheirCodes) {
  std::string out;
  const std::string wrong = "hf_NotTheRightToken987654321";
  EXPECT_EQ(run_env("push " + run_dir_ + " --repo alice/denied 2>&1", &out, wrong), 2);
  EXPECT_NE(out.find("DEP_HUB_AUTH_FAILED"), std::string::npos) << out;
  EXPECT_NE(out.find("403"), std::string::npos) << out;
  EXPECT_NE(out.find("write access"), std::string::npos) << out;
  expect_token_nowhere(out, wrong);
  expect_token_nowhere(out);

  hub_->clear_requests();  // no token at all: refused before the export and before any request
  EXPECT_EQ(run_env("push " + run_dir_ + " --repo alice/no-token --output " + tmp_->path + "/never 2>&1", &out, ""), 2);
  EXPECT_NE(out.find("DEP_HUB_AUTH_FAILED"), std::string::npos) << out;
  EXPECT_NE(out.find("huggingface-cli login"), std::string::npos) << out;
  EXPECT_TRUE(hub_->requests().empty());
  EXPECT_FALSE(fs::exists(tmp_->path + "/never"));

  EXPECT_EQ(run_env("push " + run_dir_ + " --repo alice/tiny-lora --revision refs/pr/3 2>&1", &out), 2);
  EXPECT_NE(out.find("DEP_HUB_NOT_FOUND"), std::string::npos) << out;
  EXPECT_NE(out.find("refs/pr/3"), std::string::npos) << out;

  EXPECT_EQ(run_env("push " + run_dir_ + " --repo not-a-repo 2>&1", &out), 1);
  EXPECT_NE(out.find("INPUT_VALIDATION_FAILED"), std::string::npos) << out;
  expect_token_nowhere(out);
}

}  // namespace
}  // namespace bp
