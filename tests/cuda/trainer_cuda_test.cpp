// The Trainer (src/train/) with --device cuda on the simulated card (sim_device.h): the model's
// weights, the LoRA adapter, gradients, AdamW state and activations live in the card's memory; the
// batches, clipping, the non-finite check and the optimizer run as simulated CUDA kernels through
// the ops; checkpoints and the adapter are written from host copies and a resume copies them back.
// Compared with the same run on the CPU backend (tiny-chat, LoRA on every projection, dropout on,
// gradient accumulation, evaluation), and made to fail: an OOM injected into the card's allocator
// in the middle of training is recovered as on the CPU (checkpointing on first, then the
// micro-batch halved), and a card too small for the run's micro-batch makes the trainer shrink it.
// Frozen bases held quantized (--base-dtype q8_0, q4_k and its q5_0 fallback, GGUF bases in their
// stored types) stay quantized on the card, are dequantized by its kernels (backend/cuda/
// dequant.cuh) and train like on the CPU.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>

#include "backend/cuda/device_workspace.h"
#include "backend/cuda/sim/cuda_sim.h"
#include "backend/cuda/sim/gemm_sim.h"
#include "core/device_info.h"
#include "export/gguf_export.h"
#include "hub/gguf_source.h"
#include "io/safetensors.h"
#include "model/held_weights.h"
#include "model/loader.h"
#include "model/merge.h"
#include "sim_device.h"
#include "support/shaped_config.h"
#include "support/test_util.h"
#include "train/trainer.h"

