// `backprop train` as a user runs it: the real binary, flags and environment variables, kill -9
// and resume, SIGINT, a full disk. Uses the real stories260K model (tiny, fast).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "support/test_util.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

std::string model_dir() {
  return test::shared_dir() + "/models/stories260K";
}

std::string write_data(const std::string& dir) {
  std::string p = dir + "/data.jsonl";
  std::ofstream f(p);
  const char* who[] = {"Lily", "Tom", "Ben", "Sue", "Max"};
  for (int i = 0; i < 20; ++i)
    f << "{\"text\": \"" << who[i % 5] << " saw a bird number " << i % 7 << ". It was happy.\"}\n";
  return p;
}

std::string train_cmd(const std::string& dir, const std::string& extra, const std::string& lr = "5e-3") {
  return test::backprop_exe() + " train --device cpu --model " + model_dir() + " --data " + dir + "/data.jsonl" +
         " --batch-size 4 --micro-batch-size 4 --lr " + lr +
         " --warmup-steps 0 --lr-scheduler constant --lora-r 4"
         " --lora-dropout 0 --max-seq-length 64 --threads 1 " +
         extra;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

// 2N steps straight, and N steps + kill -9 + resume for N more, give byte-identical weights.
TEST(TrainCli, KillNineThenResumeIsByteIdentical) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  ASSERT_EQ(test::run_command(train_cmd(tmp.path, "--steps 6 --save-every 3 --output " + tmp.path + "/straight"), &out),
            0)
      << out;
  int rc = test::run_command(
      train_cmd(tmp.path, "--steps 6 --save-every 3 --fault-inject-crash-step 3 --output " + tmp.path + "/crashed"),
      &out);
  EXPECT_EQ(rc, 128 + SIGKILL) << out;
  rc = test::run_command(
      train_cmd(tmp.path, "--steps 6 --save-every 3 --resume latest --output " + tmp.path + "/crashed"), &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  auto run_of = [](const std::string& root) {
    for (const auto& e : fs::directory_iterator(root)) return e.path().string();
    return std::string();
  };
  std::string a = run_of(tmp.path + "/straight"), b = run_of(tmp.path + "/crashed");
  EXPECT_EQ(slurp(a + "/adapter/adapter_model.safetensors"), slurp(b + "/adapter/adapter_model.safetensors"));
  EXPECT_EQ(slurp(a + "/checkpoints/checkpoint-6/trainable.safetensors"),
            slurp(b + "/checkpoints/checkpoint-6/trainable.safetensors"));
}

// SIGINT: finish the current step, save, exit 130; the run resumes from that checkpoint.
TEST(TrainCli, SigintSavesAndExits130) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string log = tmp.path + "/log.txt";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::string cmd =
        train_cmd(tmp.path, "--steps 100000 --save-every 0 --output " + tmp.path + "/runs") + " > " + log + " 2>&1";
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until training has started (the progress bar prints step 1).
  for (int i = 0; i < 600 && slurp(log).find("1/100000") == std::string::npos; ++i) usleep(100000);
  ASSERT_NE(slurp(log).find("1/100000"), std::string::npos) << slurp(log);
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << slurp(log);
  EXPECT_EQ(WEXITSTATUS(status), 130) << slurp(log);
  std::string text = slurp(log);
  EXPECT_NE(text.find("RUNTIME_TRAINING_ABORTED"), std::string::npos) << text;
  EXPECT_NE(text.find("Run id:"), std::string::npos) << text;
  bool found = false;
  for (const auto& run : fs::directory_iterator(tmp.path + "/runs"))
    for (const auto& c : fs::directory_iterator(run.path() / "checkpoints"))
      found = found || fs::exists(c.path() / "manifest.json");
  EXPECT_TRUE(found) << "a checkpoint must be saved on SIGINT";
}

// No space left while saving: STATE_DISK_FULL, exit 2, the previous checkpoint intact and loadable.
TEST(TrainCli, DiskFullStopsCleanlyWithPreviousCheckpointIntact) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  ASSERT_EQ(test::run_command(train_cmd(tmp.path, "--steps 2 --save-every 2 --output " + tmp.path + "/runs"), &out), 0)
      << out;
  // Resume for more steps; the very next write runs out of space.
  int rc = test::run_command(train_cmd(tmp.path, "--steps 4 --save-every 2 --resume latest --output " + tmp.path +
                                                     "/runs --fault-inject-enospc-after-bytes 100"),
                             &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("STATE_DISK_FULL"), std::string::npos) << out;
  rc = test::run_command(train_cmd(tmp.path, "--steps 4 --save-every 2 --resume latest --output " + tmp.path + "/runs"),
                         &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("checkpoint-2"), std::string::npos) << "resume must use the intact checkpoint: " << out;
}

TEST(TrainCli, EnvironmentAndTomlReachTheTrainer) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::ofstream(tmp.path + "/cfg.toml") << "[training]\nsteps = 2\n";
  std::string out;
  int rc = test::run_command(
      "BACKPROPAGATE_LORA__ALPHA=3 " +
          train_cmd(tmp.path, "--config " + tmp.path + "/cfg.toml --json --output " + tmp.path + "/runs"),
      &out);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(j["steps"], 2);
  auto cfg = nlohmann::json::parse(slurp(j["final_artifact"].get<std::string>() + "/adapter_config.json"));
  EXPECT_EQ(cfg["lora_alpha"], 3);
  EXPECT_EQ(cfg["r"], 4);  // the flag wins over nothing else set
  // The run records its resolved settings.
  auto settings = nlohmann::json::parse(slurp(j["output_dir"].get<std::string>() + "/settings.json"));
  EXPECT_EQ(settings["training"]["steps"], 2);
  // An unknown variable is an error, not ignored.
  rc = test::run_command("BACKPROPAGATE_TRAINING__LRR=1 " + train_cmd(tmp.path, "--steps 1"), &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("CONFIG_INVALID_SETTING"), std::string::npos) << out;
}

TEST(TrainCli, UntrainedAdapterIsWrittenWithAWarning) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  int rc = test::run_command(train_cmd(tmp.path, "--steps 1 --output " + tmp.path + "/runs", "0"), &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("was never trained"), std::string::npos) << out;
}

TEST(TrainCli, MissingInputsGetCatalogCodes) {
  test::TempDir tmp;
  std::string out;
  EXPECT_EQ(test::run_command(test::backprop_exe() + " train --device cpu --model " + model_dir() + " --data " +
                                  tmp.path + "/missing.jsonl --output " + tmp.path,
                              &out),
            1);
  EXPECT_NE(out.find("INPUT_DATASET_NOT_FOUND"), std::string::npos) << out;
  write_data(tmp.path);
  // A hub name that is not in the (empty) Hugging Face cache, offline: no network in tests.
  EXPECT_EQ(test::run_command("HF_HUB_CACHE=" + tmp.path + "/hf " + test::backprop_exe() +
                                  " train --device cpu --offline --model Qwen/Qwen2.5-7B --data " + tmp.path +
                                  "/data.jsonl --output " + tmp.path,
                              &out),
            2);
  EXPECT_NE(out.find("DEP_MODEL_LOAD_FAILED"), std::string::npos) << out;
  EXPECT_NE(out.find("not in the Hugging Face cache"), std::string::npos) << out;
  EXPECT_EQ(test::run_command(train_cmd(tmp.path, "--steps 1 --resume nosuchrun --output " + tmp.path + "/runs"), &out),
            1);
  EXPECT_NE(out.find("INPUT_RESUME_NOT_FOUND"), std::string::npos) << out;
}

}  // namespace bp
