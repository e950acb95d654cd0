// A tiny Qwen3-MoE (one dense layer between sparse ones) and Mixtral run on the simulated card: the
// model's sparse blocks (model/transformer_moe.cpp) through the CUDA MoE kernels (moe.cuh) and the
// per-expert GEMMs over host_offsets give the CPU's logits. Frozen weights in f32.
#include <gtest/gtest.h>

#include "model/loader.h"
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
  const std::vector<int32_t> ids = {1, 40, 7, 26, 37, 5, 24, 2, 17, 30, 11, 3, 9};
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  const auto T = static_cast<int64_t>(ids.size());
  return m.logits(Tensor::from_vector(ids, {T}), Tensor::from_vector(pos, {T})).to_vector();
}

TEST(CudaMoeModel, LogitsMatchCpu) {
  SimulatedCudaDevice card;
  const nlohmann::json qwen = {{"architectures", {"Qwen3MoeForCausalLM"}},
                               {"vocab_size", 48},
                               {"hidden_size", 32},
                               {"intermediate_size", 40},
                               {"moe_intermediate_size", 24},
                               {"num_experts", 5},
                               {"num_experts_per_tok", 2},
                               {"norm_topk_prob", true},
                               {"mlp_only_layers", {1}},
                               {"num_hidden_layers", 3},
                               {"num_attention_heads", 4},
                               {"num_key_value_heads", 2},
                               {"head_dim", 8},
                               {"torch_dtype", "float32"}};
  nlohmann::json mixtral = qwen;
  mixtral["architectures"] = {"MixtralForCausalLM"};
  mixtral["num_local_experts"] = 3;
  mixtral.erase("num_experts");
  for (const nlohmann::json& j : {qwen, mixtral}) {
    const ModelConfig c = ModelConfig::from_json(j, "tiny moe");
    SCOPED_TRACE(c.architecture_name);
    const ModelWeights w = init_random_weights(c, 21);
    const std::vector<float> ref = logits_on(w, Device{});
    const uint64_t launches = sim::launch_count();
    EXPECT_TRUE(all_close(logits_on(w, kGpu), ref, {1e-4, 1e-4}));
    EXPECT_GT(sim::launch_count(), launches);  // the simulated kernels ran, not the CPU's
  }
}

}  // namespace
}  // namespace bp::test