namespace bp::test {
namespace {

constexpr Device kGpu{DeviceType::CUDA, 0};

std::string write_dataset(const std::string& dir) {
  const std::string path = dir + "/data.jsonl";
  std::ofstream f(path);
  const char* names[] = {"Lily", "Tom", "Ben", "Sue", "Max", "Mia"};
  const char* things[] = {"a red ball", "a big dog", "a small cat", "a blue car"};
  for (int i = 0; i < 10; ++i)
    f << "{\"text\": \"" << names[i % 6] << " had " << things[i % 4] << ". " << names[(i + 1) % 6] << " liked it.\"}\n";
  return path;
}

TrainOptions tiny_chat_options(const std::string& dir, const std::string& device) {
  TrainOptions o;
  o.model_dir = source_dir() + "/models/tiny-chat";
  o.data_path = write_dataset(dir);
  o.output_dir = dir + "/run";
  o.device = device;
  o.steps = 3;
  o.batch_size = 4;
  o.micro_batch_size = 2;  // two micro-batches per step: gradient accumulation on the device
  o.lr = 5e-3;
  o.warmup_steps = 0;
  o.lr_scheduler = LrScheduler::Constant;
  o.max_seq_length = 32;
  o.holdout = 0.2;        // two held-out samples: the evaluations run on the device too
  o.max_grad_norm = 0.5;  // small enough that clipping scales the gradients
  o.lora.r = 4;
  o.lora.alpha = 8;
  o.lora.dropout = 0.1f;
  o.lora.target_modules = {"all-linear"};
  o.gradient_checkpointing = true;
  o.threads = 1;
  o.quiet = true;
  return o;
}

// Relative tolerances of the device's losses and gradient norms against the CPU's.
struct RunTolerance {
  double loss = 1e-5, grad_norm = 1e-4;  // f32 activations and weights: f32 sums in another order
};
// Frozen weights held narrower than f32 (bf16, f16, block types): the device's GEMMs against them
// take bf16 inputs (kernel_wrappers.h): the activation operand is rounded to bf16 and a weight not
// held as bf16 is dequantized to bf16; the CPU multiplies the dequantized weight and the activation
// in f32. u = 2⁻⁹ is bf16's unit roundoff: every product moves by at most 2u, the loss stays within
// u (measured: ≤ 5e-4 relative); the gradients pass through every rounded GEMM above them, forward
// and backward (16u per tensor in norm, tests/cuda/model_cuda_test.cpp) and, from step 2 on, weights
// updated from gradients that already differ: 16u for the global norm (measured: ≤ 1.4e-2 by step 3
// over a q8_0 base).
constexpr RunTolerance kBf16HeldRunTolerance{1.0 / 512, 16.0 / 512};
// The same on a Turing card (compute capability 7.5), whose GEMMs against them take f16 inputs
// (the activation scaled per tensor by a power of two): the same bounds in f16's u = 2⁻¹¹.
constexpr RunTolerance kF16HeldRunTolerance{1.0 / 2048, 16.0 / 2048};

void expect_losses_close(const TrainSummary& got, const TrainSummary& ref, RunTolerance tol = {}) {
  ASSERT_EQ(got.history.size(), ref.history.size());
  for (size_t i = 0; i < ref.history.size(); ++i) {
    EXPECT_EQ(got.history[i].sample_ids, ref.history[i].sample_ids) << "step " << i + 1;
    EXPECT_NEAR(got.history[i].loss, ref.history[i].loss, tol.loss * std::max(1.0, std::fabs(ref.history[i].loss)))
        << "step " << i + 1;
    EXPECT_EQ(got.history[i].skipped, ref.history[i].skipped) << "step " << i + 1;
    if (!ref.history[i].skipped) {  // a skipped step's norm is the non-finite one
      EXPECT_NEAR(got.history[i].grad_norm, ref.history[i].grad_norm, tol.grad_norm * ref.history[i].grad_norm)
          << "step " << i + 1;
    }
  }
}

// The trainer's "training on ..." event: the device and what it computes in.
TrainCallbacks capture_device_event(std::string* line) {
  TrainCallbacks cb;
  cb.on_event = [line](const std::string&, const std::string& message) {
    if (message.rfind("training on ", 0) == 0) *line = message;
  };
  return cb;
}

// The run's last "oom_recovery" record in metrics.jsonl ("" when none).
std::string last_oom_record(const std::string& output_dir) {
  std::ifstream metrics(output_dir + "/metrics.jsonl");
  std::string line, oom_line;
  while (std::getline(metrics, line))
    if (line.find("\"oom_recovery\"") != std::string::npos) oom_line = line;
  return oom_line;
}

std::vector<float> saved_tensor(const std::string& file, const std::string& name) {
  return SafetensorsReader::open_file(file).read(name).to_vector();
}

TEST(CudaTrainer, TinyChatLoraRunMatchesCpu) {
  TempDir cpu_dir, gpu_dir;
  const TrainSummary ref = Trainer(tiny_chat_options(cpu_dir.path, "cpu")).run();

  SimulatedCudaDevice card;
  const uint64_t launches_before = sim::launch_count();
  const TrainOptions go = tiny_chat_options(gpu_dir.path, "cuda");
  std::string device_line;
  Trainer trainer(go, capture_device_event(&device_line));
  const TrainSummary got = trainer.run();
  // tiny-chat is stored in f32 and held so: every GEMM is an f32 one, and the event says so.
  EXPECT_NE(device_line.find("CUDA device 0 (GEMMs against f32 weights"), std::string::npos) << device_line;
  EXPECT_EQ(device_line.find("bf16 inputs"), std::string::npos) << device_line;
  EXPECT_NE(device_line.find("activations, gradients and optimizer state stored f32"), std::string::npos);
  EXPECT_EQ(trainer.model().device(), kGpu);
  EXPECT_EQ(trainer.adapter()->layers[0].a(LoraTarget::Q).device(), kGpu);
  EXPECT_GT(sim::launch_count(), launches_before + 1000);  // the simulated kernels did the work
  EXPECT_GT(got.peak_memory_bytes, 0u);
  EXPECT_EQ(got.peak_memory_bytes, card.allocator().stats().bytes_peak) << "the card's allocator was the run's";

  ASSERT_EQ(got.steps_done, 3);
  expect_losses_close(got, ref, kBf16HeldRunTolerance);
  ASSERT_TRUE(got.final_eval_loss && ref.final_eval_loss);
  EXPECT_NEAR(*got.final_eval_loss, *ref.final_eval_loss, kBf16HeldRunTolerance.loss * *ref.final_eval_loss);
  EXPECT_LT(got.history.back().loss, got.history.front().loss) << "the device run learns";

  // The adapter written from the device equals the CPU's (f32 sums in another order).
  const std::string name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight";
  const auto b_gpu = saved_tensor(go.output_dir + "/adapter/adapter_model.safetensors", name);
  const auto b_cpu = saved_tensor(cpu_dir.path + "/run/adapter/adapter_model.safetensors", name);
  double scale = 0;
  for (float v : b_cpu) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  ASSERT_GT(scale, 0.0) << "lora_B never moved: the comparison would prove nothing";
  EXPECT_TRUE(all_close(b_gpu, b_cpu, Tolerance{1e-4 * scale, 0}));
}

// Full fine-tuning on the card: every weight and its gradient on the device, the saved model
// written from host copies; losses and the saved weights agree with the CPU run.
TEST(CudaTrainer, FullFineTuningMatchesCpu) {
  TempDir cpu_dir, gpu_dir;
  TrainOptions co = tiny_chat_options(cpu_dir.path, "cpu");
  co.mode = TrainMode::Full;
  co.steps = 2;
  co.holdout = 0.0;
  co.lr = 1e-3;
  TrainOptions go = co;
  go.output_dir = gpu_dir.path + "/run";
  go.device = "cuda";
  const TrainSummary ref = Trainer(co).run();
  SimulatedCudaDevice card;
  Trainer trainer(go);
  const TrainSummary got = trainer.run();
  EXPECT_EQ(trainer.model().device(), kGpu);
  EXPECT_EQ(trainer.model().grads().embed.device(), kGpu) << "gradients beside the weights";
  expect_losses_close(got, ref);
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  const auto w_gpu = saved_tensor(go.output_dir + "/model/model.safetensors", name);
  const auto w_cpu = saved_tensor(co.output_dir + "/model/model.safetensors", name);
  const auto w_base = saved_tensor(co.model_dir + "/model.safetensors", name);
  EXPECT_FALSE(all_close(w_cpu, w_base, Tolerance{1e-7, 0})) << "the CPU run changed the weight";
  EXPECT_TRUE(all_close(w_gpu, w_cpu, Tolerance{1e-5, 1e-4}));
}

// A checkpoint written from the device (host copies) and resumed on the device (copied back)
// continues to the same losses and the same weights, bit for bit, as the run that never stopped.
TEST(CudaTrainer, CheckpointFromTheDeviceResumesBitExact) {
  SimulatedCudaDevice card;
  TempDir a_dir, b_dir;
  TrainOptions straight = tiny_chat_options(a_dir.path, "cuda");
  straight.holdout = 0.0;  // no evaluation: only the training steps matter here
  straight.steps = 2;
  const TrainSummary full = Trainer(straight).run();

  TrainOptions first = straight;
  first.output_dir = b_dir.path + "/run";
  first.stop_after_step_for_tests = 1;  // stops as an interrupt would, checkpoint at step 1
  EXPECT_THROW(Trainer(first).run(), Error);
  TrainOptions resumed = straight;
  resumed.output_dir = first.output_dir;
  resumed.resume = "latest";
  const TrainSummary rest = Trainer(resumed).run();
  ASSERT_EQ(rest.steps_done, 2);
  ASSERT_EQ(rest.history.size(), 1u);  // step 2, trained after the resume
  EXPECT_EQ(rest.history[0].loss, full.history[1].loss);
  EXPECT_EQ(rest.history[0].grad_norm, full.history[1].grad_norm);
  // The weights after step 2 (the update used the AdamW moments the checkpoint carried).
  auto a = SafetensorsReader::open_file(straight.output_dir + "/checkpoints/checkpoint-2/trainable.safetensors");
  auto b = SafetensorsReader::open_file(resumed.output_dir + "/checkpoints/checkpoint-2/trainable.safetensors");
  ASSERT_EQ(a.names(), b.names());
  for (const auto& n : a.names()) {
    Tensor ta = a.read(n), tb = b.read(n);
    ASSERT_EQ(ta.nbytes(), tb.nbytes());
    EXPECT_EQ(std::memcmp(ta.raw(), tb.raw(), ta.nbytes()), 0) << n << " differs after resume";
  }
}

// Frozen weights held as bf16 on the card, a NaN gradient at step 1 (the non-finite check skips the
// update, as on the CPU) and an OOM of the card's allocator at step 3, twice: as on the CPU
// (tests/train/trainer_test.cpp)
// the first turns gradient checkpointing on (auto had it off), the second halves the micro-batch
// (2 -> 1, accumulation 4), and the losses stay those of the run without OOM (on the CPU: the
// device's agree with them, first test; here within kBf16HeldRunTolerance, the device's GEMMs
// against the bf16 weights having bf16 inputs). Dropout off: its masks are seeded per micro-batch,
// so another split would draw others (on the CPU too).
TEST(CudaTrainer, OomOnTheCardIsRecoveredAsOnTheCpu) {
  TempDir a_dir, b_dir;
  TrainOptions a = tiny_chat_options(a_dir.path, "cpu");
  a.gradient_checkpointing.reset();  // auto
  a.lora.dropout = 0.0f;
  a.holdout = 0.0;
  a.base_dtype = "bf16";
  a.fault_nan_steps = {1};
  TrainOptions b = a;
  b.output_dir = b_dir.path + "/run";
  b.device = "cuda";
  b.fault_oom_step = 2;
  b.fault_oom_repeat = 2;
  const TrainSummary sa = Trainer(a).run();
  SimulatedCudaDevice card;
  const uint64_t ooms_before = card.allocator().stats().num_ooms;
  std::string device_line;
  const TrainSummary sb = Trainer(b, capture_device_event(&device_line)).run();
  EXPECT_NE(device_line.find("GEMMs against frozen weights (bf16 as stored"), std::string::npos) << device_line;
  EXPECT_NE(device_line.find("bf16 inputs, f32 accumulate"), std::string::npos) << device_line;
  EXPECT_EQ(card.allocator().stats().num_ooms, ooms_before + 2) << "the card's allocator failed twice";
  EXPECT_FALSE(sa.gradient_checkpointing) << "auto: tiny-chat's activations fit";
  EXPECT_TRUE(sb.gradient_checkpointing) << "the first OOM turns checkpointing on";
  EXPECT_EQ(sb.oom_recoveries, 2);
  EXPECT_EQ(sb.micro_batch_size, 1);
  EXPECT_EQ(sb.grad_accum, 4);
  EXPECT_EQ(sb.skipped_steps, 1);
  ASSERT_FALSE(sb.history.empty());
  EXPECT_TRUE(sb.history[0].skipped);
  expect_losses_close(sb, sa, kBf16HeldRunTolerance);
}

// The card's own memory runs out: a card with room for what the run keeps (weights, adapter,
// gradients, AdamW state) and three quarters of what the micro-batch of 4 sequences adds on top.
// The first step's cudaMalloc fails (the allocator empties its cache once, then raises the OOM),
// the trainer halves the micro-batch keeping the effective batch, and the step's loss is the one
// the big card computed with 4 sequences at once. Checkpointing is on, so the halving is the relief.
TEST(CudaTrainer, CardTooSmallForTheMicroBatchIsRecovered) {
  TempDir big_dir, small_dir;
  TrainOptions o = tiny_chat_options(big_dir.path, "cuda");
  o.steps = 1;
  o.micro_batch_size = 4;
  o.holdout = 0.0;
  o.lora.dropout = 0.0f;  // the same loss whatever the split
  size_t resident = 0, peak = 0;
  TrainSummary big;
  {
    SimulatedCudaDevice card;
    Trainer t(o);
    big = t.run();
    resident = card.allocator().stats().bytes_in_use;  // what the live trainer keeps on the card
    peak = big.peak_memory_bytes;
  }
  ASSERT_GT(peak, resident);
  SimulatedCudaDevice card(resident + (peak - resident) * 3 / 4);
  o.output_dir = small_dir.path + "/run";
  const TrainSummary small = Trainer(o).run();
  EXPECT_GE(small.oom_recoveries, 1);
  EXPECT_LT(small.micro_batch_size, 4);
  EXPECT_EQ(small.micro_batch_size * small.grad_accum, 4) << "the effective batch is kept";
  // The recovery's record: the card's OutOfMemoryError, worded like PyTorch's.
  const std::string oom_line = last_oom_record(o.output_dir);
  EXPECT_NE(oom_line.find("RUNTIME_GPU_OOM"), std::string::npos) << oom_line;
  EXPECT_NE(oom_line.find("CUDA device 0 has a total capacity"), std::string::npos) << oom_line;
  ASSERT_EQ(small.history.size(), 1u);
  EXPECT_NEAR(small.history[0].loss, big.history[0].loss, 1e-5 * big.history[0].loss);
  EXPECT_GE(card.allocator().stats().num_ooms, 1u) << "the card's refusal is counted as an OOM";
}

// A run on the card where the launch of the first kernel after step `after_step` reports `error`
// (the simulated runtime's injection: a library or kernel failing as it would on a real card).
// Checkpoints every step. Returns the trainer's error, if any; the summary when it finished.
std::optional<Error> run_with_launch_error(TrainOptions o, int64_t after_step, sim::cudaError_t error,
                                           TrainSummary* summary) {
  o.save_every = 1;
  TrainCallbacks cb;
  cb.on_step = [&](const StepRecord& rec, const TrainSummary&, int64_t) {
    if (rec.step == after_step) sim::inject_launch_error(error);
  };
  try {
    *summary = Trainer(o, cb).run();
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

// "Out of memory" inside a library call on the card (not our allocator: cudaErrorMemoryAllocation
// from a launch, as cuBLAS reports its workspace failing) takes the OOM-adjacent path of the
// recovery: the step is redone with a smaller micro-batch and the run finishes.
TEST(CudaTrainer, LibraryOutOfMemoryIsRecoveredAsOomAdjacent) {
  TempDir dir;
  TrainOptions o = tiny_chat_options(dir.path, "cuda");
  o.holdout = 0.0;
  SimulatedCudaDevice card;
  TrainSummary s;
  const auto err = run_with_launch_error(o, 1, sim::cudaErrorMemoryAllocation, &s);
  ASSERT_FALSE(err.has_value()) << err->what();
  EXPECT_EQ(s.steps_done, 3);
  EXPECT_EQ(s.oom_recoveries, 1);
  EXPECT_EQ(s.micro_batch_size, 1) << "the recovery halved the micro-batch (checkpointing was already on)";
  const std::string oom_line = last_oom_record(o.output_dir);
  EXPECT_NE(oom_line.find("RUNTIME_OOM_ADJACENT"), std::string::npos) << oom_line;
  EXPECT_NE(oom_line.find("cudaErrorMemoryAllocation"), std::string::npos) << oom_line;
}

// A sticky error (illegal address, launch failure) kills the CUDA context: the run stops with
// RUNTIME_GPU_KERNEL_FAULT, the CUDA_LAUNCH_BLOCKING=1 advice and the checkpoint it can continue
// from; status.json records the code. No OOM recovery is attempted.
TEST(CudaTrainer, StickyErrorStopsTheRunNamingTheSavedCheckpoint) {
  for (sim::cudaError_t error : {sim::cudaErrorIllegalAddress, sim::cudaErrorLaunchFailure}) {
    TempDir dir;
    TrainOptions o = tiny_chat_options(dir.path, "cuda");
    o.holdout = 0.0;
    SimulatedCudaDevice card;
    TrainSummary s;
    const auto err = run_with_launch_error(o, 2, error, &s);
    ASSERT_TRUE(err.has_value()) << "the run went on after " << sim::cudaGetErrorName(error);
    const std::string m = err->what();
    EXPECT_EQ(err->code(), ErrorCode::RUNTIME_GPU_KERNEL_FAULT) << m;
    EXPECT_NE(m.find(sim::cudaGetErrorName(error)), std::string::npos) << m;
    EXPECT_NE(m.find("CUDA_LAUNCH_BLOCKING=1"), std::string::npos) << m;
    const std::string ckpt = o.output_dir + "/checkpoints/checkpoint-2";
    EXPECT_TRUE(std::filesystem::is_directory(ckpt));
    EXPECT_NE(m.find("checkpoint-2 (step 2)"), std::string::npos) << m;
    EXPECT_NE(m.find("--resume latest"), std::string::npos) << m;
    std::ifstream status(o.output_dir + "/status.json");
    const std::string st((std::istreambuf_iterator<char>(status)), std::istreambuf_iterator<char>());
    EXPECT_NE(st.find("RUNTIME_GPU_KERNEL_FAULT"), std::string::npos) << st;
    EXPECT_EQ(card.allocator().stats().num_ooms, 0u);
  }
}

// A random model with stories260K's tokenizer whose rows are all whole q4_K blocks (hidden 256,
// k/v 128 x 256, intermediate 512), written as a Hugging Face folder: tiny-chat's 128-wide rows
// would fall back to q5_0.
std::string write_q4k_model(const std::string& dir) {
  const ModelConfig cfg = ModelConfig::from_json(stories_config_shaped(256, 4, 2, 64, 2, 512), "q4k-test");
  SaveModelOptions so;
  so.copy_files_from = shared_dir() + "/models/stories260K";
  save_hf_model(init_random_weights(cfg, 5), dir + "/model", so);
  return dir + "/model";
}

// A LoRA run over a base held as `base_dtype` on the card against the same run on the CPU: the
// frozen weights stay in their type in the card's memory (no f32 copy; the memory plan counts
// those bytes: plan_training reads resident_weight_bytes), every one is read by the device's
// dequantization kernels, and losses, gradient norms and the evaluation agree with the CPU's
// within kBf16HeldRunTolerance (the device's GEMMs against them are bf16 ones).
void expect_quantized_base_matches_cpu(TrainOptions o, DType held) {
  SCOPED_TRACE(o.base_dtype);
  const TrainSummary ref = Trainer(o).run();
  TrainOptions go = o;
  go.output_dir += "-cuda";
  go.device = "cuda";
  SimulatedCudaDevice card;
  std::string plan;
  TrainCallbacks cb;
  cb.on_event = [&](const std::string&, const std::string& m) {
    if (m.rfind("memory plan", 0) == 0) plan = m;
  };
  Trainer trainer(go, cb);
  const TrainSummary got = trainer.run();
  const ModelWeights& w = trainer.model().weights();
  for (const Tensor* t : {&w.embed, &w.layers[0].q, &w.layers[0].k, &w.layers[1].down}) {
    EXPECT_EQ(t->device(), kGpu);
    EXPECT_EQ(t->dtype(), held);
  }
  EXPECT_EQ(resident_weight_bytes(w), held_weight_bytes(w.config, held));
  EXPECT_NE(plan.find(": weights " + format_bytes(held_weight_bytes(w.config, held)) + ","), std::string::npos) << plan;
  EXPECT_LT(resident_weight_bytes(w), held_weight_bytes(w.config, DType::F32) / 3)
      << "the card holds the quantized bytes";
  EXPECT_EQ(got.base_dtype, ref.base_dtype);
  ASSERT_EQ(got.steps_done, o.steps);
  expect_losses_close(got, ref, kBf16HeldRunTolerance);
  ASSERT_TRUE(got.final_eval_loss && ref.final_eval_loss);
  EXPECT_NEAR(*got.final_eval_loss, *ref.final_eval_loss, kBf16HeldRunTolerance.loss * *ref.final_eval_loss);
  EXPECT_LT(got.history.back().loss, got.history.front().loss) << "the device run learns";
}

TEST(CudaTrainer, Q8_0BaseTrainsOnTheCardLikeOnTheCpu) {
  TempDir dir;
  TrainOptions o = tiny_chat_options(dir.path, "cpu");
  o.base_dtype = "q8_0";
  expect_quantized_base_matches_cpu(o, DType::Q8_0);
}

TEST(CudaTrainer, Q4KBaseTrainsOnTheCardLikeOnTheCpu) {
  TempDir dir;
  TrainOptions o = tiny_chat_options(dir.path, "cpu");
  o.model_dir = write_q4k_model(dir.path);
  o.base_dtype = "q4_k";
  o.lr = 2e-2;  // random weights: a bigger step so that three steps show learning
  expect_quantized_base_matches_cpu(o, DType::Q4_K);
}

// tiny-chat at --base-dtype q4_k: its 128- and 384-wide rows are not whole q4_K blocks, so the
// loader holds them as q5_0, which the card reads too; an evaluation matches the CPU's.
TEST(CudaTrainer, Q5_0FallbackIsReadOnTheCard) {
  TempDir dir;
  TrainOptions o = tiny_chat_options(dir.path, "cpu");
  o.base_dtype = "q4_k";
  o.eval_only = true;
  const TrainSummary ref = Trainer(o).run();
  o.output_dir = dir.path + "/run-cuda";
  o.device = "cuda";
  SimulatedCudaDevice card;
  Trainer trainer(o);
  const TrainSummary got = trainer.run();
  EXPECT_EQ(trainer.model().weights().layers[0].down.dtype(), DType::Q5_0);
  EXPECT_EQ(trainer.model().weights().layers[0].down.device(), kGpu);
  ASSERT_TRUE(got.initial_eval_loss && ref.initial_eval_loss);
  EXPECT_NEAR(*got.initial_eval_loss, *ref.initial_eval_loss, kBf16HeldRunTolerance.loss * *ref.initial_eval_loss);
}

// GGUF bases keep their stored types (--base-dtype auto), llama.cpp's mixtures: q4_k_m and q5_k_m
// of the q4_K-shaped model (q4_K / q5_K, q6_K for the tied head and some attn_v / ffn_down), and
// q5_k_m and q4_0 of tiny-chat, whose 128-wide rows fall back (q5_1, q8_0). Each trains on the card
// like on the CPU, and together they put every block type except q5_0 (the test above) on it.
TEST(CudaTrainer, GgufBasesInTheirStoredTypesTrainOnTheCardLikeOnTheCpu) {
  TempDir dir;
  const std::string q4k_model = write_q4k_model(dir.path), tiny = source_dir() + "/models/tiny-chat";
  std::set<DType> seen;
  int run = 0;
  for (auto [model, quant] : {std::pair{q4k_model, GGUFQuant::Q4_K_M},
                              {q4k_model, GGUFQuant::Q5_K_M},
                              {tiny, GGUFQuant::Q5_K_M},
                              {tiny, GGUFQuant::Q4_0}}) {
    SCOPED_TRACE(model + " " + gguf_quant_name(quant));
    const std::string base = dir.path + "/base" + std::to_string(++run) + ".gguf";
    export_gguf(load_model(model), model, quant, base);
    TrainOptions o = tiny_chat_options(dir.path, "cpu");
    o.model_dir = hub::gguf_model_folder(base, dir.path + "/derived");
    o.output_dir = dir.path + "/run" + std::to_string(run);
    o.base_dtype = "auto";
    o.steps = 1;
    o.holdout = 0.0;
    const TrainSummary ref = Trainer(o).run();
    o.output_dir += "-cuda";
    o.device = "cuda";
    SimulatedCudaDevice card;
    Trainer trainer(o);
    const TrainSummary got = trainer.run();
    for (const auto& [name, t] : trainer.model().named_weights()) {
      EXPECT_EQ(t->device(), kGpu) << name;
      seen.insert(t->dtype());
    }
    expect_losses_close(got, ref, kBf16HeldRunTolerance);
  }
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K})
    EXPECT_TRUE(seen.count(t)) << dtype_name(t) << " never reached the card";
}

// The memory plan on the card (train/memory_plan.h, DeviceScratch) against the peak the card's
// allocator measures over whole training steps: never below it (the plan picks the micro-batch, so a
// low plan is an OOM waiting to happen) and at most 15% above (the replay follows the allocation
// order tensor by tensor; what it does not model is small: the int32 batch tensors, the 512-byte
// rounding of the cache, the optimizer's reduction scratch after backward). tiny-chat and
// stories260K, LoRA over f32, bf16 and q8_0 bases (held: the kernels dequantize every weight and the
// tied head panel by panel into device workspace), full fine-tuning, checkpointing on and off;
// a bf16 base on a Turing card (compute capability 7.5: f16 panels, scaled f16 operands, the head
// in f32 panels).
// cuBLASLt's workspace (4 MiB on the default CC 8.0 card, 32 MiB on a CC 9.0 one) is held from
// the first GEMM on, so it is in both numbers: the plan names it (the card's size, asked of the
// installed kernels), every GEMM had it, and the 15% bound holds for the rest (the fixed term would
// otherwise dilute it).
TEST(CudaTrainer, MemoryPlanCoversTheMeasuredPeakOnTheCard) {
  struct Case {
    std::string name, model, base;
    TrainMode mode;
    bool checkpointing;
    int cc_major = 8, cc_minor = 0;  // 7.5: a Turing card (f16 GEMMs, bf16 weights through f16 panels)
  };
  const std::string stories = shared_dir() + "/models/stories260K";
  const std::string tiny = source_dir() + "/models/tiny-chat";
  const Case cases[] = {{"tiny-chat lora bf16 ckpt on a T4", tiny, "bf16", TrainMode::Lora, true, 7, 5},
                        {"tiny-chat lora f32 ckpt", tiny, "f32", TrainMode::Lora, true},
                        {"tiny-chat lora bf16 no-ckpt", tiny, "bf16", TrainMode::Lora, false},
                        {"tiny-chat full ckpt", tiny, "f32", TrainMode::Full, true},
                        {"stories260K lora bf16 ckpt", stories, "bf16", TrainMode::Lora, true},
                        {"stories260K lora bf16 ckpt CC 9.0", stories, "bf16", TrainMode::Lora, true, 9},
                        {"tiny-chat lora q8_0 ckpt", tiny, "q8_0", TrainMode::Lora, true}};
  for (const Case& c : cases) {
    TempDir dir;
    TrainOptions o = tiny_chat_options(dir.path, "cuda");
    o.model_dir = c.model;
    o.base_dtype = c.base;
    o.mode = c.mode;
    o.gradient_checkpointing = c.checkpointing;
    o.steps = 2;  // with the first, every sample of the data: the plan sizes for the longest
    o.holdout = 0.0;
    o.max_seq_length = 64;
    SimulatedCudaDevice card;
    SimulatedComputeCapability cc(c.cc_major, c.cc_minor);
    const size_t gemm_workspace = cuda_workspace::gemm_workspace_bytes(c.cc_major);
    std::string plan;
    TrainCallbacks cb;
    cb.on_event = [&](const std::string&, const std::string& m) {
      if (m.rfind("memory plan", 0) == 0) plan = m;
    };
    const TrainSummary s = Trainer(o, cb).run();
    ASSERT_GT(s.planned_memory_bytes, 0u) << c.name;
    EXPECT_EQ(s.oom_recoveries, 0) << c.name;
    EXPECT_NE(plan.find("GEMM workspace (cuBLASLt) " + format_bytes(gemm_workspace) + ","), std::string::npos) << plan;
    EXPECT_EQ(sim::last_gemm_workspace().bytes, gemm_workspace) << c.name << ": the GEMMs had it";
    ASSERT_GT(s.peak_memory_bytes, gemm_workspace) << c.name;
    const double ratio = static_cast<double>(s.planned_memory_bytes - gemm_workspace) /
                         static_cast<double>(s.peak_memory_bytes - gemm_workspace);
    std::cout << "[memory plan on the card] " << c.name << ": planned " << s.planned_memory_bytes << " B, measured "
              << s.peak_memory_bytes << " B (both with " << gemm_workspace
              << " B of GEMM workspace), ratio of the rest " << ratio << "\n";
    EXPECT_GE(ratio, 1.0) << c.name << ": the plan is below the card's measured peak";
    EXPECT_LE(ratio, 1.15) << c.name;
  }
}

// --max-memory auto on the card: the budget is what the card can give when the run plans (its free
// memory, which other processes share, plus what the allocator holds), enforced. On a card whose
// room (another process holds a part of it) is too small for 4 sequences at once, the plan picks a
// smaller micro-batch before step 1 and no step runs out of memory (planned against the card's
// total, the first step would); on a card with no room for one sequence the run is refused before
// the first step with the plan, as on the CPU.
TEST(CudaTrainer, AutoMaxMemoryIsTheCardsRoomAndThePlanFitsIt) {
  TempDir big_dir, small_dir, tiny_dir;
  TrainOptions o = tiny_chat_options(big_dir.path, "cuda");
  o.steps = 1;
  o.micro_batch_size = 0;  // the plan chooses
  o.holdout = 0.0;
  o.lora.dropout = 0.0f;
  size_t resident = 0, peak = 0;
  {
    SimulatedCudaDevice card;
    Trainer t(o);
    const TrainSummary big = t.run();
    ASSERT_EQ(big.micro_batch_size, 4) << "a big card fits the whole batch";
    resident = card.allocator().stats().bytes_in_use;
    peak = big.peak_memory_bytes;
  }
  o.max_memory_auto = true;
  {
    const size_t room = resident + (peak - resident) * 3 / 4;
    SimulatedCudaDevice card(2 * peak);
    void* other = nullptr;  // another process on the card
    ASSERT_EQ(sim::cudaMalloc(&other, 2 * peak - room), sim::cudaSuccess);
    o.output_dir = small_dir.path + "/run";
    const TrainSummary small = Trainer(o).run();
    sim::cudaFree(other);
    EXPECT_EQ(small.oom_recoveries, 0) << "the plan saw the card's room before step 1";
    EXPECT_LT(small.micro_batch_size, 4);
    EXPECT_EQ(card.allocator().stats().num_ooms, 0u);
    EXPECT_LE(small.peak_memory_bytes, room);
  }
  {  // monitor.memory_headroom acts on the card: keeping all of the room free leaves no room to train
    SimulatedCudaDevice card(2 * peak);
    TrainOptions kept = o;
    kept.output_dir = small_dir.path + "/kept";
    kept.monitor.memory_headroom_bytes = static_cast<int64_t>(2 * peak);
    std::string budget;
    TrainCallbacks cb;
    cb.on_event = [&](const std::string&, const std::string& m) {
      if (m.find("--max-memory auto on the card") != std::string::npos) budget = m;
    };
    try {
      Trainer(kept, cb).run();
      FAIL() << "trained with the whole card kept free";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::RUNTIME_GPU_OOM) << e.what();
    }
    EXPECT_NE(budget.find("minus " + format_bytes(2 * peak) + " headroom"), std::string::npos) << budget;
  }

