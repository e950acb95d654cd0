// Runs through `backprop ui`'s HTTP API with the real tiny-chat model: start a run (a child
// `backprop train` in its own session), see it running, restart the UI while it trains and find
// it again, stop it (SIGINT: save and exit -> interrupted), resume it to a later step (finished),
// and the failed status with its error code. Waits poll the API; nothing depends on timing.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "ui/runs.h"
#include "ui/ui_test_util.h"

namespace bp::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json get_json(httplib::Client& c, const std::string& path) {
  auto r = c.Get(path.c_str());
  if (!r) return json();
  json j = json::parse(r->body, nullptr, false);
  if (j.is_discarded()) ADD_FAILURE() << path << " answered " << r->status << ": " << r->body.substr(0, 300);
  return j;
}

// Polls `pred` on GET path for up to 120 s (the machine may be busy; the condition is what counts).
json wait_for(httplib::Client& c, const std::string& path, const std::function<bool(const json&)>& pred) {
  json j;
  for (int i = 0; i < 1200; ++i) {
    j = get_json(c, path);
    if (!j.is_discarded() && !j.is_null() && pred(j)) return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << "timed out waiting on " << path << ": " << j.dump();
  return j;
}

TEST(UiRuns, StartRestartTheUiStopResume) {
  TempDir tmp;
  const std::string runs = tmp.path + "/runs", data = tmp.path + "/data";
  fs::create_directories(data);
  fs::copy_file(source_dir() + "/examples/quickstart_sharegpt.jsonl", data + "/chat.jsonl");
  auto ui = std::make_unique<UiProcess>(runs, data, std::vector<std::string>{});
  ASSERT_TRUE(ui->alive());
  auto c1 = ui->client();
  const json body = {{"model", source_dir() + "/models/tiny-chat"},
                     {"dataset", "chat.jsonl"},
                     {"settings",
                      {{"training.steps", "100000"},
                       {"training.max_seq_length", "128"},
                       {"training.batch_size", "2"},
                       {"training.eval_every", "0"}}}};
  auto started = c1.Post("/api/runs", body.dump(), "application/json");
  ASSERT_TRUE(started);
  ASSERT_EQ(started->status, 200) << started->body;
  const std::string launch = json::parse(started->body)["launch_id"];
  json l = wait_for(c1, "/api/launches/" + launch, [](const json& j) { return !j.value("run_id", "").empty(); });
  const std::string id = l["run_id"];
  struct KillOnExit {
    std::string metrics;
    ~KillOnExit() { kill_processes_holding(metrics); }
  } guard{runs + "/" + id + "/metrics.jsonl"};
  wait_for(c1, "/api/runs/" + id, [](const json& j) { return j["status"] == "running" && j["steps_done"] >= 1; });

  // The UI goes away and comes back: the run kept training and is found again.
  ui.reset();
  ui = std::make_unique<UiProcess>(runs, data, std::vector<std::string>{});
  auto c = ui->client();
  json again = wait_for(c, "/api/runs", [&](const json& j) { return j.size() == 1 && j[0]["id"] == id; });
  EXPECT_EQ(again[0]["status"], "running");
  EXPECT_EQ(again[0]["model"], source_dir() + "/models/tiny-chat");

  // Stop = SIGINT: the step is finished, saved, and the run is interrupted.
  auto stop = c.Post(("/api/runs/" + id + "/stop").c_str(), "", "application/json");
  ASSERT_TRUE(stop);
  EXPECT_EQ(json::parse(stop->body)["stopped"], true);
  json stopped = wait_for(c, "/api/runs/" + id, [](const json& j) { return j["status"] != "running"; });
  EXPECT_EQ(stopped["status"], "interrupted");
  ASSERT_FALSE(stopped["checkpoints"].empty());
  const int64_t at = stopped["steps_done"];
  EXPECT_NE(c.Get(("/api/runs/" + id + "/log").c_str())->body.find("memory plan"), std::string::npos);

  // Resume to two steps later: the same run folder finishes there.
  auto resumed = c.Post(("/api/runs/" + id + "/resume").c_str(), json{{"steps", at + 2}}.dump(), "application/json");
  ASSERT_EQ(resumed->status, 200) << resumed->body;
  json done = wait_for(c, "/api/runs/" + id,
                       [](const json& j) { return j["status"] != "running" && j["summary"].is_object(); });
  EXPECT_EQ(done["status"], "finished");
  EXPECT_EQ(done["steps_done"], at + 2);
  EXPECT_EQ(done["summary"]["steps"], at + 2);
}

// The New run form offers the method and every method's settings, each marked with the methods
// that read it; a run gets the chosen method's settings only (the others the form still holds
// would be refused by `train`, which never ignores a setting).
TEST(UiRuns, APreferenceRunGetsItsMethodsSettingsOnly) {
  TempDir tmp;
  const std::string runs = tmp.path + "/runs", data = tmp.path + "/data";
  fs::create_directories(data);
  {
    std::ofstream f(data + "/pairs.jsonl");
    for (int i = 0; i < 8; ++i)
      f << json{{"prompt", "What is " + std::to_string(i) + " plus one?"},
                {"chosen", "Answer: " + std::to_string(i + 1) + "."},
                {"rejected", "I do not know."}}
               .dump()
        << "\n";
  }
  UiProcess ui(runs, data, {});
  auto c = ui.client();
  const json settings = get_json(c, "/api/settings");
  json beta, method;
  for (const auto& s : settings) {
    if (s["key"] == "training.beta") beta = s;
    if (s["key"] == "training.method") method = s;
  }
  ASSERT_TRUE(method.is_object()) << settings.dump();
  EXPECT_EQ(method["choices"], "sft|dpo|orpo|simpo|kto");
  ASSERT_TRUE(beta.is_object()) << settings.dump();
  EXPECT_EQ(beta["methods"], json({"dpo", "simpo", "kto"}));
  const json body = {{"model", source_dir() + "/models/tiny-chat"},
                     {"dataset", "pairs.jsonl"},
                     {"settings",
                      {{"training.method", "orpo"},
                       {"training.steps", "2"},
                       {"training.batch_size", "2"},
                       {"training.max_seq_length", "96"},
                       {"training.beta", "0.3"},  // dpo/simpo/kto's, left in the form
                       {"training.orpo_lambda", "0.25"}}}};
  auto started = c.Post("/api/runs", body.dump(), "application/json");
  ASSERT_EQ(started->status, 200) << started->body;
  const std::string launch = json::parse(started->body)["launch_id"];
  json l = wait_for(c, "/api/launches/" + launch, [](const json& j) { return !j["running"].get<bool>(); });
  ASSERT_TRUE(l["result"].is_object()) << l.dump();
  EXPECT_FALSE(l["result"].contains("code")) << l.dump();
  const std::string id = l.value("run_id", "");
  ASSERT_FALSE(id.empty()) << l.dump();
  const json run_settings = json::parse(std::ifstream(runs + "/" + id + "/settings.json"));
  EXPECT_EQ(run_settings["training"]["method"], "orpo") << run_settings.dump();
  EXPECT_DOUBLE_EQ(run_settings["training"]["orpo_lambda"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(run_settings["training"]["beta"].get<double>(), 0.1);  // the default: not passed
}

TEST(UiRuns, AFailedRunShowsItsErrorCode) {
  TempDir tmp;
  const std::string runs = tmp.path + "/runs", data = tmp.path + "/data";
  fs::create_directories(data);
  std::ofstream(data + "/bad.jsonl") << "not json at all\nstill not json\n";
  UiProcess ui(runs, data, {});
  auto c = ui.client();
  const json body = {{"model", source_dir() + "/models/tiny-chat"}, {"dataset", "bad.jsonl"}};
  auto started = c.Post("/api/runs", body.dump(), "application/json");
  ASSERT_EQ(started->status, 200) << started->body;
  const std::string launch = json::parse(started->body)["launch_id"];
  json l = wait_for(c, "/api/launches/" + launch, [](const json& j) { return !j["running"].get<bool>(); });
  ASSERT_TRUE(l["result"].is_object()) << l.dump();
  const std::string code = l["result"]["code"];
  EXPECT_EQ(code.rfind("INPUT_DATASET_", 0), 0u) << l.dump();
  if (!l.value("run_id", "").empty()) {  // the run folder exists: the list says failed, with the code
    json runs = get_json(c, "/api/runs");
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0]["status"], "failed");
    EXPECT_EQ(runs[0]["error_code"], code);
  }
  // A bad setting value never starts a process: the settings table names the key.
  auto bad =
      c.Post("/api/runs", json{{"model", "m"}, {"dataset", "bad.jsonl"}, {"settings", {{"training.lr", "-1"}}}}.dump(),
             "application/json");
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("CONFIG_INVALID_SETTING"), std::string::npos);
  EXPECT_NE(bad->body.find("training.lr"), std::string::npos);
}

