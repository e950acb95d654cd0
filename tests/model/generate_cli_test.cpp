// `backprop generate` end to end on stories260K: greedy output equals llama2.c's golden text and
// ids, sampling is reproducible by seed, an adapter changes the output exactly as the in-process
// model with that adapter does, and bad input gives the documented exit codes.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/generate.h"
#include "model/loader.h"
#include "model/lora.h"
#include "model/peft.h"
#include "model/transformer.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

std::string model_dir() {
  return shared_dir() + "/models/stories260K";
}

nlohmann::json run_json(const std::string& args, int* rc_out = nullptr) {
  std::string out;
  const int rc =
      run_command(backprop_exe() + " generate --json --model " + model_dir() + " " + args + " 2>/dev/null", &out);
  if (rc_out) *rc_out = rc;
  EXPECT_EQ(rc, 0) << out;
  return rc == 0 ? nlohmann::json::parse(out) : nlohmann::json();
}

TEST(GenerateCli, GreedyMatchesGoldenTextAndIds) {
  std::ifstream f(model_dir() + "/golden/greedy.json");
  auto golden = nlohmann::json::parse(f);
  auto s = golden["samples"][0];
  auto j = run_json("--prompt \"Once upon a time\" --temperature 0 --max-new-tokens 64");
  EXPECT_EQ(j["prompt_ids"], s["input_ids"]);
  EXPECT_EQ(j["output_ids"], s["output_ids"]);
  EXPECT_EQ(j["text"], s["text"]);
  EXPECT_EQ(j["stop_reason"], "max_new_tokens");
}

TEST(GenerateCli, SamplingIsReproducibleBySeed) {
  auto a = run_json("--prompt \"The dog\" --temperature 1.0 --top-k 50 --top-p 0.9 --seed 7 --max-new-tokens 30");
  auto b = run_json("--prompt \"The dog\" --temperature 1.0 --top-k 50 --top-p 0.9 --seed 7 --max-new-tokens 30");
  auto c = run_json("--prompt \"The dog\" --temperature 1.0 --top-k 50 --top-p 0.9 --seed 8 --max-new-tokens 30");
  EXPECT_EQ(a["output_ids"], b["output_ids"]);
  EXPECT_NE(a["output_ids"], c["output_ids"]);
}

TEST(GenerateCli, AdapterChangesOutputLikeTheInProcessModel) {
  ModelWeights w = load_model(model_dir());
  const ModelConfig cfg = w.config;
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  LoraAdapter ad = init_lora(cfg, lc, 3);
  for (auto& layer : ad.layers)  // non-zero B so the adapter matters
    for (auto& B : layer.B)
      if (B.defined()) B = random_tensor(B.shape(), 11, -0.3f, 0.3f);
  TempDir dir;
  save_peft_adapter(ad, dir.path);
  Model model(std::move(w), ModelOptions{TrainMode::Lora});
  model.attach_lora(ad);
  GenerateOptions o;
  o.max_new_tokens = 20;
  auto j = run_json("--prompt \"Lily wanted to\" --temperature 0 --max-new-tokens 20 --adapter " + dir.path);
  auto expected = generate(model, j["prompt_ids"].get<std::vector<int32_t>>(), o);
  EXPECT_EQ(j["output_ids"].get<std::vector<int32_t>>(), expected.tokens);
  auto base = run_json("--prompt \"Lily wanted to\" --temperature 0 --max-new-tokens 20");
  EXPECT_NE(base["output_ids"], j["output_ids"]);
}

TEST(GenerateCli, BadInputExitCodes) {
  std::string out;
  EXPECT_EQ(run_command(backprop_exe() + " generate --model " + model_dir() + " --prompt hi --temperature -1", &out), 1)
      << out;
  EXPECT_NE(out.find("INPUT_VALIDATION_FAILED"), std::string::npos) << out;
  EXPECT_EQ(run_command(backprop_exe() + " generate --model /nonexistent/model --prompt hi", &out), 2) << out;
  EXPECT_NE(out.find("DEP_MODEL_LOAD_FAILED"), std::string::npos) << out;
}

}  // namespace
}  // namespace bp::test
