// `backprop runs`, `show-run`, `diff-runs` and `replay` through the real binary: status of
// finished, failed, interrupted and killed runs, settings and metrics side by side, and a
// replay that keeps the settings and data but takes the overrides.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/settings.h"
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

// A run folder as `train` writes it, from files given as text (nullptr = not written).
std::string write_run(const std::string& runs, const std::string& id, const std::string& settings, const char* status,
                      const char* summary, const char* metrics) {
  const std::string dir = runs + "/" + id;
  fs::create_directories(dir);
  std::ofstream(dir + "/settings.json") << settings;
  if (status) std::ofstream(dir + "/status.json") << status;
  if (summary) std::ofstream(dir + "/summary.json") << summary;
  if (metrics) std::ofstream(dir + "/metrics.jsonl") << metrics;
  return dir;
}

std::string settings_json(const std::vector<std::pair<std::string, std::string>>& set) {
  Settings s;
  for (const auto& [k, v] : set) s.set(k, v);
  return s.to_json().dump(2);
}

// A run folder whose files parse but hold other types than backprop writes ({"status": 5}, [],
// {"steps": "x"}, a string step) used to stop `backprop runs` with json type_error 302; such a run
// is listed with those fields unknown, and the others as usual.
TEST(RunHistoryCli, WrongTypesInOneRunLeaveTheOthersListed) {
  test::TempDir tmp;
  const std::string runs = tmp.path + "/runs", settings = settings_json({{"model.path", "m"}});
  write_run(runs, "good", settings, R"({"status": "finished", "started": "2026-01-02T00:00:00Z"})",
            R"({"steps": 3, "best_eval_loss": 1.5, "seconds": 2, "tokens": 100})",
            R"({"type": "step", "step": 3, "loss": 2.0})"
            "\n");
  write_run(runs, "status-number", settings, R"({"status": 5, "code": 7, "started": 1, "pid": "x"})", nullptr, nullptr);
  write_run(runs, "status-array", settings, "[]", R"({"steps": 2})", nullptr);
  write_run(runs, "summary-string", settings, nullptr, R"({"steps": "x", "best_eval_loss": "y", "seconds": "z"})",
            nullptr);
  write_run(runs, "metrics-string", settings, nullptr, nullptr,
            R"({"type": "step", "step": "7", "loss": "x"})"
            "\n"
            R"({"type": 5})"
            "\n"
            R"({"type": "eval", "eval_loss": "low"})"
            "\n"
            R"({"type": "step", "step": 2, "loss": 0.5})"
            "\n");
  write_run(runs, "settings-types", R"({"model": {"path": 5}, "data": "d", "training": {"steps": "x"}, "preset": 3})",
            nullptr, nullptr, nullptr);
  const nlohmann::json list = runs_json(tmp.path);
  ASSERT_EQ(list.size(), 6u) << list.dump(2);
  std::map<std::string, nlohmann::json> by_id;
  for (const auto& r : list) by_id[r["id"]] = r;
  EXPECT_EQ(by_id["good"]["status"], "finished");
  EXPECT_EQ(by_id["good"]["steps"], 3);
  EXPECT_EQ(by_id["good"]["best_eval_loss"], 1.5);
  EXPECT_EQ(by_id["good"]["tokens_per_second"], 50.0);
  EXPECT_EQ(by_id["status-number"]["status"], "unknown");
  EXPECT_EQ(by_id["status-number"]["code"], "");
  EXPECT_EQ(by_id["status-array"]["status"], "finished") << "a status file that is no object is absent";
  EXPECT_EQ(by_id["status-array"]["steps"], 2);
  EXPECT_EQ(by_id["summary-string"]["steps"], 0);
  EXPECT_TRUE(by_id["summary-string"]["best_eval_loss"].is_null());
  EXPECT_EQ(by_id["metrics-string"]["steps"], 2);
  EXPECT_EQ(by_id["metrics-string"]["final_loss"], 0.5);
  EXPECT_EQ(by_id["settings-types"]["model"], "");
  EXPECT_EQ(by_id["settings-types"]["total_steps"], 0);

  std::string out;
  EXPECT_EQ(test::run_command(test::backprop_exe() + " runs --output " + runs, &out), 0) << out;
  EXPECT_NE(out.find("status-number"), std::string::npos) << out;
  for (const char* id : {"status-number", "status-array", "summary-string", "metrics-string", "settings-types"})
    EXPECT_EQ(test::run_command(test::backprop_exe() + " show-run " + id + " --output " + runs, &out), 0) << id << "\n"
                                                                                                          << out;
}

