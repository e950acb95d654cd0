// A tiny Qwen3-MoE (one dense layer between sparse ones) and Mixtral run on the simulated card: the
// model's sparse blocks (model/transformer_moe.cpp) through the CUDA MoE kernels (moe.cuh) and the
// per-expert GEMMs over host_offsets give the CPU's logits. Frozen weights in f32. A LoRA training step
// on the card (all-linear: attention, every expert and the router, the aux loss on; DoRA on the experts)
// gives the CPU's loss, aux loss and every gradient.
#include <gtest/gtest.h>

#include <algorithm>
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

std::vector<float> logits_on(const ModelWeights& w, Device device) {
  ModelWeights copy = w;
  Model m(std::move(copy), ModelOptions{TrainMode::Frozen});
  for (auto& [name, t] : m.named_weights()) *t = t->to(device);
  m.set_training(false);
  std::vector<int32_t> ids(13);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7 + 1) % w.config.vocab_size);
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  const auto T = static_cast<int64_t>(ids.size());
  return m.logits(Tensor::from_vector(ids, {T}), Tensor::from_vector(pos, {T})).to_vector();
}

TEST(CudaMoeModel, LogitsMatchCpu) {
  SimulatedCudaDevice card;
  TinySpec qwen, mixtral;  // Qwen3-MoE: 5 experts, top-2, layer 1 dense; Mixtral: 3 experts, top-2
  qwen.arch = Arch::Qwen3Moe, qwen.layers = 3, qwen.tied = false;
  qwen.hf = {{"num_experts", 5},
             {"num_experts_per_tok", 2},
             {"moe_intermediate_size", 24},
             {"norm_topk_prob", true},
             {"mlp_only_layers", {1}}};
  mixtral.arch = Arch::Mixtral, mixtral.inter = 24;
  mixtral.hf = {{"num_local_experts", 3}, {"num_experts_per_tok", 2}};
  for (const TinySpec& spec : {qwen, mixtral}) {
    const ModelConfig c = tiny_config(spec);
    SCOPED_TRACE(c.architecture_name);
    const ModelWeights w = tiny_weights(c, 21);
    const std::vector<float> ref = logits_on(w, Device{});
    const uint64_t launches = sim::launch_count();
    EXPECT_TRUE(all_close(logits_on(w, kGpu), ref, {1e-4, 1e-4}));
    EXPECT_GT(sim::launch_count(), launches);  // the simulated kernels ran, not the CPU's
  }
}

// One LoRA step (dropout 0.1, random B) on `device`: the loss, aux loss and every trainable gradient.
struct MoeStep {
  double loss = 0, aux = 0;
  std::vector<std::string> names;
  std::vector<std::vector<float>> grads;
};
MoeStep lora_step(const ModelConfig& c, const LoraConfig& lc, Device device) {
  ModelWeights w = tiny_weights(c, 21);
  LoraAdapter ad = init_lora(c, lc, 7);
  init_dora_magnitudes(ad, w);
  uint64_t seed = 100;
  for (LoraLayer& l : ad.layers) {
    for (Tensor& B : l.expert_B)
      if (B.defined()) B = random_tensor(B.shape(), seed++, -0.2f, 0.2f);
    for (LoraTarget t : kAllLoraTargets)
      if (l.has(t)) l.b(t) = random_tensor(l.b(t).shape(), seed++, -0.2f, 0.2f);
    if (l.router_B.defined()) l.router_B = random_tensor(l.router_B.shape(), seed++, -0.5f, 0.5f);
  }
  copy_adapter_tensors(ad, [&](const Tensor& t) { return t.to(device); });
  Model m(std::move(w), ModelOptions{TrainMode::Lora, true});
  for (auto& [name, t] : m.named_weights()) *t = t->to(device);
  m.attach_lora(ad);
  const Batch batch = tiny_batch(c.vocab_size, 3);
  MoeStep r;
  r.loss = m.forward_backward(batch, 1.0f / static_cast<float>(batch.num_label_tokens()), 42).mean();
  r.aux = m.last_aux_loss();
  for (auto& p : m.trainable_parameters()) {
    r.names.push_back(p.name);
    r.grads.push_back(p.grad->to_vector());
  }
  return r;
}

TEST(CudaMoeModel, RouterLoraAndExpertDoraStepMatchesCpu) {
  SimulatedCudaDevice card;
  TinySpec qwen;
  qwen.arch = Arch::Qwen3Moe, qwen.layers = 3, qwen.tied = false;
  qwen.hf = {{"num_experts", 4},       {"num_experts_per_tok", 2}, {"moe_intermediate_size", 24},
             {"norm_topk_prob", true}, {"mlp_only_layers", {1}},   {"router_aux_loss_coef", 0.5}};
  const ModelConfig c = tiny_config(qwen);
  LoraConfig all;
  all.r = 4;
  all.alpha = 8.0f;
  all.dropout = 0.1f;
  all.target_modules = {"all-linear"};
  LoraConfig dora = all;
  dora.use_dora = true;
  dora.target_modules = {"q_proj", "gate_proj", "up_proj", "down_proj"};
  for (const LoraConfig& lc : {all, dora}) {
    SCOPED_TRACE(lc.use_dora ? "DoRA on the experts" : "all-linear");
    const MoeStep cpu = lora_step(c, lc, Device{});
    const MoeStep gpu = lora_step(c, lc, kGpu);
    EXPECT_NEAR(gpu.loss, cpu.loss, 1e-5 * std::fabs(cpu.loss));
    EXPECT_NEAR(gpu.aux, cpu.aux, 1e-5 * cpu.aux);
    ASSERT_EQ(gpu.names, cpu.names);
    for (size_t i = 0; i < cpu.names.size(); ++i) {
      double scale = 0;
      for (float v : cpu.grads[i]) scale = std::max(scale, std::fabs(static_cast<double>(v)));
      EXPECT_GT(scale, 0.0) << cpu.names[i];
      EXPECT_TRUE(all_close(gpu.grads[i], cpu.grads[i], {1e-4 * scale, 1e-3})) << cpu.names[i];
    }
  }
}

}  // namespace
}  // namespace bp::test
