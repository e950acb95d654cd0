// `--preset` through the real binary: each preset changes what trains (the adapter's rank and
// targets, the learning rate in the metrics), explicit flags and environment variables beat it,
// and what it applied is printed and saved in settings.json.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

struct TrainedRun {
  int rc = -1;
  std::string out;
  nlohmann::json adapter_config, settings;
  double first_lr = -1;
};

TrainedRun train(const std::string& dir, const std::string& name, const std::string& extra, const std::string& env = "",
                 bool pairs = false) {
  {
    std::ofstream f(dir + "/data.jsonl");
    for (int i = 0; i < 8; ++i)
      if (pairs)
        f << "{\"prompt\": \"Tom saw bird " << i
          << ".\", \"chosen\": \"It was happy.\", \"rejected\": \"It was sad.\"}\n";
      else
        f << "{\"text\": \"Tom saw a bird number " << i << ". It was happy.\"}\n";
  }
  TrainedRun r;
  const std::string out_root = dir + "/" + name;
  r.rc =
      test::run_command(env + " " + test::backprop_exe() + " train --device cpu --model " + test::shared_dir() +
                            "/models/stories260K --data " + dir + "/data.jsonl --output " + out_root +
                            " --steps 1 --batch-size 2 --warmup-steps 0 --lr-scheduler constant --threads 1 " + extra,
                        &r.out);
  if (r.rc != 0 || !fs::exists(out_root)) return r;
  const fs::path run = fs::directory_iterator(out_root)->path();  // the one run folder
  r.adapter_config = nlohmann::json::parse(std::ifstream(run / "adapter" / "adapter_config.json"));
  r.settings = nlohmann::json::parse(std::ifstream(run / "settings.json"));
  std::ifstream m(run / "metrics.jsonl");
  for (std::string line; std::getline(m, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "step") {
      r.first_lr = j["lr"].get<double>();
      break;
    }
  }
  return r;
}

TEST(PresetCli, EachPresetChangesWhatTrains) {
  test::TempDir tmp;
  TrainedRun fast = train(tmp.path, "fast", "--preset fast");
  ASSERT_EQ(fast.rc, 0) << fast.out;
  EXPECT_EQ(fast.adapter_config["r"], 8);
  EXPECT_EQ(fast.adapter_config["target_modules"].size(), 2u) << fast.adapter_config.dump();
  EXPECT_DOUBLE_EQ(fast.first_lr, 3e-4);
  EXPECT_NE(fast.out.find("preset fast: lora.r=8"), std::string::npos) << fast.out;
  EXPECT_EQ(fast.settings["preset"]["applied"]["lora.r"], "8");

  TrainedRun quality = train(tmp.path, "quality", "--preset quality");
  ASSERT_EQ(quality.rc, 0) << quality.out;
  EXPECT_EQ(quality.adapter_config["r"], 64);
  EXPECT_EQ(quality.adapter_config["use_rslora"], true);
  EXPECT_EQ(quality.adapter_config["target_modules"].size(), 7u);
  EXPECT_DOUBLE_EQ(quality.first_lr, 1e-4);

  TrainedRun none = train(tmp.path, "none", "");
  ASSERT_EQ(none.rc, 0) << none.out;
  EXPECT_EQ(none.adapter_config["r"], 16);  // the table's default
  EXPECT_EQ(none.out.find("preset"), std::string::npos) << none.out;
}

TEST(PresetCli, AutoFollowsTheModelSize) {
  test::TempDir tmp;
  TrainedRun r = train(tmp.path, "auto", "--preset auto");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("(< 100M)"), std::string::npos) << r.out;  // stories260K
  EXPECT_EQ(r.adapter_config["r"], 8);
  EXPECT_EQ(r.settings["training"]["max_seq_length"], 512);
  EXPECT_DOUBLE_EQ(r.first_lr, 1e-3);
}

TEST(PresetCli, FlagsAndEnvironmentBeatThePreset) {
  test::TempDir tmp;
  TrainedRun r = train(tmp.path, "flag", "--preset quality --lora-r 4", "BACKPROPAGATE_TRAINING__LR=5e-4");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.adapter_config["r"], 4);
  EXPECT_EQ(r.adapter_config["use_rslora"], true);  // the preset's, not given by the user
  EXPECT_DOUBLE_EQ(r.first_lr, 5e-4);
  EXPECT_NE(r.out.find("yours kept: lora.r, training.lr"), std::string::npos) << r.out;
  auto kept = r.settings["preset"]["kept_from_user"];
  EXPECT_EQ(kept.size(), 2u) << kept.dump();
}

// A preference method trains with the preset's learning rate / 40 (balanced: 5e-6, where SFT gets
// 2e-4), says so, and an explicit --lr still wins.
TEST(PresetCli, APreferenceMethodGetsTheGentlerLearningRate) {
  test::TempDir tmp;
  for (const char* method : {"dpo", "kto"}) {
    SCOPED_TRACE(method);
    TrainedRun r =
        train(tmp.path, std::string("bal-") + method, std::string("--preset balanced --method ") + method, "", true);
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_DOUBLE_EQ(r.first_lr, 5e-6);
    EXPECT_EQ(r.settings["preset"]["applied"]["training.lr"], "5e-06");
    EXPECT_NE(r.out.find(std::string("--method ") + method + ": the SFT learning rate / 40"), std::string::npos)
        << r.out;
    EXPECT_EQ(r.adapter_config["r"], 16);  // the rest of the preset is SFT's
  }
  TrainedRun a = train(tmp.path, "auto-orpo", "--preset auto --method orpo", "", true);
  ASSERT_EQ(a.rc, 0) << a.out;
  EXPECT_DOUBLE_EQ(a.first_lr, 1e-3 / 40);
  TrainedRun mine = train(tmp.path, "mine", "--preset balanced --method dpo --lr 1e-4", "", true);
  ASSERT_EQ(mine.rc, 0) << mine.out;
  EXPECT_DOUBLE_EQ(mine.first_lr, 1e-4);
}

}  // namespace
}  // namespace bp
