// The preference methods' model passes on the simulated CUDA device against the CPU: per-sequence
// losses (reference and KL passes, with the adapter switched off), and the per-sequence backward
// whose scales depend on the forward's losses, LoRA (frozen head: dx scaled on the device) and full
// fine-tuning (trainable head: a second pass per sequence into the head's dW). stories260K, f32
// weights: the device's arithmetic is the CPU's, element for element, up to the order of sums.
#include <gtest/gtest.h>

#include <cmath>

#include "model/loader.h"
#include "model/lora.h"
#include "model/model_test_helpers.h"
#include "model/transformer.h"
#include "sim_device.h"
#include "support/test_util.h"

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

}  // namespace
}  // namespace bp::test
