// `backprop train --method dpo|orpo|simpo|kto` and `estimate-vram --method` as a user runs them:
// the real binary on the stories260K model, kill -9 and --resume, a method's setting given to
// another method, an unknown method.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "support/test_util.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

std::string model_dir() {
  return test::shared_dir() + "/models/stories260K";
}

std::string write_pairs(const std::string& dir) {
  const std::string p = dir + "/pairs.jsonl";
  std::ofstream f(p);
  const char* who[] = {"Lily", "Tom", "Ben", "Sue", "Max"};
  for (int i = 0; i < 16; ++i)
    f << nlohmann::json{{"prompt", std::string(who[i % 5]) + " saw a bird number " + std::to_string(i % 7) + "."},
                        {"chosen", "It was happy and sang."},
                        {"rejected", "It was sad and fell."}}
             .dump()
      << "\n";
  return p;
}

std::string train_cmd(const std::string& dir, const std::string& extra) {
  return test::backprop_exe() + " train --device cpu --model " + model_dir() + " --data " + dir +
         "/pairs.jsonl --batch-size 4 --micro-batch-size 4 --lr 5e-3 --warmup-steps 0 --lr-scheduler constant "
         "--lora-r 4 --lora-dropout 0 --max-seq-length 96 --threads 1 " +
         extra;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string run_of(const std::string& root) {
  for (const auto& e : fs::directory_iterator(root)) return e.path().string();
  return {};
}

}  // namespace

TEST(PreferenceCli, KillNineThenResumeIsByteIdentical) {
  for (const std::string method : {"dpo --reference precomputed", "kto"}) {
    SCOPED_TRACE(method);
    test::TempDir tmp;
    write_pairs(tmp.path);
    std::string out;
    const std::string common = "--method " + method + " --steps 6 --save-every 3 ";
    ASSERT_EQ(test::run_command(train_cmd(tmp.path, common + "--output " + tmp.path + "/straight"), &out), 0) << out;
    int rc = test::run_command(
        train_cmd(tmp.path, common + "--fault-inject-crash-step 3 --output " + tmp.path + "/crashed"), &out);
    EXPECT_EQ(rc, 128 + SIGKILL) << out;
    rc = test::run_command(train_cmd(tmp.path, common + "--resume latest --output " + tmp.path + "/crashed"), &out);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
    const std::string a = run_of(tmp.path + "/straight"), b = run_of(tmp.path + "/crashed");
    EXPECT_EQ(slurp(a + "/adapter/adapter_model.safetensors"), slurp(b + "/adapter/adapter_model.safetensors"));
    const std::string summary = slurp(b + "/summary.json");
    EXPECT_NE(summary.find("\"final_loss\""), std::string::npos) << summary;
  }
}

// show-run and diff-runs carry the held-out preference metrics of the last evaluation.
TEST(PreferenceCli, ShowRunAndDiffRunsShowTheHeldOutRewards) {
  test::TempDir tmp;
  write_pairs(tmp.path);
  std::string out;
  for (const char* beta : {"0.1", "0.5"})
    ASSERT_EQ(test::run_command(train_cmd(tmp.path, std::string("--method dpo --steps 2 --holdout 0.25 --beta ") +
                                                        beta + " --output " + tmp.path + "/runs"),
                                &out),
              0)
        << out;
  std::vector<std::string> ids;
  for (const auto& e : fs::directory_iterator(tmp.path + "/runs")) ids.push_back(e.path().filename().string());
  ASSERT_EQ(ids.size(), 2u);
  ASSERT_EQ(test::run_command(test::backprop_exe() + " show-run " + ids[0] + " --output " + tmp.path + "/runs", &out),
            0)
      << out;
  EXPECT_NE(out.find("eval_rewards/accuracies"), std::string::npos) << out;
  ASSERT_EQ(
      test::run_command(test::backprop_exe() + " show-run " + ids[0] + " --json --output " + tmp.path + "/runs", &out),
      0)
      << out;
  const auto shown = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_TRUE(shown["eval_metrics"].contains("eval_rewards/margins")) << out;
  ASSERT_EQ(test::run_command(
                test::backprop_exe() + " diff-runs " + ids[0] + " " + ids[1] + " --output " + tmp.path + "/runs", &out),
            0)
      << out;
  EXPECT_NE(out.find("eval_rewards/accuracies"), std::string::npos) << out;
  EXPECT_NE(out.find("training.beta"), std::string::npos) << out;
}

TEST(PreferenceCli, ASettingOfAnotherMethodOrAnUnknownMethodIsRefused) {
  test::TempDir tmp;
  write_pairs(tmp.path);
  std::string out;
  int rc =
      test::run_command(train_cmd(tmp.path, "--method orpo --beta 0.3 --steps 1 --output " + tmp.path + "/r"), &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("CONFIG_INVALID_SETTING"), std::string::npos) << out;
  EXPECT_NE(out.find("--beta"), std::string::npos) << out;
  rc = test::run_command(train_cmd(tmp.path, "--method rlhf --steps 1 --output " + tmp.path + "/r"), &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("sft"), std::string::npos) << out;  // the choices are listed
  EXPECT_NE(out.find("kto"), std::string::npos) << out;
  rc = test::run_command(
      train_cmd(tmp.path, "--method dpo --mode full --reference adapter-off --steps 1 --output " + tmp.path + "/r"),
      &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("adapter-off"), std::string::npos) << out;
}

TEST(PreferenceCli, EstimateVramCountsTwoSequencesPerPair) {
  std::string sft, dpo;
  const std::string cmd = test::backprop_exe() + " estimate-vram --model " + model_dir() +
                          " --device cpu --batch-size 4 --micro-batch-size 4 --max-seq-length 64 --json";
  ASSERT_EQ(test::run_command(cmd, &sft), 0) << sft;
  ASSERT_EQ(test::run_command(cmd + " --method dpo", &dpo), 0) << dpo;
  const auto a = nlohmann::json::parse(sft.substr(sft.find('{'))), b = nlohmann::json::parse(dpo.substr(dpo.find('{')));
  EXPECT_EQ(b["sequences_per_example"], 2);
  EXPECT_EQ(a["sequences_per_example"], 1);
  EXPECT_DOUBLE_EQ(b["settings"]["micro_batch_tokens"].get<double>(),
                   2 * a["settings"]["micro_batch_tokens"].get<double>())
      << dpo;
  EXPECT_GT(b["plan"]["total"].get<double>(), a["plan"]["total"].get<double>()) << dpo;
}

}  // namespace bp