  SimulatedCudaDevice no_room(resident + 1024);
  o.output_dir = tiny_dir.path + "/run";
  try {
    Trainer(o).run();
    FAIL() << "trained on a card with no room for one sequence";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_GPU_OOM) << e.what();
    EXPECT_NE(std::string(e.what()).find("cannot fit before the first step"), std::string::npos) << e.what();
  }
}

// Whether this machine has a real card the trainer would use (scripts/gpu_check.sh runs test_cuda
// there): then "no card" cannot be tested, and --device auto/cuda without a simulated card train on it.
bool real_card_present() {
  return cuda_status().usable();
}

// --device cuda without a card: refused before any work, with the reason.
TEST(CudaTrainer, NoCardIsRefusedUpFront) {
  if (real_card_present()) GTEST_SKIP() << "this machine has a usable CUDA device: nothing to refuse";
  TempDir dir;
  TrainOptions o = tiny_chat_options(dir.path, "cuda");
  try {
    Trainer(o).run();
    FAIL() << "trained without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_GPU_NOT_AVAILABLE) << e.what();
  }
}

// A Turing card (T4, compute capability 7.5) trains a q8_0 base in f16 GEMMs like the CPU does in
// f32, within f16's bounds, and the start event says f16.
TEST(CudaTrainer, Q8_0BaseTrainsOnATuringCardInF16LikeOnTheCpu) {
  TempDir dir;
  TrainOptions o = tiny_chat_options(dir.path, "cpu");
  o.base_dtype = "q8_0";
  o.steps = 2;  // enough to see learning; no evaluations: the run is the point, kept short
  o.holdout = 0.0;
  const TrainSummary ref = Trainer(o).run();
  o.output_dir += "-cuda";
  o.device = "cuda";
  SimulatedCudaDevice card;
  SimulatedComputeCapability t4(7, 5);
  std::string device_line;
  const TrainSummary got = Trainer(o, capture_device_event(&device_line)).run();
  EXPECT_NE(device_line.find("f16 inputs"), std::string::npos) << device_line;
  EXPECT_EQ(device_line.find("bf16 inputs"), std::string::npos) << device_line;
  ASSERT_EQ(got.steps_done, o.steps);
  expect_losses_close(got, ref, kF16HeldRunTolerance);
  EXPECT_LT(got.history.back().loss, got.history.front().loss) << "the device run learns";
}