// Run files are read like every other input: a status.json or metrics.jsonl linked to /dev/zero
// used to be read without bound (gigabytes, then std::bad_alloc), and a huge summary.json whole.
// `runs` reports such a run folder on stderr and lists the others; `show-run` fails with the code.
TEST(RunHistoryCli, RunFilesThatAreDevicesOrOverTheCapAreSkippedByRunsAndRefusedByShowRun) {
  test::TempDir tmp;
  const std::string runs = tmp.path + "/runs", settings = settings_json({{"model.path", "m"}});
  write_run(runs, "good", settings, R"({"status": "finished"})", R"({"steps": 3})",
            R"({"type": "step", "step": 3, "loss": 2.0})"
            "\n");
  fs::create_symlink("/dev/zero", write_run(runs, "zero-status", settings, nullptr, nullptr, nullptr) + "/status.json");
  fs::create_symlink("/dev/zero",
                     write_run(runs, "zero-metrics", settings, nullptr, nullptr, nullptr) + "/metrics.jsonl");
  write_run(runs, "huge-summary", settings, nullptr,
            (R"({"steps": 1, "pad": ")" + std::string(40000, 'x') + "\"}").c_str(), nullptr);
  // A safety net only: the old code read /dev/zero until memory ran out.
  const std::string env = "timeout 120 env BACKPROPAGATE_LIMITS__MAX_CONFIG_BYTES=32K ";
  std::string out;
  // The warnings go to stderr, away from the JSON (run_command adds 2>&1 after the command).
  ASSERT_EQ(
      test::run_command("(" + env + test::backprop_exe() + " runs --json --output " + runs + " 2>/dev/null)", &out), 0)
      << out;
  const nlohmann::json list = nlohmann::json::parse(out);
  ASSERT_EQ(list.size(), 1u) << list.dump(2);
  EXPECT_EQ(list[0]["id"], "good");
  EXPECT_EQ(list[0]["steps"], 3);
  ASSERT_EQ(test::run_command(env + test::backprop_exe() + " runs --output " + runs, &out), 0) << out;
  EXPECT_NE(out.find("good"), std::string::npos) << out;
  for (const char* id : {"zero-status", "zero-metrics", "huge-summary"})
    EXPECT_NE(out.find(std::string("skipped run folder ") + runs + "/" + id), std::string::npos) << id << "\n" << out;
  EXPECT_NE(out.find("INPUT_FILE_NOT_REGULAR"), std::string::npos) << out;
  EXPECT_NE(out.find("INPUT_FILE_TOO_LARGE"), std::string::npos) << out;

  for (const auto& [id, code] :
       std::vector<std::pair<std::string, std::string>>{{"zero-status", "INPUT_FILE_NOT_REGULAR"},
                                                        {"zero-metrics", "INPUT_FILE_NOT_REGULAR"},
                                                        {"huge-summary", "INPUT_FILE_TOO_LARGE"}}) {
    EXPECT_EQ(test::run_command(env + test::backprop_exe() + " show-run " + id + " --output " + runs, &out), 1)
        << id << "\n"
        << out;
    EXPECT_NE(out.find(code), std::string::npos) << id << "\n" << out;
    EXPECT_NE(out.find(id), std::string::npos) << "the message names the file\n" << out;
  }
  EXPECT_EQ(test::run_command(env + test::backprop_exe() + " show-run good --output " + runs, &out), 0) << out;
}

// show-run lists only settings that differ from the defaults: floats at their defaults (epochs
// 1.0, lora.alpha 32.0, monitor.*) used to be listed, "32.0" compared with "32". And the run id is
// the folder's name also when the folder is given with a trailing slash.
TEST(RunHistoryCli, ShowRunListsOnlyChangedSettingsAndNamesTheRunFromAnyPath) {
  test::TempDir tmp;
  const std::string dir = write_run(tmp.path + "/runs", "run-a",
                                    settings_json({{"model.path", "m"}, {"lora.r", "4"}, {"training.lr", "0.001"}}),
                                    R"({"status": "finished"})", nullptr, nullptr);
  std::string out;
  ASSERT_EQ(test::run_command(test::backprop_exe() + " show-run run-a --json --output " + tmp.path + "/runs", &out), 0)
      << out;
  const nlohmann::json shown = nlohmann::json::parse(out);
  EXPECT_EQ(shown["changed_settings"], nlohmann::json({{"model.path", "m"}, {"lora.r", "4"}, {"training.lr", "0.001"}}))
      << shown["changed_settings"].dump(2);
  for (const std::string& path : {dir + "/", dir + "//", dir + "/."}) {
    ASSERT_EQ(test::run_command(test::backprop_exe() + " show-run '" + path + "'", &out), 0) << out;
    EXPECT_NE(out.find("run        run-a\n"), std::string::npos) << path << "\n" << out;
  }
}

}  // namespace
}  // namespace bp
