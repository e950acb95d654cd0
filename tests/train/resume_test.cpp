// Resume checks (train/resume.h): what makes an intact checkpoint unusable, and metrics.jsonl
// trimming after a resume.
#include "train/resume.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>

#include "core/settings.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/sha256.h"
#include "support/test_util.h"
#include "train/resume_settings.h"
#include "train/trainer.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

nlohmann::json good_state() {
  return {
      {"step", 3},       {"optimizer_step", 3}, {"micro_batch_size", 2},     {"cursor", {{"epoch", 0}, {"index", 6}}},
      {"run_id", "abc"}, {"mode", "lora"},      {"best_eval_loss", nullptr}, {"tokens", 100}};
}

CheckpointInfo checkpoint_with(const std::string& dir, const nlohmann::json& state, float first_value) {
  fs::create_directories(dir);
  Tensor a = test::random_tensor({2, 3}, 1);
  a.data<float>()[0] = first_value;
  write_safetensors(dir + "/trainable.safetensors",
                    {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", a}});
  return {dir, 3, state};
}

Error error_of(const CheckpointInfo& c, TrainMode mode) {
  try {
    check_resumable_checkpoint(c, mode);
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorCode::RUNTIME_INTERNAL, "no error");
}

}  // namespace

TEST(ResumeCheck, AcceptsAGoodCheckpoint) {
  test::TempDir tmp;
  EXPECT_NO_THROW(check_resumable_checkpoint(checkpoint_with(tmp.path, good_state(), 0.5f), TrainMode::Lora));
}

TEST(ResumeCheck, WrongFieldTypesAreCheckpointInvalid) {
  test::TempDir tmp;
  for (auto [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{{"step", "3"},
                                                                                 {"optimizer_step", 1.5},
                                                                                 {"cursor", nlohmann::json::array()},
                                                                                 {"run_id", 7},
                                                                                 {"best_eval_loss", "low"},
                                                                                 {"micro_batch_size", 0}}) {
    nlohmann::json st = good_state();
    st[field] = value;
    Error e = error_of(checkpoint_with(tmp.path, st, 0.5f), TrainMode::Lora);
    EXPECT_EQ(e.code(), ErrorCode::STATE_CHECKPOINT_INVALID) << field << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
  nlohmann::json st = good_state();
  st.erase("optimizer_step");
  EXPECT_EQ(error_of(checkpoint_with(tmp.path, st, 0.5f), TrainMode::Lora).code(), ErrorCode::STATE_CHECKPOINT_INVALID);
}

TEST(ResumeCheck, NonFiniteTrainableWeightsAreCheckpointInvalid) {
  test::TempDir tmp;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Error e = error_of(checkpoint_with(tmp.path, good_state(), bad), TrainMode::Lora);
    EXPECT_EQ(e.code(), ErrorCode::STATE_CHECKPOINT_INVALID) << e.what();
    EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
  }
}

// The other mode is a configuration mismatch, not damage; old checkpoints (no "mode") are
// recognised by their tensor names.
TEST(ResumeCheck, OtherModeIsResumeMismatchNamingBothModes) {
  test::TempDir tmp;
  nlohmann::json st = good_state();
  st.erase("mode");
  for (const auto& state : {good_state(), st}) {
    Error e = error_of(checkpoint_with(tmp.path, state, 0.5f), TrainMode::Full);
    EXPECT_EQ(e.code(), ErrorCode::CONFIG_RESUME_MISMATCH) << e.what();
    EXPECT_NE(std::string(e.what()).find("--mode lora"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--mode full"), std::string::npos) << e.what();
  }
}

TEST(ResumeMetrics, DropsRecordsPastTheStepAndATornLine) {
  test::TempDir tmp;
  const std::string p = tmp.path + "/metrics.jsonl";
  write_file_atomic(p,
                    "{\"type\":\"event\",\"message\":\"start\"}\n"
                    "{\"type\":\"step\",\"step\":1}\n"
                    "{\"type\":\"checkpoint\",\"step\":1}\n"
                    "{\"type\":\"step\",\"step\":2}\n"
                    "{\"type\":\"oom_recovery\",\"step\":3}\n"
                    "{\"type\":\"step\",\"step\":3}\n"
                    "{\"type\":\"step\",\"st");
  truncate_metrics_after_step(p, 2);
  std::ifstream in(p);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text,
            "{\"type\":\"event\",\"message\":\"start\"}\n"
            "{\"type\":\"step\",\"step\":1}\n"
            "{\"type\":\"checkpoint\",\"step\":1}\n"
            "{\"type\":\"step\",\"step\":2}\n");
  truncate_metrics_after_step(tmp.path + "/none.jsonl", 2);  // no file: nothing happens
  EXPECT_FALSE(fs::exists(tmp.path + "/none.jsonl"));
}

// A resumed run's settings: unset ones come from settings.json, explicit safe ones win, explicit
// pinned ones that differ are refused naming both values (all of them at once).
TEST(ResumeSettings, SavedUnderExplicitAndPinnedRefused) {
  const nlohmann::json saved = {{"training", {{"lr", 0.001}, {"steps", 40}, {"batch_size", 2}, {"seed", 42}}},
                                {"lora", {{"r", 8}, {"target_modules", "all-linear"}}},
                                {"data", {{"path", "a.jsonl"}}},
                                {"preset", {{"name", "none"}}}};
  Settings st;
  st.set("training.steps", "60");  // explicit, safe: extends the run
  st.set("lora.r", "8");           // explicit, pinned, the same value
  apply_resumed_settings(st, saved, "runs/x");
  EXPECT_EQ(st.get_int("training.steps"), 60);
  EXPECT_DOUBLE_EQ(st.get_float("training.lr"), 0.001);
  EXPECT_EQ(st.get_int("training.batch_size"), 2);
  EXPECT_EQ(st.get_string("data.path"), "a.jsonl");
  Settings bad;
  bad.set("lora.r", "4");
  bad.set("data.path", "b.jsonl");
  bad.set("training.lr", "0.5");  // not pinned: no complaint
  try {
    apply_resumed_settings(bad, saved, "runs/x");
    ADD_FAILURE() << "a pinned setting changed on resume was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), ErrorCode::CONFIG_RESUME_MISMATCH) << m;
    for (const char* s : {"--lora-r 4", "--lora-r 8", "--data b.jsonl", "--data a.jsonl"})
      EXPECT_NE(m.find(s), std::string::npos) << s << ": " << m;
    EXPECT_EQ(m.find("--lr"), std::string::npos) << m;
  }
}

namespace {

std::map<std::string, std::string> folder_hashes(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    out[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? sha256_file_hex(e.path().string()) : "dir";
  return out;
}

void write_rows(const std::string& path, int rows) {
  std::ofstream f(path);
  for (int i = 0; i < rows; ++i) f << "{\"text\": \"Ben had a red ball number " << i % 5 << ".\"}\n";
}

TrainOptions tiny_run(const std::string& dir) {
  TrainOptions o;
  o.model_dir = test::shared_dir() + "/models/stories260K";
  o.device = "cpu";
  o.data_path = dir + "/data.jsonl";
  o.output_dir = dir + "/run";
  o.steps = 2;
  o.save_every = 1;
  o.keep_checkpoints = 0;
  o.batch_size = 4;
  o.micro_batch_size = 4;
  o.max_seq_length = 32;
  o.holdout = 0.2;
  o.lora.r = 4;
  o.lora.alpha = 8;
  o.lora.target_modules = {"all-linear"};
  o.threads = 1;
  o.quiet = true;
  return o;
}

}  // namespace

// Through the Trainer (no CLI settings merge): another LoRA shape (targets, r, alpha, rsLoRA), a
// dataset the saved position does not fit, fewer steps than done, or a finished run: each is
// CONFIG_RESUME_MISMATCH, not a damaged checkpoint, and the run folder stays byte-identical (the
// status stays finished, metrics.jsonl keeps every step). A fitting resume then works and its
// summary has the eval loss before training.
TEST(ResumeRun, MismatchIsRefusedBeforeTheRunFolderChanges) {
  test::TempDir tmp;
  write_rows(tmp.path + "/data.jsonl", 20);
  write_rows(tmp.path + "/small.jsonl", 4);
  write_rows(tmp.path + "/big.jsonl", 30);
  const TrainOptions first = tiny_run(tmp.path);
  Trainer(first).run();
  const auto before = folder_hashes(first.output_dir);
  std::vector<std::pair<std::string, std::function<void(TrainOptions&)>>> cases = {
      {"targets", [](TrainOptions& o) { o.lora.target_modules = {"q_proj"}; }},
      {"r", [](TrainOptions& o) { o.lora.r = 8; }},
      {"alpha", [](TrainOptions& o) { o.lora.alpha = 16; }},
      {"rslora", [](TrainOptions& o) { o.lora.use_rslora = true; }},
      {"data", [&](TrainOptions& o) { o.data_path = tmp.path + "/small.jsonl"; }},
      {"more data", [&](TrainOptions& o) { o.data_path = tmp.path + "/big.jsonl"; }},
      {"fewer steps", [](TrainOptions& o) { o.steps = 1; }},
      {"finished", [](TrainOptions&) {}},
  };
  for (auto& [name, change] : cases) {
    TrainOptions o = tiny_run(tmp.path);
    o.resume = "latest";
    change(o);
    try {
      Trainer(o).run();
      ADD_FAILURE() << name << ": resumed";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::CONFIG_RESUME_MISMATCH) << name << ": " << e.what();
      EXPECT_EQ(std::string(e.what()).find("damaged"), std::string::npos) << e.what();
    }
    EXPECT_EQ(folder_hashes(first.output_dir), before) << name << ": a refused resume changed the run folder";
  }
  TrainOptions more = tiny_run(tmp.path);
  more.resume = "latest";
  more.steps = 3;
  const TrainSummary s = Trainer(more).run();
  EXPECT_EQ(s.steps_done, 3);
  EXPECT_TRUE(s.initial_eval_loss.has_value());
}

}  // namespace bp
