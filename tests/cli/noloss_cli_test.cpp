// Issue 13 ("nothing lost"), through the real binary: checkpoints kept, promoted, recovered and
// chosen the way a user relies on; resume picks the next older valid checkpoint when the newest is
// malformed; and the messages, settings and exit codes around it (seed range, metrics after a
// resume, unwritable outputs, --config naming a folder, hub names, secrets in URLs and rows,
// merged exports on a full disk). Uses the real stories260K model (tiny, fast).
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "support/test_util.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

std::string model_dir() {
  return test::shared_dir() + "/models/stories260K";
}

void write_data(const std::string& dir) {
  std::ofstream f(dir + "/data.jsonl");
  for (int i = 0; i < 12; ++i) f << "{\"text\": \"Tom saw a bird number " << i % 5 << ". It was happy.\"}\n";
}

std::string train_cmd(const std::string& dir, const std::string& extra) {
  return test::backprop_exe() + " train --device cpu --model " + model_dir() + " --data " + dir +
         "/data.jsonl --batch-size 4 --micro-batch-size 4 --lr 5e-3 --warmup-steps 0 --lr-scheduler constant"
         " --lora-r 4 --lora-dropout 0 --max-seq-length 64 --threads 1 --holdout 0 " +
         extra;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// Rewrites one file of a checkpoint and its manifest entry, so only the content is wrong.
void replace_in_checkpoint(const std::string& ckpt, const std::string& name, const std::string& body) {
  write_file_atomic(ckpt + "/" + name, body);
  auto m = nlohmann::json::parse(slurp(ckpt + "/manifest.json"));
  m["files"][name] = {{"bytes", body.size()}, {"sha256", sha256_file_hex(ckpt + "/" + name)}};
  write_file_atomic(ckpt + "/manifest.json", m.dump());
}

// The one run folder under an --output root.
std::string only_run(const std::string& root) {
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory()) return e.path().string();
  return root + "/<no run>";
}

std::vector<int64_t> checkpoint_steps(const std::string& run) {
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(run + "/checkpoints")) {
    std::string n = e.path().filename().string();
    steps.push_back(std::stoll(n.substr(std::string("checkpoint-").size())));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// The step records of a metrics.jsonl; every line parses (a doubled or torn record throws), except
// a last line without its '\n' when `torn_end_ok` (the disk filled in the middle of that record).
std::vector<int64_t> step_records(const std::string& metrics_path, bool torn_end_ok = false) {
  std::vector<int64_t> steps;
  std::ifstream in(metrics_path);
  for (std::string line; std::getline(in, line);) {
    if (torn_end_ok && in.eof()) break;
    const auto j = nlohmann::json::parse(line);
    if (j.at("type") == "step") steps.push_back(j.at("step").get<int64_t>());
  }
  return steps;
}

}  // namespace

// --keep-checkpoints 0 is documented as "keep all": it deleted every checkpoint.
TEST(NoLossCli, KeepCheckpointsZeroKeepsAll) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  const std::string cmd =
      train_cmd(tmp.path, "--steps 3 --save-every 1 --keep-checkpoints 0 --output " + tmp.path + "/run");
  ASSERT_EQ(test::run_command(cmd, &out), 0) << out;
  EXPECT_EQ(checkpoint_steps(only_run(tmp.path + "/run")), (std::vector<int64_t>{1, 2, 3})) << out;
}

