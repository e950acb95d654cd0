// `--model org/name` through the commands (estimate-vram, generate, validate, train), against the
// fake hub of fake_hub.h: the environment (HF_ENDPOINT, HF_HUB_CACHE, HF_TOKEN) and --offline reach
// the one resolver every command uses, estimate-vram fetches no weights, and errors end in the
// catalog's codes with their fixes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "hub/fake_hub.h"
#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

const std::string kSha = "89abcdef0123456789abcdef0123456789abcdef";

struct HubCli : ::testing::Test {
  test::FakeHub hub;
  test::TempDir tmp;
  void SetUp() override {
    const fs::path d = fs::path(test::shared_dir()) / "models" / "stories260K";
    std::map<std::string, std::string> files;
    for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"})
      files[f] = test::read_bytes(d / f);
    hub.add_repo("org/tiny", kSha, files);
    hub.gated.push_back("meta/llama");
  }
  // The command with the hub's environment (and nothing inherited that would change it).
  std::string env() const {
    return "env -u HF_TOKEN -u HF_HUB_OFFLINE -u HF_HOME HF_ENDPOINT=" + hub.endpoint() + " HF_HUB_CACHE=" + tmp.path +
           "/cache HF_TOKEN_PATH=" + tmp.path + "/no-token ";
  }
  int run(const std::string& args, std::string* out) {
    return test::run_command("(" + env() + test::backprop_exe() + " " + args + ")", out);
  }
};

TEST_F(HubCli, EstimateVramFetchesTheConfigOnly) {
  std::string out;
  ASSERT_EQ(run("estimate-vram --model org/tiny --json 2>/dev/null", &out), 0) << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_NE(j.dump().find("snapshots/" + kSha), std::string::npos) << out;
  EXPECT_EQ(hub.count_requests("/cdn/"), 0u);  // no weights
  EXPECT_GT(hub.count_requests("/resolve/" + kSha + "/config.json"), 0u);
  EXPECT_EQ(hub.count_requests("model.safetensors"), 0u);
}

TEST_F(HubCli, GenerateDownloadsThenRunsOfflineWithTheSameText) {
  const std::string args = "generate --model org/tiny --prompt 'Once upon' --max-new-tokens 6 --temperature 0";
  std::string online, offline, local;
  ASSERT_EQ(run(args + " 2>/dev/null", &online), 0) << online;
  EXPECT_EQ(hub.count_requests("/cdn/"), 1u);
  hub.clear_requests();
  ASSERT_EQ(run(args + " --offline 2>/dev/null", &offline), 0) << offline;
  EXPECT_TRUE(hub.requests().empty());
  ASSERT_EQ(
      test::run_command("(" + test::backprop_exe() + " generate --model " + test::shared_dir() +
                            "/models/stories260K --prompt 'Once upon' --max-new-tokens 6 --temperature 0 2>/dev/null)",
                        &local),
      0);
  EXPECT_EQ(online, local);
  EXPECT_EQ(offline, local);
}

TEST_F(HubCli, OfflineFlagAndVariableForbidTheNetwork) {
  std::string out;
  EXPECT_EQ(
      run("validate " + test::source_dir() + "/examples/quickstart_alpaca.jsonl --model org/tiny --offline --json",
          &out),
      2)
      << out;
  EXPECT_NE(out.find("DEP_MODEL_LOAD_FAILED"), std::string::npos) << out;
  EXPECT_NE(out.find("offline"), std::string::npos) << out;
  EXPECT_EQ(
      test::run_command(env() + "HF_HUB_OFFLINE=1 " + test::backprop_exe() + " estimate-vram --model org/tiny", &out),
      2)
      << out;
  EXPECT_TRUE(hub.requests().empty());
  // Without either, validate fetches the tokenizer (no weights) and counts exact tokens.
  ASSERT_EQ(
      run("validate " + test::source_dir() + "/examples/quickstart_alpaca.jsonl --model org/tiny --json 2>/dev/null",
          &out),
      0)
      << out;
  EXPECT_EQ(nlohmann::json::parse(out).value("length_check", ""), "tokens") << out;
  EXPECT_EQ(hub.count_requests("/cdn/"), 0u);
}

TEST_F(HubCli, TrainingNamesTheHubModelAsTheAdaptersBase) {
  std::string out;
  std::ofstream(tmp.path + "/data.jsonl") << "{\"text\": \"Lily saw a bird. It was happy.\"}\n";
  ASSERT_EQ(run("train --device cpu --json --model org/tiny --data " + tmp.path +
                    "/data.jsonl --steps 1 --batch-size 1 --max-seq-length 32 --lora-r 2 "
                    "--threads 1 --save-every 0 --output " +
                    tmp.path + "/runs 2>/dev/null",
                &out),
            0)
      << out;
  const std::string run_dir = nlohmann::json::parse(out).at("output_dir").get<std::string>();
  const auto ac = nlohmann::json::parse(test::read_bytes(run_dir + "/adapter/adapter_config.json"));
  EXPECT_EQ(ac.at("base_model_name_or_path"), "org/tiny");
  // export finds that base again through the cache (offline: no download needed).
  hub.clear_requests();
  ASSERT_EQ(run("export " + run_dir + " --format merged --offline --output " + tmp.path + "/merged 2>/dev/null", &out),
            0)
      << out;
  EXPECT_TRUE(hub.requests().empty());
  EXPECT_TRUE(fs::exists(tmp.path + "/merged/model.safetensors"));
}

TEST_F(HubCli, GatedRepositoryEndsWithTheFixes) {
  std::string out;
  EXPECT_EQ(run("train --device cpu --model meta/llama --data " + test::source_dir() +
                    "/examples/quickstart_alpaca.jsonl --steps 1",
                &out),
            2)
      << out;
  EXPECT_NE(out.find("DEP_MODEL_LOAD_FAILED"), std::string::npos) << out;
  EXPECT_NE(out.find("accept the licence"), std::string::npos) << out;
  EXPECT_NE(out.find("huggingface-cli login"), std::string::npos) << out;
}

}  // namespace
}  // namespace bp
