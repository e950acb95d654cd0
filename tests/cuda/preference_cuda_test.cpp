// The preference methods on the simulated CUDA device against the CPU. The model passes: per-sequence
// losses (reference and KL passes, with the adapter switched off), and the per-sequence backward
// whose scales depend on the forward's losses, LoRA (frozen head: dx scaled on the device) and full
// fine-tuning (trainable head: a second pass per sequence into the head's dW). stories260K, f32
// weights: the device's arithmetic is the CPU's, element for element, up to the order of sums.
// The whole Trainer: DPO in LoRA mode (the reference is the adapter switched off on the card) and in
// full fine-tuning (the reference precomputed on the card before step 1), step for step against
// the same run on the CPU. (KTO's KL pass is the same sequence_losses call as the reference pass.)
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "model/loader.h"
#include "model/lora.h"
#include "model/model_test_helpers.h"
#include "model/transformer.h"
#include "sim_device.h"
#include "support/test_util.h"
#include "trainer_cuda_util.h"

namespace bp::test {
namespace {

constexpr Device kGpu{DeviceType::CUDA, 0};

// Two "pairs": prompts of 5 and 3 tokens with completions of 6/4 and 7/2 tokens; labels on the
// completions only.
Batch pair_batch(int64_t vocab) {
  std::vector<std::vector<int32_t>> ids, labels;
  uint32_t x = 777;
  auto next = [&] { return static_cast<int32_t>((x = x * 1103515245u + 12345u) >> 8) % static_cast<int32_t>(vocab); };
  for (auto [prompt, c1, c2] : {std::tuple{5, 6, 4}, std::tuple{3, 7, 2}}) {
    std::vector<int32_t> p;
    for (int i = 0; i < prompt; ++i) p.push_back(next());
    for (int completion : {c1, c2}) {
      std::vector<int32_t> s = p;
      for (int i = 0; i < completion; ++i) s.push_back(next());
      std::vector<int32_t> l(s.size(), kIgnoreLabel);
      for (size_t t = p.size() - 1; t + 1 < s.size(); ++t) l[t] = s[t + 1];
      ids.push_back(s);
      labels.push_back(l);
    }
  }
  return Batch::pack(ids, labels);
}

struct Result {
  Model::SequenceLosses with, off, trained;
  std::vector<std::string> names;
  std::vector<std::vector<float>> grads;
};

// A scale for each sequence that depends on the forward's losses, as a method's does.
std::vector<float> scales_of(const Model::SequenceLosses& l) {
  std::vector<float> g;
  for (size_t s = 0; s < l.loss_sum.size(); ++s)
    g.push_back(static_cast<float>((s % 2 ? -0.5 : 1.0) * std::tanh(l.loss_sum[s] / 20.0) / l.n_counted[s]));
  return g;
}

Result run(TrainMode mode, Device device) {
  LoraAdapter adapter;  // outlives the model, which points into it
  Model model(load_model(shared_dir() + "/models/stories260K", DType::F32), ModelOptions{mode, true, 16});
  for (auto& [name, t] : model.named_weights()) *t = t->to(device);
  if (mode == TrainMode::Full) model.allocate_grads();  // on the weights' device now
  if (mode == TrainMode::Lora) {
    LoraConfig lc;
    lc.r = 4;
    lc.alpha = 8;
    lc.dropout = 0;
    lc.target_modules = {"all-linear"};
    adapter = init_lora(model.config(), lc, 5);
    uint64_t seed = 9;
    for (auto& layer : adapter.layers)
      for (auto& B : layer.B)
        if (B.defined()) B = random_tensor(B.shape(), seed++, -0.05f, 0.05f);
    for (auto& layer : adapter.layers)
      for (size_t t = 0; t < layer.A.size(); ++t)
        if (layer.A[t].defined()) {
          layer.A[t] = layer.A[t].to(device);
          layer.B[t] = layer.B[t].to(device);
        }
    model.attach_lora(adapter);
  }
  const Batch batch = pair_batch(model.config().vocab_size);
  Result r;
  model.set_training(false);
  r.with = model.sequence_losses(batch);
  if (mode == TrainMode::Lora) {
    model.set_lora_enabled(false);
    r.off = model.sequence_losses(batch);
    model.set_lora_enabled(true);
  }
  model.set_training(true);
  model.zero_grads();
  r.trained = model.forward_backward_sequences(batch, scales_of, 42);
  for (auto& p : model.trainable_parameters()) {
    r.names.push_back(p.name);
    r.grads.push_back(p.grad->to_vector());
  }
  return r;
}

void expect_same_losses(const Model::SequenceLosses& got, const Model::SequenceLosses& ref, const char* what) {
  ASSERT_EQ(got.loss_sum.size(), ref.loss_sum.size()) << what;
  for (size_t s = 0; s < ref.loss_sum.size(); ++s) {
    EXPECT_EQ(got.n_counted[s], ref.n_counted[s]) << what << " " << s;
    EXPECT_NEAR(got.loss_sum[s], ref.loss_sum[s], 1e-5 * std::fabs(ref.loss_sum[s])) << what << " " << s;
  }
}

TEST(CudaPreference, SequenceLossesAndTheirBackwardMatchCpu) {
  for (TrainMode mode : {TrainMode::Lora, TrainMode::Full}) {
    SCOPED_TRACE(mode == TrainMode::Lora ? "lora" : "full");
    SimulatedCudaDevice card;
    const Result cpu = run(mode, Device{});
    const Result gpu = run(mode, kGpu);
    expect_same_losses(gpu.with, cpu.with, "policy");
    expect_same_losses(gpu.trained, cpu.trained, "trained");
    if (mode == TrainMode::Lora) {
      expect_same_losses(gpu.off, cpu.off, "adapter off");
      EXPECT_NE(cpu.off.loss_sum[0], cpu.with.loss_sum[0]);
    }
    ASSERT_EQ(gpu.names, cpu.names);
    ASSERT_FALSE(cpu.names.empty());
    // Both sides are f32 with sums in other orders (the simulated kernels' vs OpenBLAS's, whose
    // kernels differ by CPU): a gradient is sums along a chain of at most K terms (the head's
    // vocabulary, and per layer the hidden, intermediate and two token sums), so it is good to
    // K·2⁻²⁴ of its tensor's scale (as expect_adamw_trajectory_matches argues). Measured: 1.0e-5
    // of the scale under OpenBLAS's SkylakeX kernels; a wrong scale or a missed sequence moves
    // gradients by whole percents.
    const ModelConfig c = load_model(shared_dir() + "/models/stories260K", DType::F32).config;
    const double K = static_cast<double>(c.vocab_size + c.num_layers * (2 * c.hidden_size + c.intermediate_size +
                                                                        2 * pair_batch(c.vocab_size).num_tokens()));
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      double scale = 0;
      for (float v : cpu.grads[i]) scale = std::max(scale, static_cast<double>(std::abs(v)));
      if (scale == 0) continue;  // an embedding row no token uses
      EXPECT_TRUE(all_close(gpu.grads[i], cpu.grads[i], Tolerance{K * 0x1p-24 * scale, 0})) << cpu.names[i];
    }
  }
}

// One preference run of tiny-chat on `device`: 2 steps of 2 examples in micro-batches of 1 (so the
// card accumulates), with a held-out evaluation before and after.
TrainOptions preference_options(const std::string& dir, const std::string& device, TrainMethod method, TrainMode mode) {
  TrainOptions o = cuda_trainer::tiny_chat_options(dir, device);
  o.method = method;
  o.mode = mode;
  // The shipped pairs with the shortest prompts (the simulated card is slow: its time grows with
  // the sequences' length): four to train on (two steps of two), two held out.
  auto shortest = [&](const std::string& from, const std::string& to, size_t n) {
    std::ifstream in(source_dir() + "/examples/preference/" + from);
    std::ofstream out(dir + "/" + to);
    std::string line;
    size_t kept = 0;
    while (kept < n && std::getline(in, line))
      if (nlohmann::json::parse(line)["prompt"].get<std::string>().size() <= 60) {
        out << line << "\n";
        ++kept;
      }
    return dir + "/" + to;
  };
  o.data_path = shortest("pairs.jsonl", "pairs.jsonl", 4);
  o.eval_data_path = shortest("pairs_holdout.jsonl", "heldout.jsonl", 2);
  o.holdout = 0.0;
  o.steps = 2;
  o.batch_size = 2;
  o.micro_batch_size = 1;
  o.max_seq_length = 96;  // every pair above whole
  o.lora.dropout = 0.0f;
  o.gradient_checkpointing = false;
  o.lr = mode == TrainMode::Full ? 1e-3 : 5e-3;
  return o;
}

// In the CudaTrainer suite, which the numeric variant reruns leave out (tests/CMakeLists.txt): a
// run on the simulated card takes tens of seconds.
TEST(CudaTrainer, PreferenceRunsMatchTheCpu) {
  struct Case {
    TrainMethod method;
    TrainMode mode;
    const char* name;
  };
  for (const Case c : {Case{TrainMethod::Dpo, TrainMode::Lora, "dpo lora, adapter-off reference"},
                       Case{TrainMethod::Dpo, TrainMode::Full, "dpo full, precomputed reference"}}) {
    SCOPED_TRACE(c.name);
    TempDir cpu_dir, gpu_dir;
    const TrainSummary ref = Trainer(preference_options(cpu_dir.path, "cpu", c.method, c.mode)).run();
    SimulatedCudaDevice card;
    SimulatedComputeCapability t4(7, 5);  // f32 attention, as trainer_cuda_test.cpp's f32 runs
    TrainOptions go = preference_options(gpu_dir.path, "cuda", c.method, c.mode);
    Trainer trainer(go);
    const TrainSummary got = trainer.run();
    EXPECT_EQ(trainer.model().device(), kGpu);
    EXPECT_EQ(got.peak_memory_bytes, card.allocator().stats().bytes_peak) << "the card's allocator was the run's";
    ASSERT_EQ(got.steps_done, 2);
    // Sequence log-probabilities are sums over a sequence's tokens, the losses smooth functions of
    // their differences: f32 sums in another order, the default RunTolerance.
    cuda_trainer::expect_losses_close(got, ref);
    ASSERT_TRUE(got.final_eval_loss && ref.final_eval_loss);
    // After AdamW updates an f32 difference in the last bit of a near-zero gradient component can
    // move its weight by up to 2·lr (trainer_cuda_test.cpp, FullFineTuningMatchesCpu): the final
    // evaluation is held to the bound the SFT runs use there (measured: 3e-5 relative).
    const double tol = cuda_trainer::kBf16HeldRunTolerance.loss;
    EXPECT_NEAR(*got.final_eval_loss, *ref.final_eval_loss, tol * *ref.final_eval_loss)
        << got.final_eval_metrics.dump() << "\n"
        << ref.final_eval_metrics.dump();
    ASSERT_TRUE(ref.final_eval_metrics.contains("eval_rewards/chosen")) << ref.final_eval_metrics.dump();
    for (const auto& [k, v] : ref.final_eval_metrics.items()) {
      ASSERT_TRUE(got.final_eval_metrics.contains(k)) << k;
      if (k.find("logps") != std::string::npos || k.find("rewards/") != std::string::npos) {
        EXPECT_NEAR(got.final_eval_metrics[k].get<double>(), v.get<double>(),
                    tol * std::max(1.0, std::fabs(v.get<double>())))
            << k;
      }
    }
    EXPECT_NE(ref.final_eval_metrics["eval_rewards/chosen"].get<double>(), 0.0) << "the runs trained";
  }
}

}  // namespace
}  // namespace bp::test