// The final save re-writes checkpoint-2 (saved at step 2 already); with --keep-checkpoints 1 it is
// the only checkpoint. A kill between setting the old folder aside and moving the new one in must
// leave something to resume.
TEST(NoLossCli, KillDuringFinalRewriteLeavesAResumableCheckpoint) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  std::string run = " --output " + tmp.path + "/run";
  int rc = test::run_command(train_cmd(tmp.path,
                                       "--steps 2 --save-every 2 --keep-checkpoints 1 "
                                       "--fault-inject-crash-at checkpoint:after_set_aside" +
                                           run),
                             &out);
  ASSERT_EQ(rc, 128 + SIGKILL) << out;
  ASSERT_FALSE(fs::exists(only_run(tmp.path + "/run") + "/checkpoints/checkpoint-2"))
      << "the crash point is between the renames";
  rc = test::run_command(train_cmd(tmp.path, "--steps 2 --save-every 2 --keep-checkpoints 1 --resume latest" + run),
                         &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(has(out, "restored the complete checkpoint")) << out;
  EXPECT_TRUE(has(out, "resumed from")) << out;
  EXPECT_EQ(checkpoint_steps(only_run(tmp.path + "/run")), (std::vector<int64_t>{2}));
}

// The newest checkpoints are malformed in ways a checksum does not catch (wrong JSON types,
// non-finite weights, a step number that overflows): each is skipped with a warning and the
// run resumes from the newest valid one. metrics.jsonl then holds every step once.
TEST(NoLossCli, ResumeSkipsMalformedCheckpointsAndMetricsHoldEachStepOnce) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out, root = tmp.path + "/runs";
  ASSERT_EQ(test::run_command(train_cmd(tmp.path,
                                        "--steps 4 --save-every 1 --keep-checkpoints 0 "
                                        "--fault-inject-crash-step 4 --output " +
                                            root),
                              &out),
            128 + SIGKILL)
      << out;
  const std::string run = only_run(root);
  std::string ck = run + "/checkpoints/checkpoint-";
  // 4: trainer_state.json is an array; 3: the manifest's byte count is text; 2: a NaN weight.
  replace_in_checkpoint(ck + "4", "trainer_state.json", "[1, 2, 3]");
  auto manifest = nlohmann::json::parse(slurp(ck + "3/manifest.json"));
  manifest["files"]["trainable.safetensors"]["bytes"] = "abc";
  write_file_atomic(ck + "3/manifest.json", manifest.dump());
  {
    auto reader = SafetensorsReader::open_file(ck + "2/trainable.safetensors");
    NamedTensors tensors;
    for (const auto& n : reader.names()) tensors.emplace_back(n, reader.read(n));
    tensors[1].second.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
    write_safetensors(run + "/nan.safetensors", tensors);
    replace_in_checkpoint(ck + "2", "trainable.safetensors", slurp(run + "/nan.safetensors"));
  }
  fs::create_directories(run + "/checkpoints/checkpoint-99999999999999999999999");
  int rc = test::run_command(train_cmd(tmp.path, "--steps 4 --save-every 0 --resume latest --output " + root), &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(has(out, "resumed from " + ck + "1 at step 1")) << out;
  for (const char* skipped : {"checkpoint-99999999999999999999999", "checkpoint-4:", "checkpoint-3:", "checkpoint-2:"})
    EXPECT_TRUE(has(out, std::string("skipping damaged checkpoint ") + run + "/checkpoints/" + skipped))
        << skipped << "\n"
        << out;
  EXPECT_TRUE(has(out, "non-finite")) << out;
  EXPECT_FALSE(has(out, "RUNTIME_INTERNAL")) << out;
  // metrics.jsonl: steps 1..4 once each (steps 2..4 of the crashed run were dropped on resume).
  std::map<int64_t, int> steps;
  std::ifstream metrics(run + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "step") ++steps[j["step"].get<int64_t>()];
  }
  EXPECT_EQ(steps, (std::map<int64_t, int>{{1, 1}, {2, 1}, {3, 1}, {4, 1}}));
}

// A LoRA checkpoint resumed with --mode full is not damaged: the modes differ.
TEST(NoLossCli, ResumeInAnotherModeSaysTheModesDiffer) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out, run = " --output " + tmp.path + "/run";
  ASSERT_EQ(test::run_command(train_cmd(tmp.path, "--steps 1" + run), &out), 0) << out;
  int rc = test::run_command(train_cmd(tmp.path, "--steps 2 --resume latest --mode full" + run), &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(has(out, "CONFIG_RESUME_MISMATCH")) << out;
  EXPECT_TRUE(has(out, "the run was trained with --mode lora")) << out;
  EXPECT_TRUE(has(out, "checkpoint is fine")) << out;
  EXPECT_FALSE(has(out, "damaged")) << out;
}

