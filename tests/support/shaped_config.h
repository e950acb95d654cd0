// stories260K's config.json with another shape, for synthetic models that keep its tokenizer
// (vocab 512) so they can be exported to GGUF: used where a test needs rows of whole q4_K blocks
// or a head_dim with many rotary frequencies.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "support/test_util.h"

namespace bp::test {

inline nlohmann::json stories_config_shaped(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                            int64_t layers, int64_t intermediate) {
  nlohmann::json j = nlohmann::json::parse(read_file(shared_dir() + "/models/stories260K/config.json"));
  j["hidden_size"] = hidden;
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = kv_heads;
  j["head_dim"] = head_dim;
  j["num_hidden_layers"] = layers;
  j["intermediate_size"] = intermediate;
  return j;
}

}  // namespace bp::test
