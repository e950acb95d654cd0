// `backprop runs`, `show-run`, `diff-runs` and `replay` through the real binary: status of
// finished, failed, interrupted and killed runs, settings and metrics side by side, and a
// replay that keeps the settings and data but takes the overrides.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

std::string base_cmd(const std::string& dir) {
  return test::backprop_exe() + " train --device cpu --model " + test::shared_dir() + "/models/stories260K --data " +
         dir + "/data.jsonl --output " + dir +
         "/runs --batch-size 2 --warmup-steps 0 --lr-scheduler constant --threads 1 "
         "--lora-r 4 --max-seq-length 64 ";
}

nlohmann::json runs_json(const std::string& dir) {
  std::string out;
  EXPECT_EQ(test::run_command(test::backprop_exe() + " runs --json --output " + dir + "/runs 2>/dev/null", &out), 0)
      << out;
  return nlohmann::json::parse(out);
}

const nlohmann::json* by_status(const nlohmann::json& runs, const std::string& status) {
  for (const auto& r : runs)
    if (r["status"] == status) return &r;
  return nullptr;
}

TEST(RunHistoryCli, ListsShowsDiffsAndReplaysRuns) {
  test::TempDir tmp;
  {
    std::ofstream f(tmp.path + "/data.jsonl");
    for (int i = 0; i < 12; ++i) f << "{\"text\": \"Sue saw a bird number " << i << ". It was happy.\"}\n";
  }
  std::string out;
  ASSERT_EQ(test::run_command(base_cmd(tmp.path) + "--steps 3 --lr 1e-3", &out), 0) << out;
  // Failed (NaN every step), interrupted (SIGINT path), killed (SIGKILL: status stays "running", pid gone).
  EXPECT_EQ(
      test::run_command(base_cmd(tmp.path) + "--steps 5 --fault-inject-nan-step 1 --fault-inject-nan-count 5", &out), 2)
      << out;
  EXPECT_EQ(test::run_command(base_cmd(tmp.path) + "--steps 4 --fault-inject-crash-step 2 --save-every 1", &out),
            128 + SIGKILL)
      << out;
  auto runs = runs_json(tmp.path);
  ASSERT_EQ(runs.size(), 3u) << runs.dump(2);
  const auto* finished = by_status(runs, "finished");
  const auto* failed = by_status(runs, "failed");
  const auto* killed = by_status(runs, "killed");
  ASSERT_TRUE(finished && failed && killed) << runs.dump(2);
  EXPECT_EQ((*finished)["steps"], 3);
  EXPECT_TRUE((*finished)["best_eval_loss"].is_number());
  EXPECT_EQ((*failed)["code"], "RUNTIME_TRAINING_FAILED");
  EXPECT_EQ((*killed)["steps"], 2);
  EXPECT_FALSE((*killed)["checkpoints"].empty());
  const std::string id = (*finished)["id"];

  // Plain text list names the statuses.
  ASSERT_EQ(test::run_command(test::backprop_exe() + " runs --output " + tmp.path + "/runs", &out), 0) << out;
  EXPECT_NE(out.find("failed RUNTIME_TRAINING_FAILED"), std::string::npos) << out;
  EXPECT_NE(out.find("killed"), std::string::npos) << out;

  // show-run by id prefix.
  ASSERT_EQ(test::run_command(test::backprop_exe() + " show-run " + id.substr(0, 8) + " --json --output " + tmp.path +
                                  "/runs 2>/dev/null",
                              &out),
            0)
      << out;
  auto shown = nlohmann::json::parse(out);
  EXPECT_EQ(shown["id"], id);
  EXPECT_EQ(shown["changed_settings"]["lora.r"], "4");

  // replay with an override: same data and settings, lora.r changed.
  ASSERT_EQ(test::run_command(test::backprop_exe() + " replay " + id +
                                  " --set lora.r=2 --set training.steps=2 --output " + tmp.path + "/runs",
                              &out),
            0)
      << out;
  runs = runs_json(tmp.path);
  ASSERT_EQ(runs.size(), 4u);
  std::string replay_id;
  for (const auto& r : runs)
    if (r["status"] == "finished" && r["id"] != id) replay_id = r["id"];
  ASSERT_FALSE(replay_id.empty()) << runs.dump(2);
  auto cfg = nlohmann::json::parse(std::ifstream(tmp.path + "/runs/" + replay_id + "/adapter/adapter_config.json"));
  EXPECT_EQ(cfg["r"], 2);
  auto settings = nlohmann::json::parse(std::ifstream(tmp.path + "/runs/" + replay_id + "/settings.json"));
  EXPECT_EQ(settings["replay_of"], id);
  EXPECT_EQ(settings["training"]["lr"], 1e-3);
  EXPECT_EQ(settings["data"]["path"], tmp.path + "/data.jsonl");

  // diff-runs: the two overrides differ, lr does not.
  ASSERT_EQ(test::run_command(test::backprop_exe() + " diff-runs " + id + " " + replay_id + " --json --output " +
                                  tmp.path + "/runs 2>/dev/null",
                              &out),
            0)
      << out;
  auto diff = nlohmann::json::parse(out);
  EXPECT_EQ(diff["settings"]["lora.r"], nlohmann::json({"4", "2"}));
  EXPECT_EQ(diff["settings"]["training.steps"], nlohmann::json({"3", "2"}));
  EXPECT_FALSE(diff["settings"].contains("training.lr"));
  EXPECT_EQ(diff["metrics"][0]["steps"], 3);
  EXPECT_EQ(diff["metrics"][1]["steps"], 2);

  // A bad override and an unknown run are user errors with codes.
  EXPECT_EQ(test::run_command(
                test::backprop_exe() + " replay " + id + " --set lora.rank=2 --output " + tmp.path + "/runs", &out),
            1);
  EXPECT_NE(out.find("CONFIG_INVALID_SETTING"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(test::backprop_exe() + " show-run nope --output " + tmp.path + "/runs", &out), 1);
  EXPECT_NE(out.find("INPUT_RESUME_NOT_FOUND"), std::string::npos) << out;
}

}  // namespace
}  // namespace bp
