// DoRA (--use-dora) and PiSSA (--init-lora-weights pissa) end to end with the real binary on
// stories260K:
//   - DoRA: a short `backprop train` writes an adapter in PEFT's DoRA layout (use_dora, a
//     lora_magnitude_vector [out] per adapted projection) whose magnitudes trained away from the
//     base rows' norms; `backprop export --format merged` gives a model whose logits are those of
//     the base with the adapter attached (the DoRA forward), and differ from the base's; a GGUF
//     LoRA file of it is refused with its code; DoRA with LoRA dropout trains;
//   - PiSSA: the run's adapter is PEFT's PiSSA-to-LoRA conversion (r and alpha doubled) for the
//     original base, and its merged export gives the logits of the original base with it attached.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/loader.h"
#include "model/lora.h"
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

// `backprop train` on stories260K with `flags`; returns the run folder.
std::string train_run(const std::string& dir, const std::string& flags) {
  std::string out;
  const int rc =
      run_command(fmt::format("({} train --device cpu --json --model {} --data {} --output {}/runs --batch-size 2 "
                              "--threads 1 --lora-r 4 {} 2>/dev/null)",
                              backprop_exe(), model_dir(), write_data(dir), dir, flags),
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
