// Mixture-of-Experts end to end with the real binary on a tiny random Qwen3-MoE folder (4 experts,
// top-2, one dense layer; stories260K's tokenizer): LoRA on attention and on every expert's
// projections trains with a falling loss, its PEFT adapter is saved under PEFT's per-expert module
// names and `backprop export --format merged` gives a folder (per-expert tensors under Hugging Face's
// names) whose logits are the base's with the adapter attached; full fine-tuning logs the
// load-balancing loss as aux_loss in metrics.jsonl, and all-linear (which would take the router) is
// refused with its code.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/loader.h"
#include "model/merge.h"
#include "model/peft.h"
#include "moe_cli_util.h"
#include "support/lora_test_util.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

std::vector<nlohmann::json> step_records(const std::string& run) {
  std::vector<nlohmann::json> steps;
  std::ifstream f(run + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json r = nlohmann::json::parse(line);
    if (r.value("type", "") == "step") steps.push_back(r);
  }
  return steps;
}

TEST(MoeCli, LoraOnAttentionAndExpertsTrainsSavesAndMergesToTheSameLogits) {
  TempDir d;
  const std::string model = write_tiny_moe_model(d.path);
  std::string out;
  const std::string run = moe_train(
      d.path, model, "--steps 6 --target-modules q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", &out);
  ASSERT_FALSE(run.empty()) << out;
  const auto steps = step_records(run);
  ASSERT_EQ(steps.size(), 6u);
  EXPECT_LT(steps.back().at("loss").get<double>(), steps.front().at("loss").get<double>());
  EXPECT_GT(steps.front().at("aux_loss").get<double>(), 0.5);  // logged, though the frozen router adds none
  // The PEFT adapter: attention modules of every layer, the dense layer's MLP, every expert's
  // gate/up/down of the two sparse layers (A and B each).
  const SafetensorsReader r = SafetensorsReader::open_file(run + "/adapter/adapter_model.safetensors");
  EXPECT_EQ(r.names().size(), 2u * (4u * 3u + 3u + 2u * 4u * 3u));
  EXPECT_TRUE(r.contains("base_model.model.model.layers.2.self_attn.o_proj.lora_B.weight"));
  EXPECT_TRUE(r.contains("base_model.model.model.layers.1.mlp.gate_proj.lora_A.weight"));
  EXPECT_EQ(r.entry("base_model.model.model.layers.2.mlp.experts.3.down_proj.lora_A.weight").shape,
            (std::vector<int64_t>{16, 32}));  // [r, moe_intermediate_size]
  const nlohmann::json ac = nlohmann::json::parse(std::ifstream(run + "/adapter/adapter_config.json"));
  EXPECT_EQ(ac.at("target_modules").size(), 7u) << ac.dump();
  ModelWeights base = load_model(model);
  LoraAdapter ad = load_peft_adapter(run + "/adapter", base.config);
  const int rc = run_command(
      fmt::format("({} export --json {} --format merged --output {}/merged 2>&1)", backprop_exe(), run, d.path), &out);
  ASSERT_EQ(rc, 0) << out;
  const SafetensorsReader merged = SafetensorsReader::open_model(d.path + "/merged");
  EXPECT_TRUE(merged.contains("model.layers.0.mlp.experts.3.down_proj.weight"));
  EXPECT_TRUE(merged.contains("model.layers.2.mlp.gate.weight"));
  EXPECT_TRUE(merged.contains("model.layers.1.mlp.gate_proj.weight"));  // the dense layer
  expect_merged_logits_match(std::move(base), ad, load_model(d.path + "/merged"), 1e-4);
}

TEST(MoeCli, FullFineTuningLogsTheAuxLossAndAllLinearIsRefused) {
  TempDir d;
  const std::string model = write_tiny_moe_model(d.path);
  std::string out;
  const std::string run = moe_train(d.path, model, "--steps 3 --mode full --router-aux-loss-coef 0.01", &out);
  ASSERT_FALSE(run.empty()) << out;
  const auto steps = step_records(run);
  ASSERT_EQ(steps.size(), 3u);
  for (const auto& s : steps) EXPECT_GT(s.at("aux_loss").get<double>(), 0.5) << s.dump();
  // all-linear (the default) would take the router too (PEFT's mlp.gate is a linear module): refused.
  std::string err;
  EXPECT_TRUE(moe_train(d.path, model, "--steps 1", &err).empty());
  EXPECT_NE(err.find("CONFIG_INVALID_SETTING"), std::string::npos) << err;
  EXPECT_NE(err.find("would include the router"), std::string::npos) << err;
}

// multi-run merges adapters between runs; the experts' LoRA is not merged yet: refused up front.
TEST(MoeCli, MultiRunRefusesExpertLora) {
  TempDir d;
  const std::string model = write_tiny_moe_model(d.path);
  std::string out;
  const int rc = run_command(fmt::format("({} multi-run --device cpu --model {} --data {} --output {}/multi --runs 2 "
                                         "--steps 1 --threads 1 --target-modules q_proj,gate_proj 2>&1)",
                                         backprop_exe(), model, write_moe_data(d.path), d.path),
                             &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("CONFIG_INVALID_SETTING"), std::string::npos) << out;
  EXPECT_NE(out.find("cannot be merged between runs yet"), std::string::npos) << out;
}

}  // namespace
}  // namespace bp::test
