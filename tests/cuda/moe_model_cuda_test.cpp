// A tiny Qwen3-MoE (one dense layer between sparse ones) and Mixtral run on the simulated card: the
// model's sparse blocks (model/transformer_moe.cpp) through the CUDA MoE kernels (moe.cuh) and the
// per-expert GEMMs over host_offsets give the CPU's logits. Frozen weights in f32.
#include <gtest/gtest.h>

#include "model/loader.h"
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

}  // namespace
}  // namespace bp::test
