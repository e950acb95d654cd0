// The Trainer with --device cuda on the simulated card (sim_device.h), made to run out of memory:
// an OOM injected into the card's allocator is recovered as on the CPU (checkpointing on first, then
// the micro-batch halved), a card too small for the micro-batch makes the trainer shrink it, a
// library's OOM takes the OOM-adjacent path, a sticky error stops the run naming the checkpoint;
// and the device memory plan against the peak the card's allocator measures, --max-memory auto on
// a card. Shared set-up: trainer_cuda_util.h.
#include <gtest/gtest.h>

#include "trainer_cuda_util.h"

namespace bp::test {
namespace {

using namespace cuda_trainer;

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

// The memory plan on the card (train/memory_plan.h, DeviceScratch) against the peak the card's
// allocator measures over whole training steps: never below it (the plan picks the micro-batch, so a
// low plan is an OOM waiting to happen) and at most 15% above (the replay follows the allocation
// order tensor by tensor; what it does not model is small: the int32 batch tensors, the 512-byte
// rounding of the cache, the optimizer's reduction scratch after backward). tiny-chat and
// stories260K, LoRA over f32, bf16 and q8_0 bases (held: the kernels dequantize every weight and the
// tied head panel by panel into device workspace), full fine-tuning through bf16 GEMM copies (the
// copies, and dW's two bf16 operands) and with f32 GEMMs, checkpointing on and off; tiny-chat's
// shape as a Qwen3 (q/k norms, whose backward writes dq's and dk's bf16 copies);
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
    std::string matmul = "auto";     // full mode: auto = bf16 GEMM copies from 8.0 on
    bool qwen3 = false;              // the model's shape as a Qwen3ForCausalLM (q/k norms), random weights
    float lora_dropout = 0.1f;       // the input groups' dropout kernels; 0: their plain GEMMs (ops/linear.h)
  };
  const std::string stories = shared_dir() + "/models/stories260K";
  const std::string tiny = source_dir() + "/models/tiny-chat";
  const Case cases[] = {
      {"tiny-chat lora bf16 ckpt on a T4", tiny, "bf16", TrainMode::Lora, true, 7, 5},
      {"tiny-chat lora f32 ckpt", tiny, "f32", TrainMode::Lora, true},
      {"tiny-chat lora bf16 no-ckpt", tiny, "bf16", TrainMode::Lora, false},
      {"tiny-chat full ckpt (bf16 GEMM copies)", tiny, "f32", TrainMode::Full, true},
      {"tiny-chat full no-ckpt (bf16 GEMM copies)", tiny, "f32", TrainMode::Full, false},
      {"tiny-chat full ckpt f32 GEMMs", tiny, "f32", TrainMode::Full, true, 8, 0, "f32"},
      {"stories260K lora bf16 ckpt", stories, "bf16", TrainMode::Lora, true},
      {"stories260K lora bf16 ckpt CC 9.0", stories, "bf16", TrainMode::Lora, true, 9},
      {"tiny-chat lora q8_0 ckpt", tiny, "q8_0", TrainMode::Lora, true},
      {"tiny-chat as Qwen3 lora bf16 ckpt", tiny, "bf16", TrainMode::Lora, true, 8, 0, "auto", true},
      {"tiny-chat lora bf16 ckpt, no dropout", tiny, "bf16", TrainMode::Lora, true, 8, 0, "auto", false, 0.0f},
      {"tiny-chat lora bf16 no-ckpt, no dropout", tiny, "bf16", TrainMode::Lora, false, 8, 0, "auto", false, 0.0f}};
  for (const Case& c : cases) {
    TempDir dir;
    TrainOptions o = tiny_chat_options(dir.path, "cuda");
    o.model_dir = c.model;
    if (c.qwen3) {
      o.init_from_config = dir.path + "/config.json";
      std::ofstream(o.init_from_config)
          << config_as_qwen3(nlohmann::json::parse(read_file(c.model + "/config.json"))).dump(2);
      o.tokenizer_dir = c.model;
      o.model_dir.clear();
    }
    o.base_dtype = c.base;
    o.mode = c.mode;
    o.matmul_dtype = c.matmul;
    o.gradient_checkpointing = c.checkpointing;
    o.lora.dropout = c.lora_dropout;
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

}  // namespace
}  // namespace bp::test
