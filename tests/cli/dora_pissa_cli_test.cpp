// DoRA (--use-dora) and PiSSA (--init-lora-weights pissa) end to end with the real binary on
// stories260K:
//   - DoRA: a short `backprop train` writes an adapter in PEFT's DoRA layout (use_dora, a
//     lora_magnitude_vector [out] per adapted projection) whose magnitudes trained away from the
//     base rows' norms; `backprop export --format merged` gives a model whose logits are those of
//     the base with the adapter attached (the DoRA forward), and differ from the base's; a GGUF
//     LoRA file of it is refused with its code; DoRA with LoRA dropout trains;
//   - PiSSA: the run's adapter is PEFT's PiSSA-to-LoRA conversion (r and alpha doubled) for the
//     original base, and its merged export gives the logits of the original base with it attached;
//   - both on a tiny Phi-3 (fused qkv_proj / gate_up_proj: PEFT's one module each, one magnitude over
//     its rows, one SVD of its fused weight): trained, saved in PEFT's layout, reloaded, merged.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/loader.h"
#include "model/lora.h"
#include "model/merge.h"
#include "model/peft.h"
#include "model/transformer.h"
#include "model/weight_names.h"
#include "support/lora_test_util.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

namespace fs = std::filesystem;

std::string model_dir() {
  return shared_dir() + "/models/stories260K";
}

std::string write_data(const std::string& dir) {
  const std::string data = dir + "/data.jsonl";
  std::ofstream f(data);
  const char* names[] = {"Lily", "Tom", "Ben", "Sue"};
  for (int i = 0; i < 8; ++i)
    f << "{\"text\": \"" << names[i % 4] << " had a red ball. " << names[(i + 1) % 4] << " liked it.\"}\n";
  return data;
}

// `backprop train` on stories260K (or `model`) with `flags`; returns the run folder.
std::string train_run(const std::string& dir, const std::string& flags, const std::string& model = model_dir()) {
  std::string out;
  const int rc =
      run_command(fmt::format("({} train --device cpu --json --model {} --data {} --output {}/runs --batch-size 2 "
                              "--threads 1 --lora-r 4 {} 2>/dev/null)",
                              backprop_exe(), model, write_data(dir), dir, flags),
                  &out);
  EXPECT_EQ(rc, 0) << out;
  return rc == 0 ? nlohmann::json::parse(out).at("output_dir").get<std::string>() : "";
}

// `backprop export RUN --format merged` gives the logits of `base` with the run's adapter `ad`.
void expect_merged_export_matches(const std::string& run, const std::string& dir, ModelWeights base, LoraAdapter& ad) {
  std::string out;
  const int rc = run_command(
      fmt::format("({} export --json {} --format merged --output {}/merged 2>/dev/null)", backprop_exe(), run, dir),
      &out);
  ASSERT_EQ(rc, 0) << out;
  expect_merged_logits_match(std::move(base), ad, load_model(dir + "/merged"), 1e-3);
}

TEST(DoraCli, TrainsSavesAsPeftAndMergesToTheSameLogits) {
  TempDir d;
  const std::string run = train_run(d.path, "--steps 4 --lr 0.05 --use-dora");
  ASSERT_FALSE(run.empty());
  const std::string adapter_dir = run + "/adapter";
  const nlohmann::json cfg_json = nlohmann::json::parse(std::ifstream(adapter_dir + "/adapter_config.json"));
  EXPECT_EQ(cfg_json["use_dora"], true);

  ModelWeights base = load_model(model_dir());
  const ModelConfig cfg = base.config;
  LoraAdapter ad = load_peft_adapter(adapter_dir, cfg);
  ASSERT_TRUE(ad.config.use_dora);
  SafetensorsReader r = SafetensorsReader::open_file(adapter_dir + "/adapter_model.safetensors");
  EXPECT_EQ(r.names().size(), 3u * 7u * static_cast<size_t>(cfg.num_layers));
  EXPECT_EQ(r.entry("base_model.model.model.layers.0.mlp.up_proj.lora_magnitude_vector").shape,
            (std::vector<int64_t>{cfg.intermediate_size}));
  // The magnitudes started at ||W_j|| and trained.
  const Tensor norms = weight_row_norms(weight_ref(base, WeightRole::Q, 0), false);
  EXPECT_GT(max_abs_diff(ad.layers[0].m(LoraTarget::Q).to_vector(), norms.to_vector()), 1e-4);

  expect_merged_export_matches(run, d.path, std::move(base), ad);

  std::string out;
  const int rc = run_command(
      fmt::format("({} export --json {} --format gguf-lora --output {}/a.gguf)", backprop_exe(), run, d.path), &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("RUNTIME_GGUF_EXPORT_FAILED"), std::string::npos) << out;
  EXPECT_NE(out.find("DoRA"), std::string::npos) << out;
}

TEST(PissaCli, TrainsAndSavesTheLoraOfTheOriginalBase) {
  TempDir d;
  const std::string run = train_run(d.path, "--steps 3 --lr 0.02 --lora-alpha 8 --init-lora-weights pissa");
  ASSERT_FALSE(run.empty());
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(run + "/adapter/adapter_config.json"));
  EXPECT_EQ(j["r"], 8);
  EXPECT_EQ(j["lora_alpha"], 16);
  EXPECT_EQ(j["init_lora_weights"], true);
  ModelWeights base = load_model(model_dir());
  LoraAdapter ad = load_peft_adapter(run + "/adapter", base.config);
  expect_merged_export_matches(run, d.path, std::move(base), ad);
}

