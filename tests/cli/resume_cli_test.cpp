// `backprop train --resume` through the real binary: a resumed run continues with its own
// settings.json (train/resume_settings.h), and a resume that cannot continue the run (another LoRA
// shape, other data, a finished run) is refused with CONFIG_RESUME_MISMATCH before anything in the
// run folder changes. Uses the real stories260K model (tiny, fast).
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "io/sha256.h"
#include "support/test_util.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

void write_data(const std::string& path, int rows) {
  std::ofstream f(path);
  for (int i = 0; i < rows; ++i) f << "{\"text\": \"Sue saw a cat number " << i % 6 << ". It was big.\"}\n";
}

// No --lora-r, --batch-size or --max-seq-length here: each test names the ones it means.
std::string train(const std::string& extra) {
  return test::backprop_exe() + " train --device cpu --threads 1 --lr 5e-3 --warmup-steps 0 " + extra;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

std::string only_run(const std::string& root) {
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory()) return e.path().string();
  return root + "/<no run>";
}

// Every file under `dir` by relative path -> its SHA-256: the folder as a refused resume must leave it.
std::map<std::string, std::string> folder_hashes(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    out[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? sha256_file_hex(e.path().string()) : "dir";
  return out;
}

}  // namespace

// A finished run resumed with another LoRA shape, other data, a dataset its position does not
// fit, or no more steps (alpha, rsLoRA and the other pinned settings: tests/train/resume_test.cpp): each is
// CONFIG_RESUME_MISMATCH naming both values, never "damaged", and the run folder (metrics.jsonl, status.json,
// summary.json, checkpoints, adapter) is byte-identical.
TEST(ResumeCli, RefusedResumeLeavesTheRunFolderUntouched) {
  test::TempDir tmp;
  const std::string data = tmp.path + "/data.jsonl", root = tmp.path + "/runs";
  write_data(data, 12);
  write_data(tmp.path + "/small.jsonl", 3);
  const std::string model = " --model " + test::shared_dir() + "/models/stories260K";
  std::string out;
  ASSERT_EQ(test::run_command(train(model + " --data " + data +
                                    " --batch-size 4 --max-seq-length 64 --holdout 0 --steps 2 --save-every 1 "
                                    "--keep-checkpoints 0 --output " +
                                    root),
                              &out),
            0)
      << out;
  const std::string run = only_run(root);
  const auto before = folder_hashes(run);
  struct Case {
    std::string flags, expect1, expect2;
  };
  const Case cases[] = {
      {"--resume latest --steps 4 --target-modules q_proj", "--target-modules q_proj",
       "the run was trained with --target-modules all-linear"},
      {"--resume " + run + "/checkpoints/checkpoint-1 --steps 2 --lora-r 4", "--lora-r 4",
       "the run was trained with --lora-r 16"},
      {"--resume latest --steps 4 --data " + tmp.path + "/small.jsonl", "small.jsonl", "data.jsonl"},
      {"--resume latest", "already finished at step 2 of 2", "--steps larger than 2"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(test::run_command(train(model + " --output " + root + " " + c.flags), &out), 1) << c.flags << "\n" << out;
    EXPECT_TRUE(has(out, "CONFIG_RESUME_MISMATCH")) << c.flags << "\n" << out;
    EXPECT_TRUE(has(out, c.expect1) && has(out, c.expect2)) << c.flags << "\n" << out;
    EXPECT_FALSE(has(out, "damaged") || has(out, "huggingface-cli")) << c.flags << "\n" << out;
    EXPECT_EQ(folder_hashes(run), before) << c.flags << ": a refused resume changed the run folder";
  }
  // The same file, now too short for the saved position (sample 4 of 3): the data changed, the
  // checkpoint is fine.
  write_data(data, 3);
  EXPECT_EQ(
      test::run_command(train("--output " + root + " --resume " + run + "/checkpoints/checkpoint-1 --steps 2"), &out),
      1)
      << out;
  EXPECT_TRUE(has(out, "CONFIG_RESUME_MISMATCH") && has(out, "gives 3 training samples")) << out;
  EXPECT_FALSE(has(out, "damaged")) << out;
  EXPECT_EQ(folder_hashes(run), before) << "a refused resume changed the run folder";
}

// Killed at step 2 of 4, resumed with nothing but --resume latest: the run's own settings (model,
// data, batch, sequence length, lr, steps) come back, so it is bit for bit the run trained
// straight; settings.json keeps them and summary.json tells the whole run (initial eval loss too).
// Resumed again without more steps it is already finished; --steps 5 extends it.
TEST(ResumeCli, ResumeContinuesWithTheRunsOwnSettings) {
  test::TempDir tmp;
  const std::string data = tmp.path + "/data.jsonl";
  write_data(data, 20);
  const std::string flags = " --model " + test::shared_dir() + "/models/stories260K --data " + data +
                            " --batch-size 2 --max-seq-length 48 --lora-r 4 --lr-scheduler constant --steps 4"
                            " --save-every 2 --keep-checkpoints 0";
  std::string out;
  ASSERT_EQ(test::run_command(train(flags + " --output " + tmp.path + "/straight"), &out), 0) << out;
  EXPECT_EQ(test::run_command(train(flags + " --fault-inject-crash-step 2 --output " + tmp.path + "/crashed"), &out),
            128 + SIGKILL)
      << out;
  const std::string run = only_run(tmp.path + "/crashed"), straight = only_run(tmp.path + "/straight");
  ASSERT_EQ(test::run_command(test::backprop_exe() + " train --device cpu --threads 1 --resume latest --output " +
                                  tmp.path + "/crashed",
                              &out),
            0)
      << out;
  EXPECT_TRUE(has(out, "at step 2 of 4")) << out;
  EXPECT_EQ(slurp(run + "/adapter/adapter_model.safetensors"), slurp(straight + "/adapter/adapter_model.safetensors"));
  auto settings = nlohmann::json::parse(slurp(run + "/settings.json"));
  EXPECT_EQ(settings["training"]["batch_size"], 2);
  EXPECT_EQ(settings["training"]["max_seq_length"], 48);
  EXPECT_EQ(settings["training"]["steps"], 4);
  EXPECT_EQ(settings["lora"]["r"], 4);
  const std::string summary = slurp(run + "/summary.json");
  auto sum = nlohmann::json::parse(summary);
  EXPECT_EQ(sum["steps"], 4);
  EXPECT_FALSE(sum["initial_eval_loss"].is_null()) << summary;
  EXPECT_EQ(sum["initial_eval_loss"], nlohmann::json::parse(slurp(straight + "/summary.json"))["initial_eval_loss"]);

  EXPECT_EQ(test::run_command(train("--resume latest --output " + tmp.path + "/crashed"), &out), 1) << out;
  EXPECT_TRUE(has(out, "already finished")) << out;
  EXPECT_EQ(slurp(run + "/summary.json"), summary);
  ASSERT_EQ(test::run_command(train("--resume latest --steps 5 --output " + tmp.path + "/crashed"), &out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(slurp(run + "/summary.json"))["steps"], 5);
  EXPECT_EQ(nlohmann::json::parse(slurp(run + "/settings.json"))["training"]["steps"], 5);
}

}  // namespace bp