// A launch is running while the process the UI started lives, whatever its command line reads: during
// execve /proc/PID/cmdline is empty for an instant, and a check on it once reported a run that had just
// started as ended with no result (CI failed on it). A fake trainer whose command line never names
// backprop must read as running until it exits, then give its --json result.
TEST(UiRuns, ALaunchIsRunningUntilItsProcessEnds) {
  TempDir tmp;
  const std::string fake = tmp.path + "/fake-trainer.sh", gate = tmp.path + "/gate";
  std::ofstream(fake) << "#!/bin/sh\nwhile [ ! -e '" << gate << "' ]; do sleep 0.05; done\n"
                      << "echo '{\"run_id\": \"r1\", \"steps\": 3}'\n";
  fs::permissions(fake, fs::perms::owner_all);
  struct OpenGateOnExit {  // a failed assertion must not leave the fake trainer waiting forever
    std::string gate;
    ~OpenGateOnExit() { std::ofstream(gate) << "go"; }
  } guard{gate};
  bp::ui::RunStore store(tmp.path + "/runs", fake);
  const std::string id = store.start_train({"--steps", "3"});
  for (int i = 0; i < 10; ++i) {
    const json l = store.launch(id);
    ASSERT_TRUE(l["running"].get<bool>()) << l.dump();
    EXPECT_TRUE(l.value("result", json()).is_null());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ofstream(gate) << "go";
  json l;
  for (int i = 0; i < 1200; ++i) {
    l = store.launch(id);
    if (!l["running"].get<bool>()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(l["running"].get<bool>()) << l.dump();
  ASSERT_TRUE(l["result"].is_object()) << l.dump();
  EXPECT_EQ(l["result"]["steps"], 3);
  EXPECT_EQ(l["run_id"], "r1");
}

}  // namespace
}  // namespace bp::test
