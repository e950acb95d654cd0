// ModelConfig parsing for each supported architecture, defaults, and clear failures.
#include "model/config.h"

#include <cmath>
#include <fstream>

#include "support/test_util.h"

namespace bp {
namespace {

nlohmann::json base_json(const char* arch, const char* model_type) {
  return {{"architectures", {arch}},  {"model_type", model_type},  {"vocab_size", 100},
          {"hidden_size", 64},        {"intermediate_size", 160},  {"num_hidden_layers", 2},
          {"num_attention_heads", 8}, {"num_key_value_heads", 2},  {"rms_norm_eps", 1e-5},
          {"rope_theta", 500000.0},   {"torch_dtype", "bfloat16"}, {"bos_token_id", 1},
          {"eos_token_id", 2}};
}

ModelConfig parse_file(const nlohmann::json& j, test::TempDir& dir) {
  const std::string path = dir.path + "/config.json";
  std::ofstream(path) << j.dump(2);
  return ModelConfig::from_file(path);
}

std::string error_of(const nlohmann::json& j) {
  try {
    ModelConfig::from_json(j, "cfg.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
    return e.what();
  }
  ADD_FAILURE() << "expected DEP_MODEL_LOAD_FAILED for " << j.dump();
  return "";
}

}  // namespace

TEST(ModelConfig, LlamaWithDefaultsFromFile) {
  test::TempDir dir;
  nlohmann::json j = base_json("LlamaForCausalLM", "llama");
  j.erase("num_key_value_heads");
  ModelConfig c = parse_file(j, dir);
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.num_kv_heads, 8);  // defaults to num_attention_heads
  EXPECT_EQ(c.head_dim, 8);      // hidden / heads
  EXPECT_EQ(c.rope.head_dim, 8);
  EXPECT_FLOAT_EQ(c.rope.theta, 500000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.rope.llama3_scaling);
  EXPECT_EQ(c.torch_dtype, DType::BF16);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{2});
  EXPECT_EQ(c.q_dim(), 64);
  EXPECT_EQ(c.kv_dim(), 64);
}

