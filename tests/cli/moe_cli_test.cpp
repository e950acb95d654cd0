// Mixture-of-Experts end to end with the real binary on a tiny random Qwen3-MoE folder (4 experts,
// top-2, one dense layer; stories260K's tokenizer): LoRA on attention and on every expert's
// projections trains with a falling loss, its PEFT adapter is saved under PEFT's per-expert module
// names and `backprop export --format merged` gives a folder (per-expert tensors under Hugging Face's
// names) whose logits are the base's with the adapter attached; full fine-tuning logs the
// load-balancing loss as aux_loss in metrics.jsonl; all-linear (the default) adapts the router too, as
// PEFT's all-linear does, saved under its module name mlp.gate and reloaded; multi-run merges the
// experts' and routers' LoRA between its runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

TEST(MoeCli, FullFineTuningLogsTheAuxLoss) {
  TempDir d;
  const std::string model = write_tiny_moe_model(d.path);
  std::string out;
  const std::string run = moe_train(d.path, model, "--steps 3 --mode full --router-aux-loss-coef 0.01", &out);
  ASSERT_FALSE(run.empty()) << out;
  const auto steps = step_records(run);
  ASSERT_EQ(steps.size(), 3u);
  for (const auto& s : steps) EXPECT_GT(s.at("aux_loss").get<double>(), 0.5) << s.dump();
}

// all-linear takes every linear module but the output layer, as PEFT's does: attention, the dense
// layer's MLP, every expert's projections and the sparse layers' routers (mlp.gate), whose LoRA is saved
// under PEFT's names, listed as "gate" in target_modules, and reloaded to the same logits.
TEST(MoeCli, AllLinearAdaptsTheRouterSavesAndReloads) {
  TempDir d;
  const std::string model = write_tiny_moe_model(d.path);
  std::string out;
  const std::string run = moe_train(d.path, model, "--steps 2 --target-modules all-linear --lora-r 4", &out);
  ASSERT_FALSE(run.empty()) << out;
  const SafetensorsReader r = SafetensorsReader::open_file(run + "/adapter/adapter_model.safetensors");
  EXPECT_EQ(r.names().size(), 2u * (4u * 3u + 3u + 2u * 4u * 3u + 2u));  // ... + the two routers
  for (const char* layer : {"0", "2"}) {
    const std::string gate = fmt::format("base_model.model.model.layers.{}.mlp.gate", layer);
    ASSERT_TRUE(r.contains(gate + ".lora_A.weight")) << gate;
    EXPECT_EQ(r.entry(gate + ".lora_A.weight").shape, (std::vector<int64_t>{4, 64}));  // [r, hidden]
    EXPECT_EQ(r.entry(gate + ".lora_B.weight").shape, (std::vector<int64_t>{4, 4}));   // [experts, r]
    // B starts at zero (PEFT's init); trained with the aux loss it moved.
    double moved = 0;
    for (float v : r.read(gate + ".lora_B.weight").to_vector()) moved = std::max(moved, std::fabs(double{v}));
    EXPECT_GT(moved, 0.0) << gate;
  }
  EXPECT_FALSE(r.contains("base_model.model.model.layers.1.mlp.gate.lora_A.weight"));  // the dense layer: none
  const nlohmann::json ac = nlohmann::json::parse(std::ifstream(run + "/adapter/adapter_config.json"));
  std::vector<std::string> targets = ac.at("target_modules").get<std::vector<std::string>>();
  std::sort(targets.begin(), targets.end());
  EXPECT_EQ(targets, (std::vector<std::string>{"down_proj", "gate", "gate_proj", "k_proj", "o_proj", "q_proj",
                                               "up_proj", "v_proj"}));
  const std::vector<nlohmann::json> steps = step_records(run);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_GT(steps.front().at("aux_loss").get<double>(), 0.5);
  ModelWeights base = load_model(model);
  LoraAdapter ad = load_peft_adapter(run + "/adapter", base.config);
  ASSERT_TRUE(ad.layers[2].router_A.defined());
  EXPECT_EQ(ad.layers[2].router_B.to_vector(),
            r.read("base_model.model.model.layers.2.mlp.gate.lora_B.weight").to_vector());
  // The merged export applies the routers' LoRA too: the same logits as base + adapter.
  const int rc = run_command(
      fmt::format("({} export --json {} --format merged --output {}/merged 2>&1)", backprop_exe(), run, d.path), &out);
  ASSERT_EQ(rc, 0) << out;
  expect_merged_logits_match(std::move(base), ad, load_model(d.path + "/merged"), 1e-4);
}

// multi-run merges adapters between runs, the experts' (each expert's projection one module) and the
// routers' LoRA too.
TEST(MoeCli, MultiRunMergesExpertAndRouterLora) {
  TempDir d;
  const std::string model = write_tiny_moe_model(d.path);
  std::string out;
  const int rc =
      run_command(fmt::format("({} multi-run --device cpu --model {} --data {} --output {}/multi --runs 2 "
                              "--steps 1 --threads 1 --lora-r 4 --target-modules q_proj,gate_proj,gate 2>&1)",
                              backprop_exe(), model, write_moe_data(d.path), d.path),
                  &out);
  ASSERT_EQ(rc, 0) << out;
  const SafetensorsReader r = SafetensorsReader::open_file(d.path + "/multi/adapter/adapter_model.safetensors");
  EXPECT_TRUE(r.contains("base_model.model.model.layers.0.mlp.experts.3.gate_proj.lora_B.weight"));
  EXPECT_TRUE(r.contains("base_model.model.model.layers.2.mlp.gate.lora_B.weight"));
  EXPECT_TRUE(r.contains("base_model.model.model.layers.1.mlp.gate_proj.lora_A.weight"));
  EXPECT_EQ(r.names().size(), 2u * (3u + 1u + 2u * 4u + 2u));
  // Run 2 started from the merge of run 1 (its init: the merge, A's rows orthonormalised): one step at
  // the default learning rate moves an expert's and the router's A by far less than a fresh A differs.
  const std::string init = d.path + "/multi/run-2/init/adapter_model.safetensors";
  std::string trained;
  for (const auto& f : std::filesystem::recursive_directory_iterator(d.path + "/multi/run-2"))
    if (f.path().filename() == "adapter_model.safetensors" && f.path().string().find("/init/") == std::string::npos &&
        f.path().string().find("/gate/") == std::string::npos)
      trained = f.path().string();
  ASSERT_FALSE(trained.empty());
  const SafetensorsReader ri = SafetensorsReader::open_file(init), rt = SafetensorsReader::open_file(trained);
  for (const char* name : {"base_model.model.model.layers.2.mlp.gate.lora_A.weight",
                           "base_model.model.model.layers.0.mlp.experts.1.gate_proj.lora_A.weight"}) {
    const std::vector<float> a = ri.read(name).to_vector(), b = rt.read(name).to_vector();
    double diff = 0, size = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
      size = std::max(size, std::fabs(static_cast<double>(a[i])));
    }
    EXPECT_LT(diff, 0.01) << name;
    EXPECT_GT(size, 0.05) << name;
  }
}

}  // namespace
}  // namespace bp::test