// A full disk at the first checkpoint: the suggestion must not claim a previous checkpoint.
TEST(NoLossCli, DiskFullSuggestionSaysWhatIsLeft) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  int rc = test::run_command(
      train_cmd(tmp.path, "--steps 1 --fault-inject-enospc-after-bytes 20000 --output " + tmp.path + "/run"), &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(has(out, "STATE_DISK_FULL")) << out;
  EXPECT_TRUE(has(out, "checkpoint-1")) << "the first checkpoint's write ran out of space: " << out;
  EXPECT_TRUE(has(out, "No checkpoint of this run was saved yet")) << out;
  EXPECT_FALSE(has(out, "previous checkpoint is intact")) << out;
}

// The seed takes the whole uint64 range, is recorded exactly, and changes the run.
TEST(NoLossCli, SeedAcceptsTheFullUint64Range) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  ASSERT_EQ(test::run_command(
                train_cmd(tmp.path, "--steps 1 --seed 18446744073709551615 --output " + tmp.path + "/max"), &out),
            0)
      << out;
  auto settings = nlohmann::json::parse(slurp(only_run(tmp.path + "/max") + "/settings.json"));
  EXPECT_EQ(settings["training"]["seed"].get<uint64_t>(), std::numeric_limits<uint64_t>::max());
  ASSERT_EQ(test::run_command(train_cmd(tmp.path, "--steps 1 --output " + tmp.path + "/default"), &out), 0) << out;
  EXPECT_NE(slurp(only_run(tmp.path + "/max") + "/adapter/adapter_model.safetensors"),
            slurp(only_run(tmp.path + "/default") + "/adapter/adapter_model.safetensors"));
  EXPECT_EQ(test::run_command(train_cmd(tmp.path, "--steps 1 --seed 18446744073709551616"), &out), 1) << out;
  EXPECT_TRUE(has(out, "CONFIG_INVALID_SETTING")) << out;
  EXPECT_EQ(test::run_command(train_cmd(tmp.path, "--steps 1 --seed -1"), &out), 1) << out;
  EXPECT_TRUE(has(out, "out of range")) << out;
}

