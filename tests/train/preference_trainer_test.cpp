// The preference methods end to end on the real stories260K model: each method learns a
// preference it can see (chosen endings are happy, rejected ones sad) and moves the held-out
// reward accuracy well above chance on pairs it never trained on; the adapter-off reference and
// the precomputed one give the same run; the SFT guarantees hold (OOM recovery keeps pairs and
// losses, NaN steps are skipped, a resumed run is bit-identical, the reference is read back from
// the checkpoint instead of recomputed).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"
#include "support/test_util.h"
#include "train/trainer.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

// Pairs whose chosen completion ends happily and whose rejected one sadly, over names and things;
// `offset` picks other combinations (the held-out file).
std::string write_pairs(const std::string& path, int rows, int offset, bool kto = false) {
  std::ofstream f(path);
  const char* names[] = {"Lily", "Tom", "Ben", "Sue", "Max", "Mia", "Sam"};
  const char* things[] = {"a red ball", "a big dog", "a small cat", "a blue car", "a new hat"};
  for (int i = 0; i < rows; ++i) {
    const int k = i + offset;
    const std::string prompt = std::string(names[k % 7]) + " had " + things[(k / 7) % 5] + ".";
    const std::string good = std::string(names[k % 7]) + " was happy and smiled.";
    const std::string bad = std::string(names[k % 7]) + " was sad and cried.";
    if (kto) {
      f << nlohmann::json{{"prompt", prompt}, {"completion", k % 2 ? bad : good}, {"label", k % 2 == 0}}.dump() << "\n";
    } else {
      f << nlohmann::json{{"prompt", prompt}, {"chosen", good}, {"rejected", bad}}.dump() << "\n";
    }
  }
  return path;
}

TrainOptions base(const std::string& dir, TrainMethod method) {
  TrainOptions o;
  o.model_dir = test::shared_dir() + "/models/stories260K";
  o.device = "cpu";
  o.method = method;
  o.data_path = write_pairs(dir + "/train.jsonl", 24, 0, method == TrainMethod::Kto);
  o.eval_data_path = write_pairs(dir + "/eval.jsonl", 8, 100, method == TrainMethod::Kto);
  o.output_dir = dir + "/run";
  o.steps = 16;
  o.batch_size = 4;
  o.micro_batch_size = 4;
  o.lr = 1e-2;
  o.warmup_steps = 0;
  o.lr_scheduler = LrScheduler::Constant;
  o.max_seq_length = 128;
  o.lora.r = 4;
  o.lora.alpha = 8;
  o.lora.dropout = 0.0f;
  o.lora.target_modules = {"all-linear"};
  o.threads = 1;
  o.quiet = true;
  if (method_needs_reference(method) && o.pref.reference == ReferenceSource::Auto)
    o.pref.reference = ReferenceSource::AdapterOff;
  if (method == TrainMethod::Simpo) o.pref.beta = 2.0;
  return o;
}

std::vector<nlohmann::json> records(const std::string& run, const std::string& type) {
  std::vector<nlohmann::json> out;
  std::ifstream f(run + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("type", "") == type) out.push_back(j);
  }
  return out;
}

TEST(PreferenceTrainer, EachMethodLearnsAPreferenceItCanSeeOnHeldOutPairs) {
  for (TrainMethod m : {TrainMethod::Dpo, TrainMethod::Orpo, TrainMethod::Simpo, TrainMethod::Kto}) {
    SCOPED_TRACE(train_method_name(m));
    test::TempDir dir;
    const TrainOptions o = base(dir.path, m);
    const TrainSummary s = Trainer(o).run();
    EXPECT_EQ(s.steps_done, 16);
    const auto evals = records(o.output_dir, "eval");
    ASSERT_GE(evals.size(), 2u);
    const auto& first = evals.front();
    const auto& last = evals.back();
    ASSERT_TRUE(last.contains("eval_rewards/accuracies")) << last.dump();
    EXPECT_GE(last["eval_rewards/accuracies"].get<double>(), 0.75) << last.dump();
    EXPECT_LT(last["eval_loss"].get<double>(), first["eval_loss"].get<double>());
    if (m != TrainMethod::Kto) {
      EXPECT_GT(last["eval_rewards/margins"].get<double>(), first["eval_rewards/margins"].get<double>());
      EXPECT_TRUE(last.contains("eval_logps/chosen") && last.contains("eval_logps/rejected"));
    }
    const auto steps = records(o.output_dir, "step");
    ASSERT_EQ(steps.size(), 16u);
    EXPECT_TRUE(steps.back().contains("rewards/chosen")) << steps.back().dump();
    EXPECT_TRUE(steps.back().contains("rewards/accuracies")) << steps.back().dump();
    EXPECT_EQ(s.history.back().metrics.empty(), false);
    EXPECT_EQ(s.method, train_method_name(m));
    EXPECT_TRUE(s.final_eval_metrics.contains("eval_rewards/accuracies")) << s.final_eval_metrics.dump();
    EXPECT_TRUE(s.initial_eval_metrics.contains("eval_rewards/accuracies")) << s.initial_eval_metrics.dump();
  }
}

