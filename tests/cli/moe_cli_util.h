// Tiny Mixture-of-Experts fixtures of the CLI tests (tests/cli/moe_cli_test.cpp,
// moe_gguf_cli_test.cpp): a random Qwen3-MoE folder with stories260K's vocabulary and tokenizer,
// a small data file, and a `backprop train --device cpu` run of it.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "model/loader.h"
#include "model/merge.h"
#include "support/test_util.h"

namespace bp::test {

// 4 experts, top-2, 64 wide, 3 layers with layer 1 dense; `changes` replace keys (null removes one).
inline std::string write_tiny_moe_model(const std::string& dir,
                                        const nlohmann::json& changes = nlohmann::json::object(), uint64_t seed = 7) {
  nlohmann::json j = {{"architectures", {"Qwen3MoeForCausalLM"}},
                      {"vocab_size", 512},
                      {"hidden_size", 64},
                      {"intermediate_size", 96},
                      {"moe_intermediate_size", 32},
                      {"num_experts", 4},
                      {"num_experts_per_tok", 2},
                      {"norm_topk_prob", true},
                      {"mlp_only_layers", {1}},
                      {"num_hidden_layers", 3},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 16},
                      {"max_position_embeddings", 512},
                      {"initializer_range", 0.1},
                      {"bos_token_id", 1},
                      {"eos_token_id", 2},
                      {"tie_word_embeddings", false},
                      {"torch_dtype", "float32"}};
  for (const auto& [key, value] : changes.items()) {
    if (value.is_null())
      j.erase(key);
    else
      j[key] = value;
  }
  const std::string model = dir + "/moe";
  SaveModelOptions o;
  o.copy_files_from = shared_dir() + "/models/stories260K";
  save_hf_model(init_random_weights(ModelConfig::from_json(j, "tiny moe"), seed), model, o);
  return model;
}

inline std::string write_moe_data(const std::string& dir) {
  const std::string data = dir + "/data.jsonl";
  std::ofstream f(data);
  for (int i = 0; i < 8; ++i) f << "{\"text\": \"Lily had a red ball. Tom liked it. They played in the sun.\"}\n";
  return data;
}

// `backprop train` of `model` with `flags`; the run's folder, or "" with the output in *out.
inline std::string moe_train(const std::string& dir, const std::string& model, const std::string& flags,
                             std::string* out) {
  const int rc = run_command(fmt::format("({} train --device cpu --json --model {} --data {} --output {}/runs "
                                         "--batch-size 4 --threads 1 --lr 0.02 {} 2>&1)",
                                         backprop_exe(), model, write_moe_data(dir), dir, flags),
                             out);
  if (rc != 0) return "";
  const size_t brace = out->rfind("\n{");
  return nlohmann::json::parse(brace == std::string::npos ? *out : out->substr(brace + 1))
      .at("output_dir")
      .get<std::string>();
}

}  // namespace bp::test