// An output folder that cannot be written is the user's to fix: a code, the path, exit 1.
TEST(NoLossCli, UnwritableOutputIsAUserErrorNamingThePath) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::ofstream(tmp.path + "/a-file") << "x";
  for (const std::string& output : {std::string("/dev/null"), tmp.path + "/a-file"}) {
    std::string out;
    int rc = test::run_command(train_cmd(tmp.path, "--steps 1 --output " + output), &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_TRUE(has(out, "INPUT_VALIDATION_FAILED")) << out;
    EXPECT_TRUE(has(out, output)) << out;
    EXPECT_FALSE(has(out, "RUNTIME_INTERNAL")) << out;
    rc = test::run_command(
        test::backprop_exe() + " export " + model_dir() + " --format merged --output " + output + "/merged", &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_TRUE(has(out, "INPUT_VALIDATION_FAILED")) << out;
  }
}

TEST(NoLossCli, ConfigNamingAFolderIsAnError) {
  test::TempDir tmp;
  std::string out;
  int rc = test::run_command(test::backprop_exe() + " --config " + tmp.path + " info", &out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(has(out, "INPUT_FILE_NOT_REGULAR")) << out;  // the shared reader refuses it (core/file_read.h)
  EXPECT_TRUE(has(out, "is a directory")) << out;
}

// train, generate and validate treat a hub name as one (the hub layer: cache, then download), not as
// a folder ("tokenizer.json: cannot open"). Offline with an empty cache, so no test touches the
// network: every command names the cache and the way out.
TEST(NoLossCli, HubNameAsModelIsExplainedByEveryCommand) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  for (const std::string& cmd : {" train --device cpu --model Qwen/Qwen2.5-0.5B --data " + tmp.path +
                                     "/data.jsonl --steps 1 --output " + tmp.path,
                                 std::string(" generate --model Qwen/Qwen2.5-0.5B --prompt hi"),
                                 " validate " + tmp.path + "/data.jsonl --model Qwen/Qwen2.5-0.5B"}) {
    int rc = test::run_command(
        "cd " + tmp.path + " && HF_HUB_OFFLINE=1 HF_HUB_CACHE=" + tmp.path + "/hf-cache " + test::backprop_exe() + cmd,
        &out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_TRUE(has(out, "DEP_MODEL_LOAD_FAILED")) << out;
    EXPECT_TRUE(has(out, "Qwen/Qwen2.5-0.5B@main is not in the Hugging Face cache")) << out;
    EXPECT_FALSE(has(out, "cannot open file")) << out;
  }
}

// Credentials in a URL stay out of `info --env-vars`, the run's settings.json and error messages;
// `validate` does not echo tokens from bad rows.
TEST(NoLossCli, CredentialsInUrlsAndRowsAreRedacted) {
  test::TempDir tmp;
  write_data(tmp.path);
  const std::string env = "BACKPROPAGATE_EXPORT__OLLAMA_HOST=http://alice:s3cretpw@127.0.0.1:9 ";
  std::string out;
  ASSERT_EQ(test::run_command(env + test::backprop_exe() + " info --env-vars", &out), 0) << out;
  EXPECT_TRUE(has(out, "127.0.0.1:9")) << out;
  EXPECT_FALSE(has(out, "s3cretpw")) << out;
  ASSERT_EQ(test::run_command(env + train_cmd(tmp.path, "--steps 1 --output " + tmp.path + "/run"), &out), 0) << out;
  const std::string settings = slurp(only_run(tmp.path + "/run") + "/settings.json");
  EXPECT_TRUE(has(settings, "127.0.0.1:9")) << settings;
  EXPECT_FALSE(has(settings, "s3cretpw")) << settings;
  int rc = test::run_command(test::backprop_exe() + " export " + model_dir() + " --format gguf --output " + tmp.path +
                                 "/m.gguf --ollama --ollama-retries 0 --ollama-host http://alice:s3cretpw@127.0.0.1:9",
                             &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_TRUE(has(out, "DEP_OLLAMA_REGISTRATION_FAILED")) << out;
  EXPECT_FALSE(has(out, "s3cretpw")) << out;
  std::ofstream(tmp.path + "/bad.jsonl")
      << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"
         "\n"
      << R"({"messages": [{"role": "hf_abcdefghijklmnopqrstuvwxyz0123", "content": "hi"}]})"
         "\n";
  for (const char* fmt : {"", " --json"}) {
    rc = test::run_command(test::backprop_exe() + " validate " + tmp.path + "/bad.jsonl" + fmt, &out);
    EXPECT_EQ(rc, 1) << out;
    EXPECT_TRUE(has(out, "line 2") || has(out, "\"line\": 2")) << out;
    EXPECT_FALSE(has(out, "hf_abcdefghijklmnopqrstuvwxyz0123")) << out;
  }
}

// A merged export that runs out of disk leaves nothing behind and keeps an earlier export.
TEST(NoLossCli, MergedExportOnAFullDiskLeavesNothingHalfWritten) {
  test::TempDir tmp;
  std::string out;
  const std::string enospc = "BACKPROPAGATE_TRAINING__FAULT_INJECT_ENOSPC_AFTER_BYTES=4096 ";
  const std::string merged = tmp.path + "/merged";
  int rc = test::run_command(
      enospc + test::backprop_exe() + " export " + model_dir() + " --format merged --output " + merged, &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(has(out, "STATE_DISK_FULL")) << out;
  EXPECT_FALSE(has(out, "previous checkpoint")) << out;
  for (const auto& e : fs::directory_iterator(tmp.path)) ADD_FAILURE() << "left behind: " << e.path();
  // An earlier complete export survives a failed one.
  ASSERT_EQ(
      test::run_command(test::backprop_exe() + " export " + model_dir() + " --format merged --output " + merged, &out),
      0)
      << out;
  std::string weights;
  for (const auto& e : fs::directory_iterator(merged))
    if (e.path().extension() == ".safetensors") weights = e.path().string();
  ASSERT_FALSE(weights.empty());
  const std::string before = slurp(weights);
  rc = test::run_command(
      enospc + test::backprop_exe() + " export " + model_dir() + " --format merged --output " + merged, &out);
  EXPECT_EQ(rc, 2) << out;
  EXPECT_EQ(slurp(weights), before);
  EXPECT_FALSE(fs::exists(merged + ".partial"));
}

// A full disk under metrics.jsonl and --log-file (issue 37): the run used to exit 0 with 3 of 17
// metric records and no word. Now the first failed write of each file is a warning naming the file
// and the errno text; the records wait in memory and are written once there is room again, in
// order and each once; what could not be written is counted in summary.json, and `train` exits 3.
TEST(NoLossCli, RecordWritesThatFailForAWhileAreRetriedAndNothingIsLost) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  // After 1500 bytes of records the next 4 writes fail with ENOSPC; then there is room again.
  const int rc = test::run_command(train_cmd(tmp.path,
                                             "--steps 6 --fault-inject-records-enospc-after-bytes 1500 "
                                             "--fault-inject-records-failing-writes 4 --output " +
                                                 tmp.path + "/runs"),
                                   &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(count_of(out, "cannot write the metrics file"), 1u) << "warned once\n" << out;
  EXPECT_TRUE(has(out, "No space left on device")) << out;
  const std::string run = only_run(tmp.path + "/runs");
  EXPECT_TRUE(has(out, run + "/metrics.jsonl")) << "names the file\n" << out;
  EXPECT_EQ(step_records(run + "/metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  const auto summary = nlohmann::json::parse(slurp(run + "/summary.json"));
  EXPECT_EQ(summary.at("records_lost"), 0) << summary.dump(2);
  ASSERT_EQ(test::run_command(test::backprop_exe() + " show-run " + run + " --json 2>/dev/null", &out), 0) << out;
  EXPECT_TRUE(nlohmann::json::parse(out).at("final_loss").is_number()) << out;
}

TEST(NoLossCli, RecordWritesOnAFullDiskAreCountedInTheSummaryAndExitThree) {
  test::TempDir tmp;
  write_data(tmp.path);
  std::string out;
  const std::string log = tmp.path + "/train.log.jsonl";
  const int rc =
      test::run_command(train_cmd(tmp.path, "--steps 6 --fault-inject-records-enospc-after-bytes 1500 --log-file " +
                                                log + " --output " + tmp.path + "/runs --json"),
                        &out);
  EXPECT_EQ(rc, 3) << "trained and saved, records lost: partial success\n" << out;
  EXPECT_EQ(count_of(out, "cannot write the metrics file"), 1u) << out;
  EXPECT_EQ(count_of(out, "cannot write the log file " + log + ": No space left on device"), 1u) << out;
  const std::string run = only_run(tmp.path + "/runs");
  const auto summary = nlohmann::json::parse(slurp(run + "/summary.json"));
  EXPECT_EQ(summary.at("steps"), 6);
  EXPECT_GT(summary.at("records_lost").get<int64_t>(), 0) << summary.dump(2);
  const auto files = summary.at("records_lost_files");
  EXPECT_NE(std::find(files.begin(), files.end(), run + "/metrics.jsonl"), files.end()) << files;
  EXPECT_NE(std::find(files.begin(), files.end(), log), files.end()) << files;
  EXPECT_TRUE(fs::exists(run + "/adapter/adapter_model.safetensors")) << "the run itself is saved";
  const auto steps = step_records(run + "/metrics.jsonl", /*torn_end_ok=*/true);
  EXPECT_LT(steps.size(), 6u);
}

}  // namespace bp
