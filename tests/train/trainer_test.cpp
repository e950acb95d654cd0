// End-to-end tests of the training loop on the real stories260K model (tiny: runs in a second).
// Failure paths are made to happen: injected OOM, injected NaN, a throw inside evaluation.
#include "train/trainer.h"

#include <filesystem>
#include <fstream>

#include "core/allocator.h"
#include "core/device_info.h"
#include "io/safetensors.h"
#include "model/loader.h"
#include "model/merge.h"
#include "support/test_util.h"
#include "text/tokenizer.h"
#include "train/train_data.h"
#include "train/train_plan.h"

namespace bp {

namespace fs = std::filesystem;

static std::string model_dir() {
  return test::shared_dir() + "/models/stories260K";
}

// A small text dataset whose sentences the model can learn quickly.
static std::string write_dataset(const std::string& dir, int rows = 24) {
  std::string path = dir + "/data.jsonl";
  std::ofstream f(path);
  const char* names[] = {"Lily", "Tom", "Ben", "Sue", "Max", "Mia"};
  const char* things[] = {"a red ball", "a big dog", "a small cat", "a blue car"};
  for (int i = 0; i < rows; ++i)
    f << "{\"text\": \"" << names[i % 6] << " had " << things[i % 4] << ". " << names[(i + 1) % 6]
      << " liked it very much.\"}\n";
  return path;
}

static TrainOptions base_options(const std::string& dir) {
  TrainOptions o;
  o.model_dir = model_dir();
  o.device = "cpu";  // compared with CPU/torch references: on a machine with a GPU too (tests/cuda train there)
  o.data_path = write_dataset(dir);
  o.output_dir = dir + "/run";
  o.steps = 6;
  o.batch_size = 4;
  o.micro_batch_size = 4;
  o.lr = 5e-3;
  o.warmup_steps = 0;
  o.lr_scheduler = LrScheduler::Constant;
  o.max_seq_length = 64;
  o.holdout = 0.25;
  o.lora.r = 4;
  o.lora.alpha = 8;
  o.lora.dropout = 0.0f;
  o.lora.target_modules = {"all-linear"};
  o.threads = 1;
  o.quiet = true;
  return o;
}

TEST(Trainer, LoraRunLearnsAndWritesOutputs) {
  test::TempDir tmp;
  TrainOptions o = base_options(tmp.path);
  o.steps = 12;
  Trainer t(o);
  TrainSummary s = t.run();
  EXPECT_EQ(s.steps_done, 12);
  ASSERT_TRUE(s.initial_eval_loss && s.final_eval_loss);
  EXPECT_LT(*s.final_eval_loss, *s.initial_eval_loss) << "held-out loss must fall";
  EXPECT_LT(s.history.back().loss, s.history.front().loss);
  EXPECT_TRUE(fs::exists(o.output_dir + "/adapter/adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(o.output_dir + "/adapter/adapter_config.json"));
  EXPECT_TRUE(fs::exists(o.output_dir + "/summary.json"));
  EXPECT_TRUE(fs::exists(o.output_dir + "/metrics.jsonl"));
  EXPECT_TRUE(fs::exists(o.output_dir + "/checkpoints/checkpoint-12/manifest.json"));
  EXPECT_GT(s.peak_memory_bytes, 0u);
  EXPECT_EQ(s.oom_recoveries, 0);
}

// An OOM in the middle of training is recovered: same steps, same samples in the same order,
// and the same losses as an uninterrupted run with the same effective batch.
TEST(Trainer, OomRecoveryKeepsStepsSamplesAndLosses) {
  test::TempDir a_dir, b_dir;
  TrainOptions a = base_options(a_dir.path);
  TrainOptions b = base_options(b_dir.path);
  b.fault_oom_step = 2;    // the third step's first micro-batch runs out of memory
  b.fault_oom_repeat = 3;  // three times: checkpointing on (auto had it off), then 4 -> 2 -> 1 sequences
  TrainSummary sa = Trainer(a).run();
  TrainSummary sb = Trainer(b).run();
  EXPECT_FALSE(sa.gradient_checkpointing) << "auto: a tiny model's activations fit";
  EXPECT_TRUE(sb.gradient_checkpointing) << "the first OOM turns checkpointing on";
  EXPECT_EQ(sb.oom_recoveries, 3);
  EXPECT_EQ(sb.micro_batch_size, 1);
  EXPECT_EQ(sb.grad_accum, 4);
  ASSERT_EQ(sa.history.size(), sb.history.size());
  for (size_t i = 0; i < sa.history.size(); ++i) {
    EXPECT_EQ(sa.history[i].sample_ids, sb.history[i].sample_ids) << "step " << i + 1;
    EXPECT_NEAR(sa.history[i].loss, sb.history[i].loss, 1e-5 * std::max(1.0, std::fabs(sa.history[i].loss)))
        << "step " << i + 1;
  }
}

TEST(Trainer, NanStepIsSkippedAndRunContinues) {
  test::TempDir tmp;
  TrainOptions o = base_options(tmp.path);
  o.fault_nan_steps = {3};
  TrainSummary s = Trainer(o).run();
  EXPECT_EQ(s.steps_done, 6);
  EXPECT_EQ(s.skipped_steps, 1);
  EXPECT_TRUE(s.history[2].skipped);
  EXPECT_FALSE(s.history[3].skipped);
  std::ifstream m(o.output_dir + "/metrics.jsonl");
  std::string all((std::istreambuf_iterator<char>(m)), {});
  EXPECT_NE(all.find("\"type\":\"nonfinite\""), std::string::npos);
  EXPECT_NE(all.find("dataset_rows"), std::string::npos);
}

TEST(Trainer, ConsecutiveNanStopsWithTrainingFailed) {
  test::TempDir tmp;
  TrainOptions o = base_options(tmp.path);
  o.fault_nan_steps = {2, 3, 4};
  try {
    Trainer(o).run();
    FAIL() << "expected RUNTIME_TRAINING_FAILED";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_TRAINING_FAILED) << e.what();
    EXPECT_NE(std::string(e.what()).find("3 consecutive"), std::string::npos) << e.what();
    EXPECT_NE(e.suggestion().find("Lower the learning rate"), std::string::npos);
  }
}

TEST(Trainer, EvaluationRestoresTrainingModeWhenItThrows) {
  test::TempDir tmp;
  TrainOptions o = base_options(tmp.path);
  o.eval_every = 2;
  o.fault_eval_throw_at = 2;
  Trainer t(o);
  EXPECT_THROW(t.run(), Error);
  EXPECT_TRUE(t.model().training());
}

// A run stopped at step 3 and resumed ends with the bits of the run that never stopped (`lora`
// adjusts the LoRA settings of both; `model`: another model folder than stories260K).
static void expect_resume_bit_identical(void (*lora)(LoraConfig&), const std::string& model = "") {
  test::TempDir a_dir, b_dir;
  TrainOptions straight = base_options(a_dir.path);
  straight.steps = 6;
  if (!model.empty()) straight.model_dir = model;
  lora(straight.lora);
  Trainer(straight).run();

  TrainOptions first = base_options(b_dir.path);
  if (!model.empty()) first.model_dir = model;
  first.steps = 6;
  first.save_every = 3;
  first.fault_eval_throw_at = -1;
  lora(first.lora);
  // Stop after step 3 as an interrupt would: a checkpoint exists at 3.
  first.stop_after_step_for_tests = 3;
  EXPECT_THROW(Trainer(first).run(), Error);
  TrainOptions resumed = base_options(b_dir.path);
  resumed.steps = 6;
  resumed.resume = "latest";
  if (!model.empty()) resumed.model_dir = model;
  lora(resumed.lora);
  TrainSummary s = Trainer(resumed).run();
  EXPECT_EQ(s.steps_done, 6);
  auto a = SafetensorsReader::open_file(straight.output_dir + "/checkpoints/checkpoint-6/trainable.safetensors");
  auto b = SafetensorsReader::open_file(resumed.output_dir + "/checkpoints/checkpoint-6/trainable.safetensors");
  ASSERT_EQ(a.names(), b.names());
  for (const auto& n : a.names()) {
    Tensor ta = a.read(n), tb = b.read(n);
    ASSERT_EQ(ta.nbytes(), tb.nbytes());
    EXPECT_EQ(std::memcmp(ta.raw(), tb.raw(), ta.nbytes()), 0) << n << " differs after resume";
  }
}

TEST(Trainer, ResumeContinuesBitIdentically) {
  expect_resume_bit_identical([](LoraConfig&) {});
}

// DoRA's magnitudes are trainable parameters of the checkpoint (with dropout too: the masks come
// from the step's seed); PiSSA's A0, B0 and residual base are remade from the reloaded base by the
// same SVD before the checkpoint's A and B are restored, the fast SVD (pissa_niter_N) from the run's
// seed.
TEST(Trainer, DoraAndPissaResumeBitIdentically) {
  expect_resume_bit_identical([](LoraConfig& l) { l.use_dora = true; });
  expect_resume_bit_identical([](LoraConfig& l) { l.use_dora = true, l.dropout = 0.1f; });
  expect_resume_bit_identical([](LoraConfig& l) { l.init_lora_weights = "pissa"; });
  expect_resume_bit_identical([](LoraConfig& l) { l.init_lora_weights = "pissa_niter_2"; });
}

// The same on Phi-3's fused modules (a tiny random one with stories260K's tokenizer): DoRA's one
// magnitude per fused module is a checkpointed parameter, PiSSA's SVD of each fused weight and its
// residual are redone from the reloaded base.
TEST(Trainer, Phi3FusedDoraAndPissaResumeBitIdentically) {
  test::TempDir m;
  const nlohmann::json j = {{"architectures", {"Phi3ForCausalLM"}},
                            {"vocab_size", 512},
                            {"hidden_size", 32},
                            {"intermediate_size", 48},
                            {"num_hidden_layers", 2},
                            {"num_attention_heads", 4},
                            {"num_key_value_heads", 2},
                            {"max_position_embeddings", 256},
                            {"initializer_range", 0.1},
                            {"torch_dtype", "float32"}};
  SaveModelOptions so;
  so.copy_files_from = model_dir();
  save_hf_model(init_random_weights(ModelConfig::from_json(j, "tiny phi3"), 3), m.path + "/phi3", so);
  expect_resume_bit_identical([](LoraConfig& l) { l.use_dora = true, l.dropout = 0.1f; }, m.path + "/phi3");
  expect_resume_bit_identical([](LoraConfig& l) { l.init_lora_weights = "pissa"; }, m.path + "/phi3");
}

// Full fine-tuning with --matmul-dtype bf16 on the CPU (for comparison with a card; slower here):
// the GEMMs read bf16 copies of the f32 masters. Every update rewrites the copies (AdamW writes
// them beside the masters), so the run learns as the f32 run does (copies left at the initial weights would leave the
// projections where they started), and a resumed run remakes them from the restored masters: bit for bit the run that
// never stopped.
TEST(Trainer, FullFineTuningThroughBf16GemmCopies) {
  test::TempDir f_dir, b_dir, r_dir;
  auto full = [](const std::string& dir, const std::string& matmul) {
    TrainOptions o = base_options(dir);
    o.mode = TrainMode::Full;
    o.matmul_dtype = matmul;
    o.lr = 2e-3;
    o.holdout = 0.0;
    return o;
  };
  const TrainSummary f32 = Trainer(full(f_dir.path, "auto")).run();
  const TrainOptions bo = full(b_dir.path, "bf16");
  const TrainSummary bf16 = Trainer(bo).run();
  EXPECT_EQ(f32.matmul_dtype, "f32") << "auto on the CPU";
  EXPECT_EQ(bf16.matmul_dtype, "bf16");
  ASSERT_EQ(bf16.history.size(), f32.history.size());
  const double first = f32.history.front().loss;
  EXPECT_NE(bf16.history.front().loss, first) << "the GEMMs did not read rounded weights";
  EXPECT_NEAR(bf16.history.front().loss, first, first / 128);
  const double drop_f32 = first - f32.history.back().loss,
               drop_bf16 = bf16.history.front().loss - bf16.history.back().loss;
  EXPECT_GT(drop_f32, 0.2 * first) << "the f32 run must learn for the comparison to mean anything";
  EXPECT_GT(drop_bf16, 0.8 * drop_f32) << "the bf16 run does not learn like the f32 one: stale GEMM copies?";
  for (size_t i = 0; i < f32.history.size(); ++i)
    EXPECT_NEAR(bf16.history[i].loss, f32.history[i].loss, 0.05 * f32.history[i].loss) << "step " << i + 1;

  TrainOptions first_part = full(r_dir.path, "bf16");
  first_part.stop_after_step_for_tests = 3;
  EXPECT_THROW(Trainer(first_part).run(), Error);
  TrainOptions resumed = full(r_dir.path, "bf16");
  resumed.resume = "latest";
  const TrainSummary rest = Trainer(resumed).run();
  ASSERT_EQ(rest.history.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(rest.history[i].loss, bf16.history[i + 3].loss) << "step " << i + 4 << " after the resume";
}

// Gradient checkpointing "auto": off when the chosen micro-batch fits without it, on when only
// checkpointing makes it fit; an explicit setting is kept.
TEST(Trainer, AutoCheckpointingFollowsTheMemoryPlan) {
  test::TempDir tmp;
  TrainOptions o = base_options(tmp.path);
  auto tok = Tokenizer::from_dir(model_dir());
  TrainData data = build_train_data(o, *tok);
  Model model(load_model(model_dir()), ModelOptions{});
  Allocator& alloc = cpu_allocator();
  EXPECT_FALSE(plan_training(o, model, data, alloc).gradient_checkpointing) << "auto with plenty of memory";
  o.gradient_checkpointing = true;
  TrainPlan on = plan_training(o, model, data, alloc);
  EXPECT_TRUE(on.gradient_checkpointing);
  o.gradient_checkpointing = false;
  TrainPlan off = plan_training(o, model, data, alloc);
  EXPECT_FALSE(off.gradient_checkpointing);
  ASSERT_EQ(on.micro_batch_size, 4);
  ASSERT_EQ(off.micro_batch_size, 4);
  ASSERT_LT(on.plan.total(), off.plan.total());
  o.gradient_checkpointing.reset();
  alloc.set_limit((on.plan.total() + off.plan.total()) / 2);  // fits with checkpointing only
  TrainPlan mid = plan_training(o, model, data, alloc);
  alloc.set_limit(kNoLimit);
  EXPECT_TRUE(mid.gradient_checkpointing);
  EXPECT_EQ(mid.micro_batch_size, 4);
  EXPECT_NE(mid.description.find("gradient checkpointing on (auto: without it"), std::string::npos) << mid.description;
}

// Bad rows are skipped, up to --max-errors of them; more stop the run before training.
TEST(Trainer, TooManyBadRowsStopTheRun) {
  test::TempDir tmp;
  TrainOptions o = base_options(tmp.path);
  std::ofstream(o.data_path, std::ios::app) << "not json\n{\"nope\": 1}\n[1, 2\n";
  o.max_bad_rows = 3;
  EXPECT_EQ(Trainer(o).run().steps_done, 6) << "3 bad rows are within the limit";
  test::TempDir tmp2;
  TrainOptions p = base_options(tmp2.path);
  std::ofstream(p.data_path, std::ios::app) << "not json\n{\"nope\": 1}\n[1, 2\n";
  p.max_bad_rows = 2;
  try {
    Trainer(p).run();
    FAIL() << "3 bad rows with --max-errors 2 must stop the run";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_DATASET_INVALID) << e.what();
    EXPECT_NE(std::string(e.what()).find("3 of 27 rows"), std::string::npos) << e.what();
  }
}

// A sample longer than the model's context (stories260K: 512 positions) is trained with a warning
// that says so and how to cut it; cut at the context, no warning.
TEST(Trainer, SamplesBeyondTheModelsContextAreWarnedAbout) {
  for (int64_t max_seq : {1024, 512}) {
    SCOPED_TRACE(max_seq);
    test::TempDir tmp;
    TrainOptions o = base_options(tmp.path);
    std::string long_text;
    for (int i = 0; i < 120; ++i) long_text += "Lily had a red ball. ";  // ~700 tokens
    std::ofstream(o.data_path, std::ios::app) << "{\"text\": \"" << long_text << "\"}\n";
    o.max_seq_length = max_seq;
    o.steps = 1;
    o.holdout = 0.0;
    o.shuffle = false;
    std::vector<std::string> warnings;
    TrainCallbacks cb;
    cb.on_event = [&](const std::string& level, const std::string& m) {
      if (level == "warn") warnings.push_back(m);
    };
    EXPECT_EQ(Trainer(o, cb).run().steps_done, 1);
    bool said = false;
    for (const auto& w : warnings)
      said = said || (w.find("more than the model's context of 512") != std::string::npos &&
                      w.find("--max-seq-length 512") != std::string::npos);
    EXPECT_EQ(said, max_seq > 512) << ::testing::PrintToString(warnings);
  }
}

// --no-shuffle takes the samples in file order; the default order is a seeded permutation.
TEST(Trainer, ShuffleOffTakesSamplesInOrder) {
  test::TempDir a_dir, b_dir;
  TrainOptions a = base_options(a_dir.path);
  a.steps = 2;
  a.shuffle = false;
  TrainSummary sa = Trainer(a).run();
  ASSERT_EQ(sa.history.size(), 2u);
  EXPECT_EQ(sa.history[0].sample_ids, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(sa.history[1].sample_ids, (std::vector<int64_t>{4, 5, 6, 7}));
  TrainOptions b = base_options(b_dir.path);
  b.steps = 2;
  TrainSummary sb = Trainer(b).run();
  EXPECT_NE(sb.history[0].sample_ids, sa.history[0].sample_ids) << "the default shuffles";
}

// Without a usable CUDA device (no CUDA backend, no card), asking for CUDA stops before any work,
// with the reason. (Training on the device: tests/cuda/trainer_cuda_test.cpp, simulated card.)
TEST(Trainer, CudaDeviceIsRefusedWithTheReason) {
  const CudaStatus cs = cuda_status();
  if (cs.usable()) GTEST_SKIP() << "a usable CUDA device exists here";
  test::TempDir tmp;
  TrainOptions o = base_options(tmp.path);
  o.device = "cuda:0";
  try {
    Trainer(o).run();
    FAIL() << "--device cuda must not quietly train on the CPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_GPU_NOT_AVAILABLE) << e.what();
    EXPECT_NE(std::string(e.what()).find("--device cuda:0"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(o.output_dir + "/summary.json"));
  o.device = "cpu";
  EXPECT_EQ(Trainer(o).run().steps_done, 6);
}

TEST(Trainer, MemoryLimitTooSmallFailsBeforeTrainingWithBreakdown) {
  test::TempDir tmp;
  TrainOptions o = base_options(tmp.path);
  o.max_memory_bytes = 1 << 20;  // 1 MiB: the weights alone need more
  try {
    Trainer(o).run();
    FAIL();
  } catch (const Error& e) {
    // A CPU run: the CPU's code, the real numbers, and advice for host memory that names no GPU.
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_CPU_OOM) << e.what();
    EXPECT_TRUE(e.details().contains("plan")) << e.details().dump();
    const std::string what = e.what(), advice = e.suggestion();
    EXPECT_NE(what.find("the CPU memory limit is 1.00 MiB"), std::string::npos) << what;
    EXPECT_NE(advice.find("--max-memory"), std::string::npos) << advice;
    EXPECT_NE(advice.find("--base-dtype q8_0 or q4_k"), std::string::npos) << advice;
    for (const std::string& text : {what, advice, std::string(error_info(e.code()).suggestion)}) {
      EXPECT_EQ(text.find("GPU"), std::string::npos) << text;
      EXPECT_EQ(text.find("card"), std::string::npos) << text;
    }
  }
  cpu_allocator().set_limit(kNoLimit);
}

}  // namespace bp
