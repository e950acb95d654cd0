// Resume checks (train/resume.h): what makes an intact checkpoint unusable, and metrics.jsonl
// trimming after a resume.
#include "train/resume.h"

#include <filesystem>
#include <fstream>
#include <limits>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "support/test_util.h"

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
TEST(ResumeCheck, OtherModeIsConfigInvalidNamingBothModes) {
  test::TempDir tmp;
  nlohmann::json st = good_state();
  st.erase("mode");
  for (const auto& state : {good_state(), st}) {
    Error e = error_of(checkpoint_with(tmp.path, state, 0.5f), TrainMode::Full);
    EXPECT_EQ(e.code(), ErrorCode::CONFIG_INVALID) << e.what();
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

}  // namespace bp
