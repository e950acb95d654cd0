// PEFT adapter files: exact round trip, key names, adapter_config.json fields, and adapters that
// do not fit the model.
#include "model/peft.h"

#include <filesystem>
#include <fstream>
#include <map>

#include "io/safetensors.h"
#include "model/loader.h"
#include "model/transformer.h"
#include "model/weight_names.h"
#include "support/expect_error.h"
#include "support/lora_test_util.h"
#include "support/test_util.h"

namespace bp {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny_config(int64_t hidden = 16) {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                      {"vocab_size", 40},
                      {"hidden_size", hidden},
                      {"intermediate_size", 24},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}};
  return ModelConfig::from_json(j, "tiny");
}

// An adapter with non-zero B everywhere (a fresh one has B = 0, which would hide swaps).
LoraAdapter trained_adapter(const ModelConfig& c, const LoraConfig& lc, uint64_t seed) {
  LoraAdapter ad = init_lora(c, lc, seed);
  uint64_t s = seed * 100;
  for (LoraLayer& l : ad.layers)
    for (LoraTarget t : kAllLoraTargets)
      if (l.has(t)) l.b(t).copy_from(test::random_tensor(l.b(t).shape(), ++s));
  return ad;
}

template <class F>
std::string load_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected DEP_MODEL_LOAD_FAILED";
  return "";
}

nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(std::ifstream(path));
}

}  // namespace

