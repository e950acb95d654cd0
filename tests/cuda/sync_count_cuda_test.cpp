// How often a training step on the card makes the host wait for the device: each device-to-host
// read or explicit synchronisation drains the launch queue of a real GPU (tens of µs, while a
// Qwen2.5-0.5B LoRA step at 2048 tokens is ~10 ms of kernels), so the step must wait a small,
// fixed number of times, not once per layer, per gradient tensor or per op. Counted on the
// simulated runtime (sim::runtime_counts: every cudaMemcpy device-to-host and every
// cudaStreamSynchronize / cudaDeviceSynchronize), per optimizer step in the steady state (after the
// first step, whose one-time uploads and allocations are not the step's), for tiny-chat's shape
// with 2 and with 4 layers: the count must be the same for both and within the bound below.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>

#include "core/host_mirror.h"
#include "ops/cross_entropy.h"
#include "ops/embedding.h"
#include "ops/optim.h"
#include "trainer_cuda_util.h"

namespace bp::test {
namespace {

using namespace cuda_trainer;

// What a step needs on the host: the loss of each micro-batch and the gradient norm (the
// trainer's NaN guard and log) read together with the non-finite state.
constexpr uint64_t kMaxHostWaitsPerStep = 3;

struct StepCounts {
  std::vector<sim::RuntimeCounts> per_step;  // the runtime's counts during each step
};

// Trains tiny-chat's shape with `layers` layers (random weights: only the shape matters) on the
// simulated card for `steps` steps of 2 micro-batches and returns the counts of each step but the
// first. base: the
// frozen weights' dtype in LoRA mode ("" = the default, f32 here; bf16 with f16_card);
// matmul: training.matmul_dtype.
// qwen3: tiny-chat's shape as a Qwen3ForCausalLM (q/k norms), random weights. lora_dropout:
// tiny_chat_options' 0.1 unless given.
StepCounts count_training(int layers, TrainMode mode, bool f16_card, const std::string& base = "",
                          const std::string& matmul = "auto", int steps = 4, bool qwen3 = false,
                          float lora_dropout = -1.0f) {
  TempDir dir;
  nlohmann::json cfg = nlohmann::json::parse(read_file(source_dir() + "/models/tiny-chat/config.json"));
  cfg["num_hidden_layers"] = layers;
  if (qwen3) cfg = config_as_qwen3(cfg);
  const std::string config_path = dir.path + "/config.json";
  std::ofstream(config_path) << cfg.dump(2);
  TrainOptions o = tiny_chat_options(dir.path, "cuda");
  o.model_dir.clear();
  o.init_from_config = config_path;
  o.tokenizer_dir = source_dir() + "/models/tiny-chat";
  o.mode = mode;
  o.holdout = 0.0;  // no evaluation between steps: only the steps are counted
  o.steps = steps;
  o.save_every = 0;
  if (f16_card) o.base_dtype = "bf16";  // frozen weights held narrow: f16 GEMMs on a Turing card
  if (!base.empty()) o.base_dtype = base;
  o.matmul_dtype = matmul;
  if (lora_dropout >= 0) o.lora.dropout = lora_dropout;

  SimulatedCudaDevice card;
  std::unique_ptr<SimulatedComputeCapability> turing;
  if (f16_card) turing = std::make_unique<SimulatedComputeCapability>(7, 5);
  StepCounts out;
  TrainCallbacks cb;
  sim::RuntimeCounts last{};
  bool started = false;
  cb.on_step = [&](const StepRecord&, const TrainSummary&, int64_t) {
    const sim::RuntimeCounts now = sim::runtime_counts();
    if (started) out.per_step.push_back(now - last);
    started = true;
    last = now;
  };
  Trainer trainer(o, cb);
  trainer.run();
  return out;
}

std::string describe(const sim::RuntimeCounts& c) {
  return std::to_string(c.host_waits()) + " host waits (" + std::to_string(c.synchronous_reads) +
         " synchronous reads, " + std::to_string(c.synchronizations) + " synchronisations; " +
         std::to_string(c.device_to_host_copies) + " copies to the host), " + std::to_string(c.host_to_device_copies) +
         " uploads, " + std::to_string(c.mallocs) + " cudaMalloc; " + std::to_string(c.kernel_launches) +
         " kernel launches, " + std::to_string(c.gemms) + " GEMMs";
}

void expect_constant_and_small(const StepCounts& two, const StepCounts& four, const char* what) {
  ASSERT_EQ(two.per_step.size(), 3u);
  ASSERT_EQ(four.per_step.size(), 3u);
  for (size_t i = 0; i < two.per_step.size(); ++i) {
    std::cout << "[sync count] " << what << " step " << i + 2 << ": 2 layers " << describe(two.per_step[i])
              << "; 4 layers " << describe(four.per_step[i]) << "\n";
    EXPECT_EQ(two.per_step[i].host_waits(), four.per_step[i].host_waits())
        << what << " step " << i + 2 << ": the host waits more often with more layers";
    EXPECT_LE(four.per_step[i].host_waits(), kMaxHostWaitsPerStep) << what << " step " << i + 2;
  }
}

TEST(CudaTrainer, LoraStepWaitsForTheCardAFixedSmallNumberOfTimes) {
  expect_constant_and_small(count_training(2, TrainMode::Lora, false), count_training(4, TrainMode::Lora, false),
                            "lora");
}

TEST(CudaTrainer, FullFineTuningStepWaitsForTheCardAFixedSmallNumberOfTimes) {
  expect_constant_and_small(count_training(2, TrainMode::Full, false), count_training(4, TrainMode::Full, false),
                            "full");
}

TEST(CudaTrainer, TuringF16StepWaitsForTheCardAFixedSmallNumberOfTimes) {
  expect_constant_and_small(count_training(2, TrainMode::Lora, true), count_training(4, TrainMode::Lora, true),
                            "lora on an f16 card");
}

// The GEMM inputs a step rounds to bf16 itself, one launch each (the wrappers' ActivationOperand):
// only those no producer wrote a bf16 copy of (ops/linear.h x_bf16, dy_bf16). Per layer and
// micro-batch over a bf16 base: none, where rounding every GEMM input was 21 (RMSNorm writes xn's
// copy for q/k/v and hn's for gate/up, attention its output's for o, SwiGLU m's for down, the
// forward's twice with checkpointing; backward, SwiGLU dgate's and dup's, RMSNorm's backward the
// residual gradients' for o and for the down projection below, the attention backward dv's and
// RoPE's backward dq's and dk's for v, q and k). Counted as the launches a layer
// adds over the same run with f32 GEMMs (a base held in f32, or full fine-tuning with --matmul-dtype f32), which round
// nothing and launch the same kernels otherwise: 2 layers − 1 layer, in the second step (of 2 micro-batches). Full
// fine-tuning through bf16 GEMM copies: none either, dW's x being the forward's copies kept for the
// layer's backward (xn for q/k/v, attention's output, hn for gate/up, m), where each dW rounded its
// x (7).
TEST(CudaTrainer, GemmInputsAreRoundedOnlyWhereNoProducerWroteTheirBf16Copy) {
  const auto launches_per_layer = [](TrainMode mode, const std::string& narrow_base, const std::string& f32_base,
                                     const std::string& narrow_matmul, const std::string& f32_matmul,
                                     bool qwen3 = false) {
    const auto launches = [&](int layers, const std::string& base, const std::string& matmul) {
      const StepCounts c = count_training(layers, mode, false, base, matmul, 2, qwen3);
      EXPECT_EQ(c.per_step.size(), 1u);
      return c.per_step.empty() ? 0 : static_cast<int64_t>(c.per_step.back().kernel_launches);
    };
    const int64_t narrow = launches(2, narrow_base, narrow_matmul) - launches(1, narrow_base, narrow_matmul);
    const int64_t f32 = launches(2, f32_base, f32_matmul) - launches(1, f32_base, f32_matmul);
    return narrow - f32;
  };
  constexpr int64_t kMicroBatches = 2;
  EXPECT_EQ(launches_per_layer(TrainMode::Lora, "bf16", "f32", "auto", "auto"), 0 * kMicroBatches)
      << "LoRA over a bf16 base: rounding launches per layer and step";
  EXPECT_EQ(launches_per_layer(TrainMode::Full, "", "", "bf16", "f32"), 0 * kMicroBatches)
      << "full fine-tuning through bf16 GEMM copies: rounding launches per layer and step";
  // With q/k norms (Qwen3) dq's and dk's last writers are those norms' backward, not RoPE's.
  EXPECT_EQ(launches_per_layer(TrainMode::Lora, "bf16", "f32", "auto", "auto", true), 0 * kMicroBatches)
      << "LoRA over a bf16 base, Qwen3: rounding launches per layer and step";
}

// LoRA's GEMMs per layer and micro-batch (all seven projections adapted, checkpointing on: the
// forward twice), where the LoRA input groups multiply their input once for every member
// (ops/linear.h lora_group_forward / lora_group_backward): each forward 7 base + 4 xa (q/k/v's,
// o's, gate/up's, down's) + 7 B; the backward 7 base dx + 7 dB + 7 dxa + 4 dA + 4 dx. One
// projection at a time it was 7 xa, dA and dx each: 77. With dropout the products of x are the
// dropout kernels' instead (2 · (7 + 7) + 3 · 7 GEMMs), a group's in one launch per product with
// each member's own mask (lora_dropout.cuh's member lists).
// The other launches: each forward 2 RMSNorms, one RoPE for q and k, attention and SwiGLU (the
// residual adds are o's and down's GEMMs, their beta matrix); the backward SwiGLU's, 2 RMSNorms',
// attention's 3 (delta, dK/dV, dQ) and one RoPE's: 2 · 5 + 7 (until the sixteenth session 2 · 7 + 7:
// a RoPE launch each for q and k, and two residual adds). With dropout, 4 xa kernels in each
// forward (q/k/v's, o's, gate/up's, down's) and 4 dA and 4 dx kernels in the backward on top (the
// tiny model's dA does not split its tokens: no second pass); until the seventeenth session, one
// projection at a time, 7 of each: 2 · 7 + 7 + 7 more.
TEST(CudaTrainer, LoraGroupsMultiplyTheirInputOnceForAllMembers) {
  struct PerLayer {
    int64_t gemms = 0, others = 0;
  };
  const auto per_layer = [](float dropout) {
    const auto counts = [&](int layers) {
      const StepCounts c = count_training(layers, TrainMode::Lora, false, "bf16", "auto", 2, false, dropout);
      EXPECT_EQ(c.per_step.size(), 1u);
      return c.per_step.empty() ? sim::RuntimeCounts{} : c.per_step.back();
    };
    const sim::RuntimeCounts two = counts(2), one = counts(1);
    std::cout << "[lora groups] dropout " << dropout
              << ", per layer and step of 2 micro-batches: " << two.gemms - one.gemms << " GEMMs, "
              << two.kernel_launches - one.kernel_launches << " other kernel launches\n";
    return PerLayer{static_cast<int64_t>(two.gemms - one.gemms),
                    static_cast<int64_t>(two.kernel_launches - one.kernel_launches)};
  };
  constexpr int64_t kMicroBatches = 2;
  const PerLayer grouped = per_layer(0.0f), dropped = per_layer(0.1f);
  EXPECT_EQ(grouped.gemms, (2 * (7 + 4 + 7) + (7 + 7 + 7 + 4 + 4)) * kMicroBatches) << "no dropout: grouped";
  EXPECT_EQ(dropped.gemms, (2 * (7 + 7) + 3 * 7) * kMicroBatches) << "dropout: products of x in its kernels";
  EXPECT_EQ(grouped.others, (2 * 5 + 7) * kMicroBatches) << "no dropout: other launches";
  EXPECT_EQ(dropped.others, (2 * 5 + 7 + 2 * 4 + 4 + 4) * kMicroBatches) << "dropout: other launches, groups in one";
}

// The counters count: a synchronous read of device memory is one wait, as is a synchronisation;
// an asynchronous copy to the host is counted as a copy, its wait at the synchronisation after it.
TEST(CudaSyncCount, CountersSeeReadsAndSynchronisations) {
  SimulatedCudaDevice card;
  Tensor t = Tensor::zeros({4}, DType::F32, kGpu);
  sim::reset_runtime_counts();
  EXPECT_EQ(sim::runtime_counts().host_waits(), 0u);
  (void)t.to_vector();
  EXPECT_EQ(sim::runtime_counts().synchronous_reads, 1u);
  EXPECT_EQ(sim::runtime_counts().host_waits(), 1u);
  float v[4];
  sim::cudaMemcpyAsync(v, t.kernel_raw(), sizeof(v), sim::cudaMemcpyDeviceToHost);
  EXPECT_EQ(sim::runtime_counts().device_to_host_copies, 2u);
  EXPECT_EQ(sim::runtime_counts().host_waits(), 1u);
  sim::cudaStreamSynchronize(nullptr);
  EXPECT_EQ(sim::runtime_counts().synchronizations, 1u);
  EXPECT_EQ(sim::runtime_counts().host_waits(), 2u);
  (void)Tensor::from_vector(std::vector<float>{1, 2}, {2}).to(kGpu);
  EXPECT_EQ(sim::runtime_counts().host_to_device_copies, 1u);
  const uint64_t mallocs = sim::runtime_counts().mallocs;
  void* p = nullptr;
  ASSERT_EQ(sim::cudaMalloc(&p, 64), sim::cudaSuccess);
  sim::cudaFree(p);
  EXPECT_EQ(sim::runtime_counts().mallocs, mallocs + 1);
  sim::reset_runtime_counts();
  EXPECT_EQ(sim::runtime_counts().device_to_host_copies, 0u);
  EXPECT_EQ(sim::runtime_counts().host_waits(), 0u);
}

// The ops' checks of a device tensor read the host copy its uploader registered (HostMirrorScope,
// as the model does for its batch): no wait for the card, and the same error for a bad id; without
// a registered copy (or after the scope) they copy the values back, once per check.
TEST(CudaSyncCount, OpChecksReadTheUploadersHostCopy) {
  SimulatedCudaDevice card;
  const Tensor table = Tensor::from_vector(std::vector<float>(31 * 4, 0.5f), {31, 4}).to(kGpu);
  const Tensor ids = Tensor::from_vector(std::vector<int32_t>{0, 30, 7}, {3});
  const Tensor bad = Tensor::from_vector(std::vector<int32_t>{0, 31}, {2});
  const Tensor ids_gpu = ids.to(kGpu), bad_gpu = bad.to(kGpu);
  auto waits_of = [](auto&& call) {
    sim::reset_runtime_counts();
    call();
    return sim::runtime_counts().host_waits();
  };
  auto message_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.info().name) + ": " + e.what();
    }
    return "no error";
  };
  EXPECT_EQ(waits_of([&] { (void)embedding_forward(ids_gpu, table); }), 1u) << "a staged copy of the ids";
  const std::string unmirrored = message_of([&] { (void)embedding_forward(bad_gpu, table); });
  EXPECT_NE(unmirrored.find("INPUT_VALIDATION_FAILED"), std::string::npos) << unmirrored;
  EXPECT_NE(unmirrored.find("token id 31 at position 1"), std::string::npos) << unmirrored;
  {
    const HostMirrorScope mirror({{&ids_gpu, &ids}, {&bad_gpu, &bad}});
    EXPECT_EQ(waits_of([&] { (void)embedding_forward(ids_gpu, table); }), 0u);
    EXPECT_EQ(waits_of([&] { (void)embedding_forward(ids_gpu.rows(1, 3), table); }), 0u) << "a view";
    EXPECT_EQ(message_of([&] { (void)embedding_forward(bad_gpu, table); }), unmirrored);
    EXPECT_EQ(host_mirror(ids_gpu.kernel_data<int32_t>() + 1, 8), ids.data<int32_t>() + 1);
    EXPECT_EQ(host_mirror(ids_gpu.kernel_data<int32_t>() + 1, 12), nullptr) << "past the tensor's end";
  }
  EXPECT_EQ(host_mirror(ids_gpu.kernel_raw(), 4), nullptr) << "the scope ended";
  EXPECT_EQ(waits_of([&] { (void)embedding_forward(ids_gpu, table); }), 1u);
}