TEST(PreferenceTrainer, AdapterOffAndPrecomputedReferencesGiveTheSameRun) {
  for (TrainMethod m : {TrainMethod::Dpo, TrainMethod::Kto}) {
    SCOPED_TRACE(train_method_name(m));
    test::TempDir a_dir, b_dir;
    TrainOptions a = base(a_dir.path, m), b = base(b_dir.path, m);
    a.steps = b.steps = 6;
    a.pref.reference = ReferenceSource::AdapterOff;
    b.pref.reference = ReferenceSource::Precomputed;
    const TrainSummary sa = Trainer(a).run(), sb = Trainer(b).run();
    ASSERT_EQ(sa.history.size(), sb.history.size());
    for (size_t i = 0; i < sa.history.size(); ++i)
      EXPECT_NEAR(sa.history[i].loss, sb.history[i].loss, 1e-5 * std::max(1.0, std::fabs(sa.history[i].loss)))
          << "step " << i + 1;
    ASSERT_TRUE(sa.final_eval_loss && sb.final_eval_loss);
    EXPECT_NEAR(*sa.final_eval_loss, *sb.final_eval_loss, 1e-5);
    EXPECT_TRUE(fs::exists(b.output_dir + "/checkpoints/checkpoint-6/reference_logps.safetensors"));
    EXPECT_FALSE(fs::exists(a.output_dir + "/checkpoints/checkpoint-6/reference_logps.safetensors"));
  }
}

TEST(PreferenceTrainer, OomRecoveryKeepsPairsSamplesAndLosses) {
  test::TempDir a_dir, b_dir;
  TrainOptions a = base(a_dir.path, TrainMethod::Dpo), b = base(b_dir.path, TrainMethod::Dpo);
  a.steps = b.steps = 5;
  b.fault_oom_step = 2;
  b.fault_oom_repeat = 3;  // checkpointing on, then 4 -> 2 -> 1 pairs per micro-batch
  const TrainSummary sa = Trainer(a).run(), sb = Trainer(b).run();
  EXPECT_EQ(sb.oom_recoveries, 3);
  EXPECT_EQ(sb.micro_batch_size, 1);  // one pair: its two sequences together
  ASSERT_EQ(sa.history.size(), sb.history.size());
  for (size_t i = 0; i < sa.history.size(); ++i) {
    EXPECT_EQ(sa.history[i].sample_ids, sb.history[i].sample_ids) << "step " << i + 1;
    EXPECT_NEAR(sa.history[i].loss, sb.history[i].loss, 1e-5 * std::max(1.0, std::fabs(sa.history[i].loss)))
        << "step " << i + 1;
  }
}

TEST(PreferenceTrainer, APairThatDoesNotFitAloneIsNamedWithItsRowAndSizes) {
  test::TempDir dir;
  TrainOptions o = base(dir.path, TrainMethod::Dpo);
  o.steps = 3;
  o.fault_oom_step = 1;
  o.fault_oom_repeat = 1000;  // every attempt of step 2 runs out of memory, at one pair too
  try {
    Trainer(o).run();
    FAIL() << "the run went on";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_OOM_RECOVERY_EXHAUSTED) << e.what();
    EXPECT_NE(std::string(e.what()).find("line "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rejected"), std::string::npos) << e.what();
  }
}

TEST(PreferenceTrainer, NanStepIsSkipped) {
  test::TempDir dir;
  TrainOptions o = base(dir.path, TrainMethod::Orpo);
  o.steps = 5;
  o.fault_nan_steps = {3};
  const TrainSummary s = Trainer(o).run();
  EXPECT_EQ(s.steps_done, 5);
  EXPECT_EQ(s.skipped_steps, 1);
  EXPECT_TRUE(s.history[2].skipped);
}

// kill -9 is tests/cli's business; here an interrupt after step 3 and --resume: the final
// adapter is the uninterrupted run's, bit for bit, and the precomputed reference comes back from
// the checkpoint (full fine-tuning, where no adapter could be switched off to recompute it).
TEST(PreferenceTrainer, ResumeIsBitIdenticalAndReadsTheReferenceBack) {
  for (TrainMode mode : {TrainMode::Lora, TrainMode::Full}) {
    SCOPED_TRACE(mode == TrainMode::Lora ? "lora" : "full");
    test::TempDir a_dir, b_dir;
    TrainOptions straight = base(a_dir.path, TrainMethod::Dpo);
    straight.mode = mode;
    straight.lr = mode == TrainMode::Full ? 1e-3 : 1e-2;
    straight.pref.reference = ReferenceSource::Precomputed;
    straight.steps = 6;
    Trainer(straight).run();
    TrainOptions first = straight;
    first.output_dir = b_dir.path + "/run";
    first.save_every = 3;
    first.stop_after_step_for_tests = 3;
    EXPECT_THROW(Trainer(first).run(), Error);
    TrainOptions resumed = straight;
    resumed.output_dir = first.output_dir;
    resumed.resume = "latest";
    Trainer(resumed).run();
    auto a = SafetensorsReader::open_file(straight.output_dir + "/checkpoints/checkpoint-6/trainable.safetensors");
    auto b = SafetensorsReader::open_file(resumed.output_dir + "/checkpoints/checkpoint-6/trainable.safetensors");
    ASSERT_EQ(a.names(), b.names());
    for (const auto& n : a.names()) {
      Tensor ta = a.read(n), tb = b.read(n);
      ASSERT_EQ(ta.nbytes(), tb.nbytes());
      EXPECT_EQ(std::memcmp(ta.raw(), tb.raw(), ta.nbytes()), 0) << n << " differs after resume";
    }
    // The resumed run did not compute the reference again: its log says so only once, in the first part.
    int computed = 0;
    for (const auto& e : records(first.output_dir, "event"))
      computed += e["message"].get<std::string>().find("reference log-probabilities") != std::string::npos;
    EXPECT_EQ(computed, 1);
  }
}

TEST(PreferenceTrainer, AKtoFileForAPairMethodIsRefused) {
  test::TempDir dir;
  TrainOptions o = base(dir.path, TrainMethod::Dpo);
  o.data_path = write_pairs(dir.path + "/kto.jsonl", 8, 0, true);
  try {
    Trainer(o).run();
    FAIL() << "a KTO file trained with --method dpo";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_DATASET_WRONG_SHAPE) << e.what();
    EXPECT_NE(std::string(e.what()).find("--method kto"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bp