// A tiny random Phi-3 (q 64 + k 32 + v 32 rows in qkv_proj, gate_up_proj 2 x 96, partial rotary)
// with stories260K's vocabulary and tokenizer.
std::string write_tiny_phi3(const std::string& dir) {
  const nlohmann::json j = {{"architectures", {"Phi3ForCausalLM"}},
                            {"vocab_size", 512},
                            {"hidden_size", 64},
                            {"intermediate_size", 96},
                            {"num_hidden_layers", 2},
                            {"num_attention_heads", 4},
                            {"num_key_value_heads", 2},
                            {"partial_rotary_factor", 0.5},
                            {"max_position_embeddings", 512},
                            {"initializer_range", 0.1},
                            {"bos_token_id", 1},
                            {"eos_token_id", 2},
                            {"tie_word_embeddings", false},
                            {"torch_dtype", "float32"}};
  SaveModelOptions o;
  o.copy_files_from = model_dir();
  save_hf_model(init_random_weights(ModelConfig::from_json(j, "tiny phi3"), 7), dir + "/phi3", o);
  return dir + "/phi3";
}

// DoRA on Phi-3's fused modules: `backprop train --use-dora` saves PEFT's one lora_magnitude_vector
// per fused module (over all its rows), which trained away from the fused weight's row norms, reloads
// into the members' rows, and the merged export is the DoRA forward.
TEST(DoraCli, Phi3FusedModulesTrainSaveAndMerge) {
  TempDir d;
  const std::string model = write_tiny_phi3(d.path);
  const std::string run = train_run(d.path, "--steps 3 --lr 0.05 --use-dora", model);
  ASSERT_FALSE(run.empty());
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(run + "/adapter/adapter_config.json"));
  EXPECT_EQ(j["use_dora"], true);
  EXPECT_EQ(j["target_modules"], nlohmann::json({"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
  SafetensorsReader r = SafetensorsReader::open_file(run + "/adapter/adapter_model.safetensors");
  EXPECT_EQ(r.names().size(), 3u * 4u * 2u);
  EXPECT_EQ(r.entry("base_model.model.model.layers.1.self_attn.qkv_proj.lora_magnitude_vector").shape,
            (std::vector<int64_t>{128}));
  EXPECT_EQ(r.entry("base_model.model.model.layers.1.mlp.gate_up_proj.lora_magnitude_vector").shape,
            (std::vector<int64_t>{192}));

  ModelWeights base = load_model(model);
  LoraAdapter ad = load_peft_adapter(run + "/adapter", base.config);
  ASSERT_TRUE(ad.config.use_dora);
  const LoraLayer& l0 = ad.layers[0];
  const std::vector<const Tensor*> qkv = {&base.layers[0].q, &base.layers[0].k, &base.layers[0].v};
  EXPECT_GT(max_abs_diff(fused_rows_of(l0.M, kLoraFusedModules[0]).to_vector(),
                         weight_row_norms(join_rows_or_copy(qkv), false).to_vector()),
            1e-4);
  expect_merged_export_matches(run, d.path, std::move(base), ad);
}

// PiSSA on Phi-3's fused modules: the saved conversion (r 8, alpha 16) for the original base, its
// A' one per fused module, merges to the trained model's logits.
TEST(PissaCli, Phi3FusedModulesTrainAndSaveTheLoraOfTheOriginalBase) {
  TempDir d;
  const std::string model = write_tiny_phi3(d.path);
  const std::string run = train_run(d.path, "--steps 3 --lr 0.02 --lora-alpha 8 --init-lora-weights pissa", model);
  ASSERT_FALSE(run.empty());
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(run + "/adapter/adapter_config.json"));
  EXPECT_EQ(j["r"], 8);
  EXPECT_EQ(j["lora_alpha"], 16);
  SafetensorsReader r = SafetensorsReader::open_file(run + "/adapter/adapter_model.safetensors");
  EXPECT_EQ(r.entry("base_model.model.model.layers.0.mlp.gate_up_proj.lora_B.weight").shape,
            (std::vector<int64_t>{192, 8}));
  ModelWeights base = load_model(model);
  LoraAdapter ad = load_peft_adapter(run + "/adapter", base.config);
  expect_merged_export_matches(run, d.path, std::move(base), ad);
}

// DoRA with LoRA dropout trains (ops/linear.h "DoRA"; its numbers: tests/ops/dora_dropout_test.cpp)
// and saves PEFT's layout with the dropout recorded.
TEST(DoraCli, DoraWithDropoutTrains) {
  TempDir d;
  std::string out;
  const int rc = run_command(fmt::format("{} train --device cpu --model {} --data {} --output {}/runs --steps 2 "
                                         "--use-dora --lora-dropout 0.1 --save-every 0",
                                         backprop_exe(), model_dir(), write_data(d.path), d.path),
                             &out);
  ASSERT_EQ(rc, 0) << out;
  std::string run;
  for (const auto& e : std::filesystem::directory_iterator(d.path + "/runs")) run = e.path().string();
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(run + "/adapter/adapter_config.json"));
  EXPECT_EQ(j["use_dora"], true);
  EXPECT_NEAR(j["lora_dropout"].get<double>(), 0.1, 1e-6);
}

}  // namespace
}  // namespace bp::test