TEST(ModelConfig, Llama3RopeScalingAndEosList) {
  nlohmann::json j = base_json("LlamaForCausalLM", "llama");
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 32.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  j["eos_token_id"] = {128001, 128008, 128009};
  j["tie_word_embeddings"] = true;
  ModelConfig c = ModelConfig::from_json(j, "cfg");
  EXPECT_TRUE(c.rope.llama3_scaling);
  EXPECT_FLOAT_EQ(c.rope.factor, 32.0f);
  EXPECT_FLOAT_EQ(c.rope.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope.original_max_position, 8192);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_TRUE(c.tie_word_embeddings);
  // to_json keeps the scaling, the list and short float spellings; it parses back the same.
  nlohmann::json out = c.to_json();
  EXPECT_EQ(out["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(out["eos_token_id"].size(), 3u);
  EXPECT_EQ(out["rms_norm_eps"].get<double>(), 1e-5);
  ModelConfig back = ModelConfig::from_json(out, "out");
  EXPECT_EQ(back.num_parameters(), c.num_parameters());
  EXPECT_FLOAT_EQ(back.rope.factor, 32.0f);
}

TEST(ModelConfig, MistralSlidingWindowAppliesToEveryLayer) {
  nlohmann::json j = base_json("MistralForCausalLM", "mistral");
  j["sliding_window"] = 4096;
  ModelConfig c = ModelConfig::from_json(j, "cfg");
  EXPECT_EQ(c.arch, Arch::Mistral);
  EXPECT_EQ(c.sliding_window, 4096);
  for (int64_t l = 0; l < 2; ++l) {
    EXPECT_EQ(c.attention_window(l), 4096);
    EXPECT_EQ(c.attention_shape(l).window, 4096);
  }
  EXPECT_EQ(c.attention_shape(0).n_heads, c.num_heads);
  EXPECT_FALSE(c.attention_bias);
  // Written back on export (also for a config built without config.json, e.g. from GGUF).
  ModelConfig bare = c;
  bare.raw = nlohmann::json();
  EXPECT_EQ(ModelConfig::from_json(bare.to_json(), "out").attention_window(1), 4096);
  j["sliding_window"] = nullptr;
  ModelConfig none = ModelConfig::from_json(j, "cfg");
  EXPECT_EQ(none.sliding_window, 0);
  EXPECT_EQ(none.attention_window(1), 0);
  j["sliding_window"] = -1;
  EXPECT_THROW(ModelConfig::from_json(j, "cfg"), Error);
}

// transformers' Qwen2Config: the window only with use_sliding_window, and only on layers >=
// max_window_layers (default 28) unless layer_types says per layer.
TEST(ModelConfig, Qwen2WindowFollowsMaxWindowLayersOrLayerTypes) {
  nlohmann::json j = base_json("Qwen2ForCausalLM", "qwen2");
  j["sliding_window"] = 32;
  EXPECT_EQ(ModelConfig::from_json(j, "cfg").attention_window(1), 0);  // use_sliding_window false
  j["use_sliding_window"] = true;
  ModelConfig deflt = ModelConfig::from_json(j, "cfg");  // max_window_layers 28 > both layers
  EXPECT_EQ(deflt.attention_window(0), 0);
  EXPECT_EQ(deflt.attention_window(1), 0);
  j["max_window_layers"] = 1;
  ModelConfig c = ModelConfig::from_json(j, "cfg");
  EXPECT_EQ(c.attention_window(0), 0);
  EXPECT_EQ(c.attention_window(1), 32);
  // The mixed windows survive export (as layer_types) and re-import.
  ModelConfig back = ModelConfig::from_json(c.to_json(), "out");
  EXPECT_EQ(back.layer_windows, c.layer_windows);
  j["layer_types"] = {"sliding_attention", "full_attention"};  // wins over max_window_layers
  ModelConfig typed = ModelConfig::from_json(j, "cfg");
  EXPECT_EQ(typed.attention_window(0), 32);
  EXPECT_EQ(typed.attention_window(1), 0);
}

TEST(ModelConfig, LayerTypesAreCheckedEntryByEntry) {
  nlohmann::json j = base_json("MistralForCausalLM", "mistral");
  j["sliding_window"] = 16;
  j["layer_types"] = {"full_attention", "sliding_attention"};
  ModelConfig c = ModelConfig::from_json(j, "cfg");
  EXPECT_EQ(c.attention_window(0), 0);
  EXPECT_EQ(c.attention_window(1), 16);
  auto expect_rejected = [&](const nlohmann::json& types, const std::string& needle) {
    j["layer_types"] = types;
    try {
      ModelConfig::from_json(j, "cfg");
      ADD_FAILURE() << "accepted layer_types " << types.dump();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_rejected({"full_attention", "chunked_attention"}, "layer_types entry 'chunked_attention' is not supported");
  expect_rejected({"full_attention", 3}, "layer_types entry '3'");
  expect_rejected({"full_attention"}, "num_hidden_layers = 2 entries");
  expect_rejected("sliding_attention", "must be a list");
}

TEST(ModelConfig, Qwen2AlwaysHasQkvBias) {
  nlohmann::json j = base_json("Qwen2ForCausalLM", "qwen2");
  j["tie_word_embeddings"] = true;
  ModelConfig c = ModelConfig::from_json(j, "cfg");
  EXPECT_EQ(c.arch, Arch::Qwen2);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  const int64_t D = 64, F = 160, V = 100, kv = 16;
  EXPECT_EQ(c.num_parameters(), V * D + 2 * (2 * D + D * D + 2 * kv * D + D * D + 3 * D * F + D + 2 * kv) + D);
}

TEST(ModelConfig, Qwen3HasQkNormAndExplicitHeadDim) {
  nlohmann::json j = base_json("Qwen3ForCausalLM", "qwen3");
  j["head_dim"] = 16;  // != hidden / heads, as in real Qwen3 models
  ModelConfig c = ModelConfig::from_json(j, "cfg");
  EXPECT_EQ(c.arch, Arch::Qwen3);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_EQ(c.kv_dim(), 32);
}

TEST(ModelConfig, ArchitectureFromModelTypeWhenListMissing) {
  nlohmann::json j = base_json("x", "qwen2");
  j.erase("architectures");
  EXPECT_EQ(ModelConfig::from_json(j, "cfg").arch, Arch::Qwen2);
}

TEST(ModelConfig, UnsupportedArchitectureListsSupportedOnes) {
  const std::string msg = error_of(base_json("GPT2LMHeadModel", "gpt2"));
  EXPECT_NE(msg.find("GPT2LMHeadModel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cfg.json"), std::string::npos) << msg;
  for (const std::string& a : supported_architectures()) EXPECT_NE(msg.find(a), std::string::npos) << msg;
  EXPECT_EQ(supported_architectures().size(), 10u);
}

TEST(ModelConfig, BadFieldsNameTheKey) {
  nlohmann::json j = base_json("LlamaForCausalLM", "llama");
  j.erase("hidden_size");
  EXPECT_NE(error_of(j).find("hidden_size"), std::string::npos);
  j = base_json("LlamaForCausalLM", "llama");
  j["num_attention_heads"] = "eight";
  EXPECT_NE(error_of(j).find("num_attention_heads"), std::string::npos);
  j = base_json("LlamaForCausalLM", "llama");
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("num_key_value_heads (3)"), std::string::npos);
  j = base_json("LlamaForCausalLM", "llama");
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(error_of(j).find("yarn"), std::string::npos);
  j = base_json("LlamaForCausalLM", "llama");
  j["hidden_act"] = "gelu";
  EXPECT_NE(error_of(j).find("gelu"), std::string::npos);
  EXPECT_NE(error_of(nlohmann::json::array()).find("object"), std::string::npos);
  // Wrong JSON types anywhere are load errors, never a JSON library exception.
  for (const char* key : {"model_type", "hidden_act", "torch_dtype", "rope_theta", "tie_word_embeddings",
                          "eos_token_id", "rope_scaling", "architectures", "vocab_size"}) {
    j = base_json("LlamaForCausalLM", "llama");
    j[key] = nlohmann::json::array({nlohmann::json::object()});
    EXPECT_NE(error_of(j).find(key), std::string::npos) << key;
  }
  j = base_json("LlamaForCausalLM", "llama");
  j["rope_scaling"] = {{"rope_type", 3}};
  EXPECT_NE(error_of(j).find("rope_type"), std::string::npos);
  j = base_json("LlamaForCausalLM", "llama");
  j["hidden_size"] = int64_t{1} << 40;  // would overflow parameter counts
  EXPECT_NE(error_of(j).find("hidden_size"), std::string::npos);
  j = base_json("LlamaForCausalLM", "llama");
  j["rope_theta"] = 1e300;  // does not fit a float
  EXPECT_NE(error_of(j).find("rope_theta"), std::string::npos);
}

// google/gemma-3-1b-it's config.json: every fifth-and-sixth layer global (sliding_window_pattern 6,
// no layer_types), the local RoPE base, GeGLU, (1 + w) norms, the bf16 normalizer, tied head.
nlohmann::json gemma3_1b_json() {
  return nlohmann::json::parse(R"({"architectures": ["Gemma3ForCausalLM"], "attention_bias": false,
    "attn_logit_softcapping": null, "bos_token_id": 2, "eos_token_id": [1, 106], "final_logit_softcapping": null,
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 26,
    "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512,
    "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "vocab_size": 262144})");
}

TEST(ModelConfig, Gemma3TextFromItsConfig) {
  const ModelConfig c = ModelConfig::from_json(gemma3_1b_json(), "cfg");
  EXPECT_EQ(c.arch, Arch::Gemma3);
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_TRUE(c.qk_norm && c.sandwich_norms && c.tie_word_embeddings && c.local_rope);
  EXPECT_EQ(c.hidden_act, GluActivation::GeluTanh);
  EXPECT_EQ(c.norm_weight_offset, 1.0f);
  EXPECT_EQ(c.embed_scale, 34.0f);  // sqrt(1152) = 33.941, 34 in bf16 (steps of 0.25)
  EXPECT_FLOAT_EQ(c.attention_scale, 1.0f / 16.0f);
  for (int64_t l = 0; l < 26; ++l) {
    const bool global = l % 6 == 5;
    EXPECT_EQ(c.attention_window(l), global ? 0 : 512) << l;
    EXPECT_EQ(c.rope_for_layer(l).theta, global ? 1000000.0f : 10000.0f) << l;
  }
  EXPECT_EQ(c.attention_softcap, 0.0f);
  EXPECT_EQ(c.final_logit_softcap, 0.0f);
  EXPECT_EQ(c.num_parameters(), 999885952);  // the published count of Gemma 3 1B
  // layer_types wins over the pattern; linear rope scaling (Gemma 3 4B and up) on global layers only.
  nlohmann::json j = gemma3_1b_json();
  j["num_hidden_layers"] = 3;
  j["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  const ModelConfig d = ModelConfig::from_json(j, "cfg");
  EXPECT_EQ(d.attention_window(0), 0);
  EXPECT_EQ(d.attention_window(1), 512);
  EXPECT_EQ(d.rope_for_layer(0).linear_factor, 8.0f);
  EXPECT_EQ(d.rope_for_layer(1).linear_factor, 1.0f);
  // Written back as config.json keys and read again the same.
  const ModelConfig e = ModelConfig::from_json(d.to_json(), "cfg");
  EXPECT_EQ(e.layer_windows, d.layer_windows);
  EXPECT_EQ(e.rope.linear_factor, 8.0f);
  EXPECT_EQ(e.rope_local.theta, 10000.0f);
  EXPECT_EQ(e.embed_scale, d.embed_scale);
  EXPECT_FALSE(e.to_json().contains("hidden_act"));
}

TEST(ModelConfig, Gemma2DefaultsAlternateAndSoftCap) {
  nlohmann::json j = nlohmann::json::parse(R"({"architectures": ["Gemma2ForCausalLM"], "hidden_size": 2304,
    "intermediate_size": 9216, "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4,
    "vocab_size": 256000, "hidden_act": "gelu_pytorch_tanh", "torch_dtype": "float32"})");
  const ModelConfig c = ModelConfig::from_json(j, "cfg");
  EXPECT_EQ(c.arch, Arch::Gemma2);
  EXPECT_FALSE(c.qk_norm || c.local_rope);
  EXPECT_TRUE(c.sandwich_norms && c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.attention_softcap, 50.0f);
  EXPECT_EQ(c.final_logit_softcap, 30.0f);
  EXPECT_EQ(c.embed_scale, static_cast<float>(std::sqrt(2304.0)));  // f32 weights: not rounded
  EXPECT_EQ(c.attention_window(0), 4096);                           // layer 0 sliding, then alternate
  EXPECT_EQ(c.attention_window(1), 0);
  EXPECT_EQ(c.attention_window(24), 4096);
  EXPECT_EQ(c.rope_for_layer(0).theta, 10000.0f);
  EXPECT_EQ(c.num_parameters(), 2614341888);  // Gemma 2 2B
}

TEST(ModelConfig, GemmaBadKeysAreNamed) {
  nlohmann::json j = gemma3_1b_json();
  j["num_hidden_layers"] = 2;
  j["layer_types"] = {"sliding_attention", "chunked_attention"};
  std::string msg = error_of(j);
  EXPECT_NE(msg.find("layer_types"), std::string::npos) << msg;
  EXPECT_NE(msg.find("chunked_attention"), std::string::npos) << msg;
  j["layer_types"] = {"sliding_attention"};
  EXPECT_NE(error_of(j).find("layer_types"), std::string::npos);
  j = gemma3_1b_json();
  j["hidden_activation"] = "relu";
  msg = error_of(j);
  EXPECT_NE(msg.find("hidden_activation"), std::string::npos) << msg;
  EXPECT_NE(msg.find("relu"), std::string::npos) << msg;
  for (const char* key :
       {"query_pre_attn_scalar", "sliding_window", "sliding_window_pattern", "rope_local_base_freq"}) {
    j = gemma3_1b_json();
    j[key] = 0;
    EXPECT_NE(error_of(j).find(key), std::string::npos) << key;
  }
  j = gemma3_1b_json();
  j["attn_logit_softcapping"] = -1.0;
  EXPECT_NE(error_of(j).find("softcapping"), std::string::npos);
}

TEST(ModelConfig, AnyValueOfAnyKeyIsHandled) {
  // Every key set to every kind of JSON value: parsing succeeds or throws bp::Error, nothing else.
  const std::vector<nlohmann::json> values = {nullptr,
                                              true,
                                              -1,
                                              0,
                                              3,
                                              1e300,
                                              -0.5,
                                              "x",
                                              nlohmann::json::array(),
                                              nlohmann::json::object(),
                                              {1, 2},
                                              {{"rope_type", "llama3"}}};
  nlohmann::json full = base_json("Qwen3ForCausalLM", "qwen3");
  full["head_dim"] = 8;
  full["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  full["sliding_window"] = 128;
  full["use_sliding_window"] = true;
  full["max_position_embeddings"] = 64;
  int ok = 0, failed = 0;
  for (const auto& [key, unused] : full.items())
    for (const nlohmann::json& v : values) {
      nlohmann::json j = full;
      j[key] = v;
      try {
        ModelConfig::from_json(j, "cfg");
        ++ok;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
        ++failed;
      } catch (const std::exception& e) {
        ADD_FAILURE() << key << " = " << v.dump() << " threw a non-bp exception: " << e.what();
      }
    }
  EXPECT_GT(ok, 10);
  EXPECT_GT(failed, 50);
}

TEST(ModelConfig, MissingOrInvalidFile) {
  test::TempDir dir;
  try {
    ModelConfig::from_file(dir.path + "/nope.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
    EXPECT_NE(std::string(e.what()).find("nope.json"), std::string::npos);
  }
  std::ofstream(dir.path + "/bad.json") << "{\"hidden_size\": 64,";
  EXPECT_THROW(ModelConfig::from_file(dir.path + "/bad.json"), Error);
}

TEST(ModelConfig, Stories260K) {
  ModelConfig c = ModelConfig::from_file(test::shared_dir() + "/models/stories260K/config.json");
  EXPECT_EQ(c.num_parameters(), 260032);  // README.md of the model
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.torch_dtype, DType::F32);
}

}  // namespace bp

namespace bp {
namespace {

// A Phi-4-mini-shaped config (its real keys, small sizes): partial rotary 0.75, LongRoPE.
nlohmann::json phi4_mini_json() {
  nlohmann::json j = base_json("Phi3ForCausalLM", "phi3");
  j.erase("rope_theta");
  j["max_position_embeddings"] = 131072;
  j["original_max_position_embeddings"] = 4096;
  j["partial_rotary_factor"] = 0.75;  // head_dim 8: 6 dims rotate, 3 factors
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0, 1.1, 1.2}}, {"long_factor", {2.0, 4.0, 8.0}}};
  j["sliding_window"] = 262144;
  j["tie_word_embeddings"] = true;
  return j;
}

}  // namespace

TEST(ModelConfig, Phi3PartialRotaryAndLongRope) {
  const ModelConfig c = ModelConfig::from_json(phi4_mini_json(), "phi.json");
  EXPECT_EQ(c.arch, Arch::Phi3);
  EXPECT_TRUE(c.fused_projections());
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FLOAT_EQ(c.rope.theta, 10000.0f);  // Phi3Config's default
  EXPECT_EQ(c.rope.rot_dim(), 6);
  EXPECT_TRUE(c.rope.longrope);
  EXPECT_EQ(c.rope.original_max_position, 4096);
  EXPECT_EQ(c.rope.long_factor, (std::vector<float>{2.0f, 4.0f, 8.0f}));
  // sqrt(1 + ln(131072 / 4096) / ln 4096) = sqrt(1 + 5/12)
  EXPECT_FLOAT_EQ(c.rope.attention_factor, static_cast<float>(std::sqrt(1.0 + 5.0 / 12.0)));
  EXPECT_EQ(c.sliding_window, 262144);
  // Short factors up to position 4095, long ones from 4096 on (max(position) + 1 > original).
  const std::vector<float> s = rope_inv_freq(c.rope, 4095), l = rope_inv_freq(c.rope, 4096);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_FLOAT_EQ(s[1], 1.0f / (1.1f * static_cast<float>(std::pow(10000.0, 2.0 / 6.0))));
  EXPECT_FLOAT_EQ(l[2], 1.0f / (8.0f * static_cast<float>(std::pow(10000.0, 4.0 / 6.0))));
  // Without original_max_position_embeddings Phi3Config's 4096 stands; an explicit attention_factor wins.
  nlohmann::json j = phi4_mini_json();
  j.erase("original_max_position_embeddings");
  j["rope_scaling"]["attention_factor"] = 1.5;
  const ModelConfig d = ModelConfig::from_json(j, "phi.json");
  EXPECT_EQ(d.rope.original_max_position, 4096);
  EXPECT_FLOAT_EQ(d.rope.attention_factor, 1.5f);
  // A config that does not scale (max == original) has attention factor 1.
  j = phi4_mini_json();
  j["max_position_embeddings"] = 4096;
  EXPECT_FLOAT_EQ(ModelConfig::from_json(j, "phi.json").rope.attention_factor, 1.0f);
}

TEST(ModelConfig, Phi3BadRotaryAndLongRopeConfigsFail) {
  for (double f : {0.0, -0.5, 1.5}) {
    nlohmann::json j = phi4_mini_json();
    j["partial_rotary_factor"] = f;
    EXPECT_NE(error_of(j).find("partial_rotary_factor must be in (0, 1]"), std::string::npos) << f;
  }
  nlohmann::json j = phi4_mini_json();
  j["partial_rotary_factor"] = 0.1;  // int(8 · 0.1) = 0 dims
  EXPECT_NE(error_of(j).find("rotates 0 of head_dim 8"), std::string::npos);
  j = phi4_mini_json();
  j["rope_scaling"]["long_factor"] = {1.0, 2.0};
  EXPECT_NE(error_of(j).find("'long_factor' has 2 values but rotary_dim/2 = 3"), std::string::npos);
  j = phi4_mini_json();
  j["rope_scaling"]["short_factor"] = {1.0, 2.0, 3.0, 4.0};  // the length of the full head_dim/2
  EXPECT_NE(error_of(j).find("'short_factor' has 4 values"), std::string::npos);
  j = phi4_mini_json();
  j["rope_scaling"].erase("short_factor");
  EXPECT_NE(error_of(j).find("needs 'short_factor'"), std::string::npos);
  j = phi4_mini_json();
  j["rope_scaling"]["long_factor"] = {1.0, -2.0, 3.0};
  EXPECT_NE(error_of(j).find("positive numbers"), std::string::npos);
  j = phi4_mini_json();
  j["rope_scaling"]["type"] = "su";
  EXPECT_NE(error_of(j).find("rope_scaling type 'su' is not supported"), std::string::npos);
}

TEST(ModelConfig, SmolLM3LayersWithoutRope) {
  nlohmann::json j = base_json("SmolLM3ForCausalLM", "smollm3");
  j.erase("rope_theta");
  j["num_hidden_layers"] = 8;
  ModelConfig c = ModelConfig::from_json(j, "smol.json");
  EXPECT_EQ(c.arch, Arch::SmolLM3);
  EXPECT_FLOAT_EQ(c.rope.theta, 2000000.0f);  // SmolLM3Config's default
  EXPECT_TRUE(c.tie_word_embeddings);
  // no_rope_layer_interval 4 by default: layers 3 and 7 have no RoPE.
  EXPECT_EQ(c.rope_layers, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1, 1, 0}));
  EXPECT_EQ(c.rope_for_layer(3).rot_dim(), 0);
  EXPECT_EQ(c.rope_for_layer(2).rot_dim(), 8);
  j["no_rope_layer_interval"] = 3;
  EXPECT_EQ(ModelConfig::from_json(j, "smol.json").rope_layers, (std::vector<uint8_t>{1, 1, 0, 1, 1, 0, 1, 1}));
  j["no_rope_layers"] = {0, 1, 1, 1, 0, 1, 1, 1};  // wins over the interval
  EXPECT_EQ(ModelConfig::from_json(j, "smol.json").rope_layers, (std::vector<uint8_t>{0, 1, 1, 1, 0, 1, 1, 1}));
  j["no_rope_layers"] = {1, 1};
  EXPECT_NE(error_of(j).find("no_rope_layers must be a list of num_hidden_layers = 8"), std::string::npos);
  j["no_rope_layers"] = {0, 1, 2, 1, 0, 1, 1, 1};
  EXPECT_NE(error_of(j).find("entries must be 0 or 1"), std::string::npos);
  j.erase("no_rope_layers");
  j["no_rope_layer_interval"] = 0;
  EXPECT_NE(error_of(j).find("no_rope_layer_interval must be >= 1"), std::string::npos);
  j["no_rope_layer_interval"] = 4;
  j["use_sliding_window"] = true;
  EXPECT_NE(error_of(j).find("use_sliding_window"), std::string::npos);
}

}  // namespace bp
