// A Mixture-of-Experts LoRA run exported as GGUF with the real binary: a tiny random Qwen3-MoE (every
// layer sparse, as llama.cpp's qwen3moe has them; stories260K's tokenizer) trains LoRA on attention,
// `backprop export --format gguf` merges the adapter and writes qwen3moe with stacked experts, and
// `--model FILE.gguf` reads it back to the logits of the base with the adapter attached.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hub/gguf_source.h"
#include "io/gguf_reader.h"
#include "model/loader.h"
#include "model/merge.h"
#include "model/peft.h"
#include "support/lora_test_util.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

// A random Qwen3-MoE with every layer sparse, hidden width `D` (experts D / 2 wide), saved with
// stories260K's tokenizer, and the data file beside it.
std::string write_moe_model(const std::string& dir, int64_t D) {
  const nlohmann::json j = {{"architectures", {"Qwen3MoeForCausalLM"}},
                            {"vocab_size", 512},
                            {"hidden_size", D},
                            {"intermediate_size", 96},
                            {"moe_intermediate_size", D / 2},
                            {"num_experts", 4},
                            {"num_experts_per_tok", 2},
                            {"norm_topk_prob", true},
                            {"num_hidden_layers", 2},
                            {"num_attention_heads", 4},
                            {"num_key_value_heads", 2},
                            {"head_dim", D / 4},
                            {"max_position_embeddings", 512},
                            {"initializer_range", 0.1},
                            {"bos_token_id", 1},
                            {"eos_token_id", 2},
                            {"tie_word_embeddings", false},
                            {"torch_dtype", "float32"}};
  const std::string model = dir + "/moe";
  SaveModelOptions o;
  o.copy_files_from = shared_dir() + "/models/stories260K";
  save_hf_model(init_random_weights(ModelConfig::from_json(j, "tiny moe"), 9), model, o);
  std::ofstream f(dir + "/data.jsonl");
  for (int i = 0; i < 8; ++i) f << "{\"text\": \"Lily had a red ball. Tom liked it. They played in the sun.\"}\n";
  return model;
}

// `backprop train` of `model` (LoRA on q and v); the run's folder, or "" with the output in *out.
std::string train(const std::string& dir, const std::string& model, std::string* out) {
  const int rc = run_command(fmt::format("({} train --device cpu --json --model {} --data {}/data.jsonl --output "
                                         "{}/runs --batch-size 4 --threads 1 --lr 0.02 --steps 3 --target-modules "
                                         "q_proj,v_proj 2>&1)",
                                         backprop_exe(), model, dir, dir),
                             out);
  if (rc != 0) return "";
  const size_t brace = out->rfind("\n{");
  return nlohmann::json::parse(brace == std::string::npos ? *out : out->substr(brace + 1))
      .at("output_dir")
      .get<std::string>();
}

TEST(MoeGgufCli, MergedLoraRunExportsAsQwen3MoeAndReadsBackToTheSameLogits) {
  TempDir d;
  const std::string model = write_moe_model(d.path, 64);
  std::string out;
  const std::string run = train(d.path, model, &out);
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
  const std::string model = write_moe_model(d.path, 256);
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
  const std::string run = train(d.path, gguf, &out);
  ASSERT_FALSE(run.empty()) << out;
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