// The two reads a step keeps: the fused loss reads its total once per call however many windows
// it walks (5 here), and the gradient norm once however many tensors it covers (clipping adds no
// read: the scale is applied by kernels).
TEST(CudaSyncCount, LossAndGradNormReadTheCardOncePerCall) {
  SimulatedCudaDevice card;
  const int64_t T = 33, D = 16, V = 37;
  std::vector<int32_t> lab(T);
  for (int64_t t = 0; t < T; ++t) lab[static_cast<size_t>(t)] = t % 5 == 0 ? -100 : static_cast<int32_t>((t * 7) % V);
  const Tensor labels = Tensor::from_vector(lab, {T}), labels_gpu = labels.to(kGpu);
  const Tensor x = random_tensor({T, D}, 1).to(kGpu), W = random_tensor({V, D}, 2).to(kGpu);
  Tensor dx = Tensor::empty({T, D}, DType::F32, kGpu), dW = Tensor::zeros({V, D}, DType::F32, kGpu);
  {
    const HostMirrorScope mirror({{&labels_gpu, &labels}});
    sim::reset_runtime_counts();
    const auto r = linear_cross_entropy_forward_backward(x, W, labels_gpu, 0.1f, dx, &dW, 8);
    EXPECT_EQ(sim::runtime_counts().host_waits(), 1u);
    EXPECT_GT(r.n_counted, 0);
  }
  std::vector<Tensor> grads;
  for (int i = 0; i < 5; ++i) grads.push_back(random_tensor({7 + i, 3}, 10 + i).to(kGpu));
  std::vector<Tensor*> ptrs;
  for (auto& g : grads) ptrs.push_back(&g);
  sim::reset_runtime_counts();
  const double norm = clip_grad_norm(ptrs, 1e-3);
  EXPECT_EQ(sim::runtime_counts().host_waits(), 1u);
  EXPECT_GT(norm, 1e-3) << "the gradients were clipped";
  sim::reset_runtime_counts();
  EXPECT_NEAR(global_grad_norm(std::vector<const Tensor*>(ptrs.begin(), ptrs.end())), 1e-3, 1e-9);
  EXPECT_EQ(sim::runtime_counts().host_waits(), 1u);
}

}  // namespace
}  // namespace bp::test