// A Volta card (compute capability 7.0) has no kernels in this build (CUDA 13 compiles for 7.5 and
// up): refused before any step, with the reason.
TEST(CudaTrainer, CardOlderThanTuringIsRefusedWithTheReason) {
  TempDir dir;
  TrainOptions o = tiny_chat_options(dir.path, "cuda");
  o.base_dtype = "bf16";
  SimulatedCudaDevice card;
  SimulatedComputeCapability v100(7, 0);
  try {
    Trainer(o).run();
    FAIL() << "trained on a 7.0 card";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_GPU_NOT_AVAILABLE) << e.what();
    EXPECT_NE(std::string(e.what()).find("compute capability 7.0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("7.5 or newer"), std::string::npos) << e.what();
  }
}

// One GPU: cuda:1 is refused even with a card at index 0.
TEST(CudaTrainer, DeviceOtherThanZeroIsRefused) {
  TempDir dir;
  TrainOptions o = tiny_chat_options(dir.path, "cuda:1");
  SimulatedCudaDevice card;
  try {
    Trainer(o).run();
    FAIL() << "trained on device 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_GPU_NOT_AVAILABLE) << e.what();
    EXPECT_NE(std::string(e.what()).find("device 0"), std::string::npos) << e.what();
  }
}

// --device auto (the default) without a card: the CPU. An evaluation-only run places the model
// without training.
TEST(CudaTrainer, AutoStaysOnTheCpuWithoutACard) {
  if (real_card_present()) GTEST_SKIP() << "this machine has a usable CUDA device: auto picks it";
  TempDir dir;
  TrainOptions o = tiny_chat_options(dir.path, "auto");
  o.eval_only = true;
  Trainer t(o);
  t.run();
  EXPECT_EQ(t.model().device(), Device{}) << "no card: the CPU";
}

// --device auto with a card (the simulated one): the card.
TEST(CudaTrainer, AutoPicksTheCardWhenThereIsOne) {
  TempDir dir;
  TrainOptions o = tiny_chat_options(dir.path, "auto");
  o.eval_only = true;
  SimulatedCudaDevice card;
  Trainer t(o);
  const TrainSummary s = t.run();
  EXPECT_EQ(t.model().device(), kGpu);
  EXPECT_TRUE(s.initial_eval_loss.has_value());
}

}  // namespace
}  // namespace bp::test
