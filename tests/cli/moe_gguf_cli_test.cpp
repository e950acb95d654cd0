// A Mixture-of-Experts LoRA run exported as GGUF with the real binary: a tiny random Qwen3-MoE (every
// layer sparse, as llama.cpp's qwen3moe has them; stories260K's tokenizer) trains LoRA on attention
// and the experts, `backprop export --format gguf` merges the adapter (per expert) and writes
// qwen3moe with stacked experts, and `--model FILE.gguf` reads it back to the logits of the base with
// the adapter attached; a q4_K_M file trains LoRA with its experts held quantized and writes the
// GGUF LoRA adapter with the experts' LoRA stacked.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hub/gguf_source.h"
#include "io/gguf_reader.h"
#include "model/loader.h"
#include "model/merge.h"
#include "model/peft.h"
#include "moe_cli_util.h"
#include "support/lora_test_util.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

// Every layer sparse (llama.cpp's qwen3moe has no dense ones), hidden width D, experts D / 2 wide.
std::string write_all_sparse_moe(const std::string& dir, int64_t D) {
  return write_tiny_moe_model(dir,
                              {{"hidden_size", D},
                               {"moe_intermediate_size", D / 2},
                               {"head_dim", D / 4},
                               {"num_hidden_layers", 2},
                               {"mlp_only_layers", nullptr}},
                              9);
}

// LoRA on q, v and every expert's projections.
constexpr const char* kTrainFlags = "--steps 3 --target-modules q_proj,v_proj,gate_proj,up_proj,down_proj";

TEST(MoeGgufCli, MergedLoraRunExportsAsQwen3MoeAndReadsBackToTheSameLogits) {
  TempDir d;
  const std::string model = write_all_sparse_moe(d.path, 64);
  std::string out;
  const std::string run = moe_train(d.path, model, kTrainFlags, &out);
  ASSERT_FALSE(run.empty()) << out;
  const std::string gguf = d.path + "/moe.gguf";
  const int rc = run_command(
      fmt::format("({} export --json {} --format gguf --quantization f32 --output {} 2>&1)", backprop_exe(), run, gguf),
      &out);
  ASSERT_EQ(rc, 0) << out;
  const GGUFReader r(gguf);
  EXPECT_EQ(r.get_string("general.architecture"), "qwen3moe");
  EXPECT_EQ(r.get_int("qwen3moe.expert_count"), 4);
  EXPECT_NE(r.find_tensor("blk.1.ffn_down_exps.weight"), nullptr);
  ModelWeights base = load_model(model);
  LoraAdapter ad = load_peft_adapter(run + "/adapter", base.config);
  TempDir derived;
  expect_merged_logits_match(std::move(base), ad, load_model(hub::gguf_model_folder(gguf, derived.path)), 1e-4);
}

// A q4_K_M file of the base (256 wide: whole K-quant blocks) trains LoRA from the GGUF with the
// experts held in their stored types (q4_K; ffn_down_exps q6_K where llama.cpp gives it more bits).
TEST(MoeGgufCli, LoraTrainsFromAQ4KFileWithTheExpertsHeldQuantized) {
  TempDir d;
  const std::string model = write_all_sparse_moe(d.path, 256);
  const std::string gguf = d.path + "/moe-q4_k_m.gguf";
  std::string out;
  ASSERT_EQ(run_command(fmt::format("({} export {} --format gguf --quantization q4_k_m --output {} 2>&1)",
                                    backprop_exe(), model, gguf),
                        &out),
            0)
      << out;
  EXPECT_EQ(GGUFReader(gguf).find_tensor("blk.0.ffn_gate_exps.weight")->type, GGMLType::Q4_K);
  TempDir derived;
  const ModelWeights held = load_model(hub::gguf_model_folder(gguf, derived.path), std::nullopt);
  EXPECT_EQ(held.layers[0].experts_gate.dtype(), DType::Q4_K);
  const std::string run = moe_train(d.path, gguf, kTrainFlags, &out);
  ASSERT_FALSE(run.empty()) << out;
  // A run from a GGUF base also writes its GGUF LoRA adapter: the experts' LoRA stacked on ffn_*_exps.
  const GGUFReader adapter(run + "/adapter.gguf");
  EXPECT_EQ(adapter.find_tensor("blk.1.ffn_down_exps.weight.lora_b")->shape,
            (std::vector<int64_t>{4, 256, 16}));  // [E, out, r 16]
  std::ifstream f(run + "/metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json r = nlohmann::json::parse(line);
    if (r.value("type", "") != "step") continue;
    ++steps;
    EXPECT_TRUE(std::isfinite(r.at("loss").get<double>())) << line;
  }
  EXPECT_EQ(steps, 3);
}

}  // namespace
}  // namespace bp::test