TEST(Peft, RoundTripIsExact) {
  ModelConfig c = tiny_config();
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  lc.dropout = 0.05f;
  lc.use_rslora = true;
  lc.target_modules = {"q_proj", "v_proj", "down_proj"};
  LoraAdapter ad = trained_adapter(c, lc, 1);
  ad.base_model_name_or_path = "/models/tiny";
  test::TempDir dir;
  EXPECT_EQ(save_peft_adapter(ad, dir.path),
            (std::vector<std::string>{"adapter_model.safetensors", "adapter_config.json"}));
  LoraAdapter back = load_peft_adapter(dir.path, c);
  EXPECT_EQ(back.config.r, 4);
  EXPECT_EQ(back.config.alpha, 8.0f);
  EXPECT_EQ(back.config.dropout, 0.05f);
  EXPECT_TRUE(back.config.use_rslora);
  EXPECT_EQ(back.config.scale(), ad.config.scale());
  EXPECT_EQ(back.config.target_modules, (std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
  EXPECT_EQ(back.base_model_name_or_path, "/models/tiny");
  ASSERT_EQ(back.layers.size(), 2u);
  for (size_t li = 0; li < 2; ++li)
    for (LoraTarget t : kAllLoraTargets) {
      ASSERT_EQ(back.layers[li].has(t), ad.layers[li].has(t));
      if (!ad.layers[li].has(t)) continue;
      EXPECT_EQ(back.layers[li].a(t).to_vector(), ad.layers[li].a(t).to_vector());
      EXPECT_EQ(back.layers[li].b(t).to_vector(), ad.layers[li].b(t).to_vector());
    }
  EXPECT_EQ(back.num_parameters(), ad.num_parameters());
}

TEST(Peft, FileLayoutMatchesPeft) {
  ModelConfig c = tiny_config();
  LoraConfig lc;
  lc.r = 2;
  lc.alpha = 16;
  lc.target_modules = {"all-linear"};
  LoraAdapter ad = init_lora(c, lc, 3);
  test::TempDir dir;
  save_peft_adapter(ad, dir.path);
  nlohmann::json j = read_json(dir.path + "/adapter_config.json");
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], 2);
  EXPECT_TRUE(j["lora_alpha"].is_number_integer());
  EXPECT_EQ(j["lora_alpha"], 16);
  EXPECT_EQ(j["lora_dropout"], 0);
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["use_rslora"], false);
  EXPECT_TRUE(j["base_model_name_or_path"].is_null());
  EXPECT_EQ(j["target_modules"], nlohmann::json({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj"}));  // "all-linear" resolved, as PEFT saves it
  SafetensorsReader r = SafetensorsReader::open_file(dir.path + "/adapter_model.safetensors");
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.names().size(), 2u * 7u * 2u);
  const SafetensorsEntry& a = r.entry("base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(a.dtype_str, "F32");
  EXPECT_EQ(r.entry("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight").shape,
            (std::vector<int64_t>{16, 2}));
  EXPECT_EQ(r.entry("base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight").shape,
            (std::vector<int64_t>{8, 2}));
}

// DoRA: the magnitude of each adapted projection as PEFT's get_peft_model_state_dict names it
// (<module>.lora_magnitude_vector, [out], no ".weight"), use_dora true in adapter_config.json; the
// round trip is exact, and a magnitude without use_dora (or the reverse) is refused.
TEST(Peft, DoraMagnitudesSavedAsPeftSavesThem) {
  ModelConfig c = tiny_config();
  LoraConfig lc;
  lc.r = 2;
  lc.use_dora = true;
  lc.target_modules = {"k_proj", "down_proj"};
  LoraAdapter ad = trained_adapter(c, lc, 5);
  test::randomize_dora_magnitudes(ad, 77);
  test::TempDir dir;
  save_peft_adapter(ad, dir.path);
  EXPECT_EQ(read_json(dir.path + "/adapter_config.json")["use_dora"], true);
  SafetensorsReader r = SafetensorsReader::open_file(dir.path + "/adapter_model.safetensors");
  EXPECT_EQ(r.names().size(), 3u * 2u * 2u);
  EXPECT_EQ(r.entry("base_model.model.model.layers.1.self_attn.k_proj.lora_magnitude_vector").shape,
            (std::vector<int64_t>{8}));
  EXPECT_EQ(r.entry("base_model.model.model.layers.0.mlp.down_proj.lora_magnitude_vector").shape,
            (std::vector<int64_t>{16}));
  LoraAdapter back = load_peft_adapter(dir.path, c);
  EXPECT_TRUE(back.config.use_dora);
  for (size_t li = 0; li < 2; ++li)
    for (LoraTarget t : kAllLoraTargets) {
      ASSERT_EQ(back.layers[li].m(t).defined(), ad.layers[li].has(t));
      if (ad.layers[li].has(t)) {
        EXPECT_EQ(back.layers[li].m(t).to_vector(), ad.layers[li].m(t).to_vector());
      }
    }
  EXPECT_EQ(back.num_parameters(), ad.num_parameters());
  nlohmann::json j = read_json(dir.path + "/adapter_config.json");
  j["use_dora"] = false;
  std::ofstream(dir.path + "/adapter_config.json") << j.dump();
  EXPECT_NE(load_error([&] { load_peft_adapter(dir.path, c); }).find("no use_dora = true"), std::string::npos);
  LoraConfig plain = lc;
  plain.use_dora = false;
  save_peft_adapter(trained_adapter(c, plain, 5), dir.path);
  j["use_dora"] = true;
  std::ofstream(dir.path + "/adapter_config.json") << j.dump();
  EXPECT_NE(load_error([&] { load_peft_adapter(dir.path, c); }).find("lora_magnitude_vector' is missing"),
            std::string::npos);
}

TEST(Peft, AdapterForAnotherModelFails) {
  LoraConfig lc;
  lc.r = 4;
  LoraAdapter ad = init_lora(tiny_config(16), lc, 1);
  test::TempDir dir;
  save_peft_adapter(ad, dir.path);
  const std::string msg = load_error([&] { load_peft_adapter(dir.path, tiny_config(32)); });
  EXPECT_NE(msg.find("adapter_model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mlp.down_proj.lora_B.weight' has shape [16, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("needs [32, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not fit"), std::string::npos) << msg;

  // More layers than the model.
  ModelConfig one_layer = tiny_config(16);
  one_layer.num_layers = 1;
  EXPECT_NE(load_error([&] { load_peft_adapter(dir.path, one_layer); }).find("layer 1 but the model has 1 layers"),
            std::string::npos);

  // r in the config disagrees with the tensors.
  nlohmann::json j = read_json(dir.path + "/adapter_config.json");
  j["r"] = 8;
  std::ofstream(dir.path + "/adapter_config.json") << j.dump();
  EXPECT_NE(load_error([&] { load_peft_adapter(dir.path, tiny_config(16)); }).find("r = 8"), std::string::npos);
}

TEST(Peft, DamagedOrUnsupportedAdapters) {
  ModelConfig c = tiny_config();
  LoraConfig lc;
  lc.r = 2;
  lc.target_modules = {"q_proj"};
  LoraAdapter ad = init_lora(c, lc, 1);
  test::TempDir dir;
  save_peft_adapter(ad, dir.path);
  const nlohmann::json good = read_json(dir.path + "/adapter_config.json");
  auto with = [&](const char* key, nlohmann::json v) {
    nlohmann::json j = good;
    j[key] = v;
    std::ofstream(dir.path + "/adapter_config.json") << j.dump();
    return load_error([&] { load_peft_adapter(dir.path, c); });
  };
  EXPECT_NE(with("use_dora", true).find("use_dora"), std::string::npos);  // no magnitudes in the file
  EXPECT_NE(with("bias", "all").find("bias 'all'"), std::string::npos);
  EXPECT_NE(with("peft_type", "IA3").find("IA3"), std::string::npos);
  EXPECT_NE(with("rank_pattern", {{"q_proj", 4}}).find("rank_pattern"), std::string::npos);
  EXPECT_NE(with("modules_to_save", {"lm_head"}).find("modules_to_save"), std::string::npos);
  EXPECT_NE(with("r", "two").find("'r'"), std::string::npos);
  EXPECT_NE(with("r", 0).find("out of range"), std::string::npos);
  EXPECT_NE(with("lora_alpha", 1e300).find("out of range"), std::string::npos);
  EXPECT_NE(with("lora_dropout", 1.5).find("out of range"), std::string::npos);
  std::ofstream(dir.path + "/adapter_config.json") << good.dump();

  // One half missing, and a foreign tensor.
  NamedTensors ts = {{peft_lora_name(0, LoraTarget::Q, true), ad.layers[0].a(LoraTarget::Q)}};
  write_safetensors(dir.path + "/adapter_model.safetensors", ts);
  std::string msg = load_error([&] { load_peft_adapter(dir.path, c); });
  EXPECT_NE(msg.find("'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight' is missing"), std::string::npos)
      << msg;
  ts.emplace_back("base_model.model.lm_head.lora_A.weight", test::random_tensor({2, 16}, 1));
  write_safetensors(dir.path + "/adapter_model.safetensors", ts);
  msg = load_error([&] { load_peft_adapter(dir.path, c); });
  EXPECT_NE(msg.find("'base_model.model.lm_head.lora_A.weight' is not a lora_A/lora_B weight"), std::string::npos)
      << msg;

  // Truncated weights file; missing files.
  save_peft_adapter(ad, dir.path);
  fs::resize_file(dir.path + "/adapter_model.safetensors", 100);
  EXPECT_NE(load_error([&] { load_peft_adapter(dir.path, c); }).find("adapter_model.safetensors"), std::string::npos);
  fs::remove(dir.path + "/adapter_model.safetensors");
  EXPECT_NE(load_error([&] { load_peft_adapter(dir.path, c); }).find("does not exist"), std::string::npos);
  fs::remove(dir.path + "/adapter_config.json");
  EXPECT_NE(load_error([&] { load_peft_adapter(dir.path, c); }).find("adapter_config.json"), std::string::npos);
  EXPECT_NE(load_error([&] { load_peft_adapter(dir.path + "/nope", c); }).find("does not exist"), std::string::npos);
}

TEST(Peft, LoadsWhatPeftWrites) {
  // adapter_config.json as written by PEFT 0.13 (every field it emits), with bf16 tensors as a
  // model trained in bf16 saves them; only q_proj/v_proj, listed in PEFT's (set) order.
  ModelConfig c = tiny_config();
  test::TempDir dir;
  std::ofstream(dir.path + "/adapter_config.json") << R"({
  "alpha_pattern": {}, "auto_mapping": null, "base_model_name_or_path": "Qwen/Qwen2.5-0.5B",
  "bias": "none", "fan_in_fan_out": false, "inference_mode": true, "init_lora_weights": true,
  "layer_replication": null, "layers_pattern": null, "layers_to_transform": null, "loftq_config": {},
  "lora_alpha": 32, "lora_dropout": 0.05, "megatron_config": null, "megatron_core": "megatron.core",
  "modules_to_save": null, "peft_type": "LORA", "r": 8, "rank_pattern": {}, "revision": null,
  "target_modules": ["v_proj", "q_proj"], "task_type": "CAUSAL_LM", "use_dora": false, "use_rslora": false})";
  NamedTensors ts;
  for (int64_t l = 0; l < 2; ++l) {
    ts.emplace_back(peft_lora_name(l, LoraTarget::Q, true), test::random_tensor({8, 16}, 1 + l).to(DType::BF16));
    ts.emplace_back(peft_lora_name(l, LoraTarget::Q, false), test::random_tensor({16, 8}, 3 + l).to(DType::BF16));
    ts.emplace_back(peft_lora_name(l, LoraTarget::V, true), test::random_tensor({8, 16}, 5 + l).to(DType::BF16));
    ts.emplace_back(peft_lora_name(l, LoraTarget::V, false), test::random_tensor({8, 8}, 7 + l).to(DType::BF16));
  }
  write_safetensors(dir.path + "/adapter_model.safetensors", ts);
  LoraAdapter ad = load_peft_adapter(dir.path, c);
  EXPECT_EQ(ad.config.r, 8);
  EXPECT_FLOAT_EQ(ad.config.scale(), 4.0f);
  EXPECT_FLOAT_EQ(ad.config.dropout, 0.05f);
  EXPECT_EQ(ad.config.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(ad.base_model_name_or_path, "Qwen/Qwen2.5-0.5B");
  EXPECT_FALSE(ad.layers[1].has(LoraTarget::K));
  EXPECT_EQ(ad.layers[1].b(LoraTarget::V).dtype(), DType::F32);
  EXPECT_EQ(ad.layers[1].b(LoraTarget::V).to_vector(), ts[7].second.to_vector());
}

}  // namespace bp

namespace bp {
namespace {

// Phi-3 with q_dim 16, kv_dim 8 (GQA 4/2, head_dim 4), intermediate 24: qkv_proj [32, 16], gate_up_proj [48, 16].
ModelConfig tiny_phi3() {
  nlohmann::json j = {{"architectures", {"Phi3ForCausalLM"}},
                      {"vocab_size", 40},
                      {"hidden_size", 16},
                      {"intermediate_size", 24},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}};
  return ModelConfig::from_json(j, "tiny phi3");
}

}  // namespace

TEST(Peft, Phi3FusedModulesAsPeftSavesThem) {
  const ModelConfig c = tiny_phi3();
  LoraConfig lc;
  lc.r = 2;
  lc.alpha = 4;
  lc.target_modules = {"all-linear"};
  LoraAdapter ad = trained_adapter(c, lc, 5);
  // One A per fused module, shared by its members; their B are rows of one tensor.
  const LoraLayer& l0 = ad.layers[0];
  EXPECT_EQ(l0.a(LoraTarget::Q).raw(), l0.a(LoraTarget::V).raw());
  EXPECT_EQ(l0.a(LoraTarget::Gate).raw(), l0.a(LoraTarget::Up).raw());
  EXPECT_NE(l0.a(LoraTarget::Q).raw(), l0.a(LoraTarget::O).raw());
  // 2 layers x (qkv: 2·16 + 32·2, o: 2·16 + 16·2, gate_up: 2·16 + 48·2, down: 2·24 + 16·2)
  EXPECT_EQ(ad.num_parameters(), 2 * ((32 + 64) + (32 + 32) + (32 + 96) + (48 + 32)));
  test::TempDir dir;
  save_peft_adapter(ad, dir.path);
  const nlohmann::json j = read_json(dir.path + "/adapter_config.json");
  EXPECT_EQ(j["target_modules"], nlohmann::json({"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
  SafetensorsReader r = SafetensorsReader::open_file(dir.path + "/adapter_model.safetensors");
  EXPECT_EQ(r.names().size(), 2u * 4u * 2u);
  const std::string p = "base_model.model.model.layers.1.";
  EXPECT_EQ(r.entry(p + "self_attn.qkv_proj.lora_A.weight").shape, (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(r.entry(p + "self_attn.qkv_proj.lora_B.weight").shape, (std::vector<int64_t>{32, 2}));
  EXPECT_EQ(r.entry(p + "mlp.gate_up_proj.lora_A.weight").shape, (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(r.entry(p + "mlp.gate_up_proj.lora_B.weight").shape, (std::vector<int64_t>{48, 2}));
  EXPECT_EQ(r.entry(p + "mlp.down_proj.lora_A.weight").shape, (std::vector<int64_t>{2, 24}));
  // B's rows in HF's order: q rows, then k, then v; gate, then up.
  const std::vector<float> qkv_b = r.read(p + "self_attn.qkv_proj.lora_B.weight").to_vector();
  const std::vector<float> k_b = ad.layers[1].b(LoraTarget::K).to_vector();
  EXPECT_EQ(std::vector<float>(qkv_b.begin() + 16 * 2, qkv_b.begin() + 24 * 2), k_b);
  const std::vector<float> gu_b = r.read(p + "mlp.gate_up_proj.lora_B.weight").to_vector();
  const std::vector<float> up_b = ad.layers[1].b(LoraTarget::Up).to_vector();
  EXPECT_EQ(std::vector<float>(gu_b.begin() + 24 * 2, gu_b.end()), up_b);

  // Loaded back: the same values, A shared again, B rows of one tensor.
  LoraAdapter back = load_peft_adapter(dir.path, c);
  EXPECT_EQ(back.config.target_modules, (std::vector<std::string>{"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}));
  for (size_t li = 0; li < 2; ++li)
    for (LoraTarget t : kAllLoraTargets) {
      EXPECT_EQ(back.layers[li].a(t).to_vector(), ad.layers[li].a(t).to_vector());
      EXPECT_EQ(back.layers[li].b(t).to_vector(), ad.layers[li].b(t).to_vector());
    }
  EXPECT_EQ(back.layers[0].a(LoraTarget::K).raw(), back.layers[0].a(LoraTarget::Q).raw());
  EXPECT_EQ(back.num_parameters(), ad.num_parameters());
}

TEST(Peft, Phi3TargetNamesFitTheModel) {
  LoraConfig lc;
  lc.target_modules = {"q_proj", "v_proj"};  // not modules of Phi-3
  test::expect_error([&] { init_lora(tiny_phi3(), lc, 1); }, ErrorCode::CONFIG_INVALID_SETTING,
                     {"'q_proj' does not exist in Phi3ForCausalLM", "qkv_proj"});
  lc.target_modules = {"qkv_proj"};  // Phi-3's name on a Llama
  test::expect_error([&] { init_lora(tiny_config(), lc, 1); }, ErrorCode::CONFIG_INVALID_SETTING,
                     {"'qkv_proj' is Phi-3's fused projection"});
  lc.target_modules = {"qkv_proj", "down_proj"};
  const LoraAdapter ad = init_lora(tiny_phi3(), lc, 1);
  EXPECT_TRUE(ad.layers[0].has(LoraTarget::V));
  EXPECT_FALSE(ad.layers[0].has(LoraTarget::Gate));
  EXPECT_EQ(ad.config.resolved_targets(), (std::vector<std::string>{"qkv_proj", "down_proj"}));
  // A Llama-named adapter (q_proj) does not load on Phi-3.
  LoraConfig llama;
  llama.target_modules = {"q_proj"};
  test::TempDir dir;
  save_peft_adapter(init_lora(tiny_config(), llama, 1), dir.path);
  EXPECT_NE(load_error([&] { load_peft_adapter(dir.path, tiny_phi3()); }).find("qkv_proj/o_proj/gate_up_proj"),
            std::string::npos);
}

// DoRA on a fused module, as PEFT's DoRA on the one qkv_proj / gate_up_proj Linear: one
// lora_magnitude_vector [Σout] per module (q rows, then k, then v), whose rows the members' magnitudes
// are; saved, loaded back into that layout, and the same in the trainable parameters. On o_proj /
// down_proj the magnitude is the module's own.
TEST(Peft, Phi3DoraOnFusedModulesAsPeftSavesThem) {
  const ModelConfig c = tiny_phi3();
  LoraConfig lc;
  lc.r = 2;
  lc.use_dora = true;
  lc.target_modules = {"all-linear"};
  LoraAdapter ad = trained_adapter(c, lc, 3);
  Model model(init_random_weights(c, 4), ModelOptions{TrainMode::Lora});
  init_dora_magnitudes(ad, model.weights());
  // The magnitudes start at the fused weight's row norms: the members' rows of one tensor.
  const LoraLayer& l1 = ad.layers[1];
  const Tensor qkv_m = fused_rows_of(l1.M, kLoraFusedModules[0]);
  EXPECT_TRUE(Tensor::joined_rows(std::vector<const Tensor*>{&l1.M[0], &l1.M[1], &l1.M[2]}).defined());
  const std::vector<const Tensor*> qkv_w = {&model.weights().layers[1].q, &model.weights().layers[1].k,
                                            &model.weights().layers[1].v};
  EXPECT_EQ(qkv_m.to_vector(), weight_row_norms(join_rows_or_copy(qkv_w), false).to_vector());
  test::randomize_dora_magnitudes(ad, 9);
  EXPECT_TRUE(Tensor::joined_rows(std::vector<const Tensor*>{&l1.M[4], &l1.M[5]}).defined());
  // 2 layers x (qkv 96 + 32 rows, o 64 + 16, gate_up 128 + 48, down 80 + 16)
  EXPECT_EQ(ad.num_parameters(), 2 * ((96 + 32) + (64 + 16) + (128 + 48) + (80 + 16)));

  test::TempDir dir;
  save_peft_adapter(ad, dir.path);
  EXPECT_EQ(read_json(dir.path + "/adapter_config.json")["use_dora"], true);
  SafetensorsReader r = SafetensorsReader::open_file(dir.path + "/adapter_model.safetensors");
  EXPECT_EQ(r.names().size(), 2u * 4u * 3u);
  const std::string p = "base_model.model.model.layers.1.";
  EXPECT_EQ(r.entry(p + "self_attn.qkv_proj.lora_magnitude_vector").shape, (std::vector<int64_t>{32}));
  EXPECT_EQ(r.entry(p + "mlp.gate_up_proj.lora_magnitude_vector").shape, (std::vector<int64_t>{48}));
  EXPECT_EQ(r.entry(p + "self_attn.o_proj.lora_magnitude_vector").shape, (std::vector<int64_t>{16}));
  // Rows in HF's order: q's magnitudes, then k's, then v's.
  const std::vector<float> saved_m = r.read(p + "self_attn.qkv_proj.lora_magnitude_vector").to_vector();
  EXPECT_EQ(saved_m, qkv_m.to_vector());
  EXPECT_EQ(std::vector<float>(saved_m.begin() + 16, saved_m.begin() + 24), l1.m(LoraTarget::K).to_vector());

  LoraAdapter back = load_peft_adapter(dir.path, c);
  ASSERT_TRUE(back.config.use_dora);
  for (size_t li = 0; li < 2; ++li)
    for (LoraTarget t : kAllLoraTargets) EXPECT_EQ(back.layers[li].m(t).to_vector(), ad.layers[li].m(t).to_vector());
  const LoraLayer& b1 = back.layers[1];
  EXPECT_TRUE(Tensor::joined_rows(std::vector<const Tensor*>{&b1.M[0], &b1.M[1], &b1.M[2]}).defined());
  EXPECT_EQ(back.num_parameters(), ad.num_parameters());
  // The model trains it under the same name, as one tensor over the module's rows.
  model.attach_lora(back);
  std::map<std::string, Shape> trainable;
  for (const TrainableParam& tp : model.trainable_parameters()) trainable[tp.name] = tp.param->shape();
  EXPECT_EQ(trainable.size(), 2u * 4u * 3u);
  EXPECT_EQ(trainable.at(p + "self_attn.qkv_proj.lora_magnitude_vector"), Shape{32});
  EXPECT_EQ(trainable.at(p + "mlp.gate_up_proj.lora_magnitude_vector"), Shape{48});

  // A file whose fused magnitude is missing is refused naming it.
  NamedTensors ts;
  for (const std::string& n : r.names())
    if (n != p + "mlp.gate_up_proj.lora_magnitude_vector") ts.emplace_back(n, r.read(n));
  write_safetensors(dir.path + "/adapter_model.safetensors", ts);
  EXPECT_NE(load_error([&] {
              load_peft_adapter(dir.path, c);
            }).find("'" + p + "mlp.gate_up_proj.lora_magnitude_vector' is missing (use_dora = true)"),
            std::string::npos);
}

}  // namespace bp
