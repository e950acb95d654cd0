// Mixture-of-Experts configs and folders (Qwen3-MoE, Mixtral): config.json's MoE fields as
// transformers' Qwen3MoeConfig / MixtralConfig read them, sparse and dense layers, the stacked expert
// tensors (model/weights.h) loaded from and saved to Hugging Face's per-expert names, held types, and
// bad input: num_experts_per_tok out of range, experts without a router, a missing expert, a shape
// that disagrees with the config.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "io/safetensors.h"
#include "model/generate.h"
#include "model/loader.h"
#include "model/merge.h"
#include "model/peft.h"
#include "model/transformer.h"
#include "model/weight_names.h"
#include "support/test_util.h"

namespace bp {
namespace {

nlohmann::json qwen3_moe_json() {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"vocab_size", 40},
          {"hidden_size", 32},
          {"intermediate_size", 40},
          {"moe_intermediate_size", 24},
          {"num_experts", 4},
          {"num_experts_per_tok", 2},
          {"norm_topk_prob", true},
          {"mlp_only_layers", {1}},
          {"num_hidden_layers", 3},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 8},
          {"torch_dtype", "float32"}};
}

nlohmann::json mixtral_json() {
  return {{"architectures", {"MixtralForCausalLM"}},
          {"vocab_size", 40},
          {"hidden_size", 32},
          {"intermediate_size", 24},
          {"num_local_experts", 3},
          {"num_experts_per_tok", 2},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"torch_dtype", "float32"}};
}

std::string config_error(const nlohmann::json& j) {
  try {
    ModelConfig::from_json(j, "cfg");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected DEP_MODEL_LOAD_FAILED for " << j.dump();
  return "";
}

std::string load_error(const std::string& dir) {
  try {
    load_model(dir);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected DEP_MODEL_LOAD_FAILED";
  return "";
}

// The message of the error `f` throws, checked to carry `code` ("" and a failure when none is thrown).
template <class F>
std::string error_of(ErrorCode code, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected " << error_info(code).name;
  return "";
}

TEST(MoeConfig, Qwen3MoeFieldsAndSparseLayers) {
  const ModelConfig c = ModelConfig::from_json(qwen3_moe_json(), "cfg");
  EXPECT_EQ(c.arch, Arch::Qwen3Moe);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.num_experts, 4);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_intermediate_size, 24);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_FLOAT_EQ(c.router_aux_loss_coef, 0.001f);           // Qwen3MoeConfig's default
  EXPECT_EQ(c.moe_layers, (std::vector<uint8_t>{1, 0, 1}));  // layer 1 in mlp_only_layers
  // decoder_sparse_step 2: layers l with (l + 1) % 2 == 0 are sparse.
  nlohmann::json j = qwen3_moe_json();
  j.erase("mlp_only_layers");
  j["decoder_sparse_step"] = 2;
  j["num_hidden_layers"] = 4;
  EXPECT_EQ(ModelConfig::from_json(j, "cfg").moe_layers, (std::vector<uint8_t>{0, 1, 0, 1}));
  // Parameters by hand: per layer 2 norms (64) + q,k,v,o (32·32 + 2·16·32 + 32·32 = 3072) + q/k norms
  // (16); sparse layers router 4·32 + 4 experts · 3·24·32; the dense layer 3·40·32; embed and head 2·40·32;
  // final norm 32.
  const int64_t attn = 64 + 3072 + 16;
  const int64_t total = 3 * attn + 2 * (4 * 32 + 4 * 3 * 24 * 32) + 3 * 40 * 32 + 2 * 40 * 32 + 32;
  EXPECT_EQ(c.num_parameters(), total);
  EXPECT_EQ(c.num_active_parameters(), total - 2 * 2 * 3 * 24 * 32);  // 2 of 4 experts per sparse layer
  // Written back with its MoE fields.
  const ModelConfig back = ModelConfig::from_json(c.to_json(), "back");
  EXPECT_EQ(back.moe_layers, c.moe_layers);
  EXPECT_EQ(back.num_experts_per_tok, 2);
}

TEST(MoeConfig, MixtralEveryLayerSparseAlwaysRenormalised) {
  const ModelConfig c = ModelConfig::from_json(mixtral_json(), "cfg");
  EXPECT_EQ(c.arch, Arch::Mixtral);
  EXPECT_EQ(c.num_experts, 3);
  EXPECT_EQ(c.moe_intermediate_size, 24);  // Mixtral's experts are intermediate_size wide
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.moe_layers, (std::vector<uint8_t>{1, 1}));
  EXPECT_FLOAT_EQ(c.rope.theta, 1e6f);  // MixtralConfig's default
}

TEST(MoeConfig, BadMoeFieldsAreRefused) {
  nlohmann::json j = qwen3_moe_json();
  j["num_experts_per_tok"] = 5;
  EXPECT_NE(config_error(j).find("num_experts_per_tok must be in [1, num_experts = 4], got 5"), std::string::npos);
  j["num_experts_per_tok"] = 0;
  EXPECT_NE(config_error(j).find("num_experts_per_tok"), std::string::npos);
  j = mixtral_json();
  j["num_local_experts"] = 0;
  EXPECT_NE(config_error(j).find("num_local_experts must be in [1,"), std::string::npos);
  j = qwen3_moe_json();
  j["mlp_only_layers"] = {7};
  EXPECT_NE(config_error(j).find("mlp_only_layers entry 7"), std::string::npos);
  j = qwen3_moe_json();
  j["decoder_sparse_step"] = 0;
  EXPECT_NE(config_error(j).find("decoder_sparse_step must be >= 1"), std::string::npos);
}

TEST(MoeLoader, PerExpertTensorsRoundTripIntoStackedOnes) {
  for (const nlohmann::json& j : {qwen3_moe_json(), mixtral_json()}) {
    const ModelConfig cfg = ModelConfig::from_json(j, "cfg");
    SCOPED_TRACE(cfg.architecture_name);
    const ModelWeights ref = init_random_weights(cfg, 3);
    EXPECT_EQ(ref.layers[0].experts_gate.shape(), (Shape{cfg.num_experts, cfg.moe_intermediate_size, 32}));
    EXPECT_EQ(ref.layers[0].experts_down.shape(), (Shape{cfg.num_experts, 32, cfg.moe_intermediate_size}));
    test::TempDir dir;
    save_hf_model(ref, dir.path);
    const SafetensorsReader reader = SafetensorsReader::open_model(dir.path);
    const bool qwen = cfg.arch == Arch::Qwen3Moe;
    // Hugging Face's names, one tensor per expert; expert 1's down projection is slab 1.
    const std::string down1 =
        qwen ? "model.layers.0.mlp.experts.1.down_proj.weight" : "model.layers.0.block_sparse_moe.experts.1.w2.weight";
    ASSERT_TRUE(reader.contains(down1));
    ASSERT_TRUE(
        reader.contains(qwen ? "model.layers.0.mlp.gate.weight" : "model.layers.0.block_sparse_moe.gate.weight"));
    EXPECT_EQ(reader.read(down1, Shape{32, cfg.moe_intermediate_size}).to_vector(),
              expert_matrix(ref.layers[0].experts_down, 1).to_vector());
    if (qwen) {  // the dense layer keeps its MLP under mlp.*_proj
      EXPECT_TRUE(reader.contains("model.layers.1.mlp.gate_proj.weight"));
      EXPECT_FALSE(reader.contains("model.layers.1.mlp.gate.weight"));
    }
    const ModelWeights w = load_model(dir.path);
    for (const auto& [role, layer] : model_roles(cfg))
      EXPECT_EQ(weight_ref(w, role, layer).to_vector(), weight_ref(ref, role, layer).to_vector())
          << moe_aware_name(cfg, role, layer);
    // Held: every expert slab quantized (q8_0 rows of 32 and 24 values: 24 falls back to bf16).
    std::vector<std::string> notes;
    const ModelWeights held = load_model(dir.path, DType::Q8_0, &notes);
    EXPECT_EQ(held.layers[0].experts_gate.dtype(), DType::Q8_0);
    EXPECT_EQ(held.layers[0].experts_down.dtype(), DType::BF16);
    EXPECT_EQ(held.layers[0].router.dtype(), DType::F32);
    EXPECT_TRUE(test::all_close(expert_matrix(held.layers[0].experts_gate, 2).to_vector(),
                                expert_matrix(ref.layers[0].experts_gate, 2).to_vector(), {2e-3, 2e-2}));
  }
}

TEST(MoeLoader, MissingRouterExpertOrWrongShapeIsRefused) {
  const ModelConfig cfg = ModelConfig::from_json(qwen3_moe_json(), "cfg");
  const ModelWeights ref = init_random_weights(cfg, 4);
  test::TempDir dir;
  save_hf_model(ref, dir.path);
  auto rewrite = [&](const std::function<void(NamedTensors&)>& edit) {
    NamedTensors ts = named_hf_weights(ref);
    edit(ts);
    write_safetensors(dir.path + "/model.safetensors", ts);
  };
  rewrite([](NamedTensors& ts) {
    std::erase_if(ts, [](const auto& nt) { return nt.first == "model.layers.2.mlp.gate.weight"; });
  });
  std::string msg = load_error(dir.path);
  EXPECT_NE(msg.find("'model.layers.2.mlp.gate.weight' is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("router of layer 2"), std::string::npos) << msg;
  rewrite([](NamedTensors& ts) {
    std::erase_if(ts, [](const auto& nt) { return nt.first == "model.layers.0.mlp.experts.3.up_proj.weight"; });
  });
  msg = load_error(dir.path);
  EXPECT_NE(msg.find("'model.layers.0.mlp.experts.3.up_proj.weight' is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("every expert of layer 0"), std::string::npos) << msg;
  rewrite([](NamedTensors& ts) {
    for (auto& nt : ts)
      if (nt.first == "model.layers.0.mlp.experts.1.down_proj.weight") nt.second = test::random_tensor({24, 32}, 1);
  });
  msg = load_error(dir.path);
  EXPECT_NE(msg.find("'model.layers.0.mlp.experts.1.down_proj.weight' has shape [24, 32] but the model config needs "
                     "[32, 24]"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace bp

namespace bp {
namespace {

// training.router_aux_loss_coef reaches the step: -1 takes config.json's, 0 turns the loss's
// gradient off (the router's gradient changes, the experts' below it do not), LoRA never adds it.
TEST(MoeModel, RouterAuxLossCoefficientReachesTheRouterGradient) {
  nlohmann::json j = qwen3_moe_json();
  j["router_aux_loss_coef"] = 0.25;
  const ModelConfig cfg = ModelConfig::from_json(j, "cfg");
  const Batch batch = Batch::causal_lm({{1, 5, 9, 3, 7, 2, 11}, {4, 8, 15, 16, 23}});
  auto router_grad = [&](float coef, TrainMode mode) {
    ModelOptions o{mode, true};
    o.router_aux_loss_coef = coef;
    Model model(init_random_weights(cfg, 9), o);
    EXPECT_FLOAT_EQ(model.router_aux_coef(), mode == TrainMode::Full ? (coef < 0 ? 0.25f : coef) : 0.0f);
    if (mode != TrainMode::Full) return std::vector<float>{};
    model.forward_backward(batch, 1.0f / static_cast<float>(batch.num_label_tokens()), 1);
    EXPECT_GT(model.last_aux_loss(), 0.5);
    return model.grads().layers[0].w.router.to_vector();
  };
  const std::vector<float> off = router_grad(0.0f, TrainMode::Full), config = router_grad(-1.0f, TrainMode::Full),
                           set = router_grad(0.25f, TrainMode::Full);
  EXPECT_EQ(config, set);
  double diff = 0;
  for (size_t i = 0; i < off.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(off[i] - set[i])));
  EXPECT_GT(diff, 1e-6);
  router_grad(0.25f, TrainMode::Lora);
}

}  // namespace
}  // namespace bp

namespace bp {
namespace {

// LoRA on the experts in PEFT's files: per-expert module names (Mixtral's w1/w3/w2), loaded back into
// the stacked tensors; a missing expert tensor, and a target name the architecture lacks, refused.
TEST(MoeLora, PeftFilesPerExpertRoundTripAndBadNames) {
  for (const nlohmann::json& j : {qwen3_moe_json(), mixtral_json()}) {
    const ModelConfig cfg = ModelConfig::from_json(j, "cfg");
    SCOPED_TRACE(cfg.architecture_name);
    const bool mixtral = cfg.arch == Arch::Mixtral;
    LoraConfig lc;
    lc.r = 4;
    lc.target_modules = mixtral ? std::vector<std::string>{"q_proj", "w1", "w2", "w3"}
                                : std::vector<std::string>{"q_proj", "gate_proj", "up_proj", "down_proj"};
    LoraAdapter ad = init_lora(cfg, lc, 3);
    ASSERT_TRUE(ad.layers[0].expert_A[2].defined());
    EXPECT_EQ(ad.layers[0].expert_A[2].shape(), (Shape{cfg.num_experts, 4, cfg.moe_intermediate_size}));
    ad.layers[0].expert_B[1].copy_from(test::random_tensor(ad.layers[0].expert_B[1].shape(), 4));
    test::TempDir dir;
    save_peft_adapter(ad, dir.path);
    const SafetensorsReader r = SafetensorsReader::open_file(dir.path + "/adapter_model.safetensors");
    const std::string up1 = mixtral ? "base_model.model.model.layers.0.block_sparse_moe.experts.1.w3.lora_B.weight"
                                    : "base_model.model.model.layers.0.mlp.experts.1.up_proj.lora_B.weight";
    ASSERT_TRUE(r.contains(up1));
    EXPECT_EQ(r.read(up1).to_vector(), expert_matrix(ad.layers[0].expert_B[1], 1).to_vector());
    const LoraAdapter back = load_peft_adapter(dir.path, cfg);
    EXPECT_EQ(back.layers[0].expert_B[1].to_vector(), ad.layers[0].expert_B[1].to_vector());
    EXPECT_EQ(back.layers[0].expert_A[0].to_vector(), ad.layers[0].expert_A[0].to_vector());
    EXPECT_EQ(back.config.resolved_targets(), ad.config.resolved_targets());
    // One expert's tensor missing: refused, naming it.
    NamedTensors ts;
    for (const std::string& n : r.names())
      if (n != up1) ts.emplace_back(n, r.read(n));
    write_safetensors(dir.path + "/adapter_model.safetensors", ts);
    std::string msg = error_of(ErrorCode::DEP_MODEL_LOAD_FAILED, [&] { load_peft_adapter(dir.path, cfg); });
    EXPECT_NE(msg.find(up1 + "' is missing"), std::string::npos) << msg;
    // The other architecture's expert names do not exist here.
    LoraConfig wrong = lc;
    wrong.target_modules = {mixtral ? "gate_proj" : "w1"};
    msg = error_of(ErrorCode::CONFIG_INVALID_SETTING, [&] { init_lora(cfg, wrong, 1); });
    EXPECT_NE(msg.find("does not exist in"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace bp

namespace bp {
namespace {

// Generation's KV-cache decode runs the same sparse MLP: the prompt's last logits, and one more token
// decoded after it, equal the full forward's rows.
TEST(MoeModel, DecodeStepMatchesTheFullForward) {
  const ModelConfig cfg = ModelConfig::from_json(qwen3_moe_json(), "cfg");
  Model model(init_random_weights(cfg, 5), ModelOptions{TrainMode::Frozen});
  model.set_training(false);
  const std::vector<int32_t> ids = {3, 17, 8, 22, 5, 39};
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  const std::vector<float> full =
      model.logits(Tensor::from_vector(ids, {6}), Tensor::from_vector(pos, {6})).to_vector();
  KvCache cache(cfg, 16);
  const std::vector<float> prompt = decode_step(model, cache, {ids.begin(), ids.end() - 1});
  const std::vector<float> next = decode_step(model, cache, {ids.back()});
  const auto V = static_cast<size_t>(cfg.vocab_size);
  EXPECT_TRUE(test::all_close(prompt, std::vector<float>(full.begin() + 4 * V, full.begin() + 5 * V), {1e-5, 1e-4}));
  EXPECT_TRUE(test::all_close(next, std::vector<float>(full.begin() + 5 * V, full.end()), {1e-5, 1e-4}));
}

}  // namespace
}  // namespace bp

namespace bp {
namespace {

// LoRA on the router: all-linear on a Mixture-of-Experts model takes it (PEFT's all-linear adapts every
// nn.Linear but the output layer, and transformers' mlp.gate / block_sparse_moe.gate is one), so does
// the name "gate"; saved under PEFT's module name with "gate" in target_modules, loaded back, merged as
// W + s·B·A. Refused: "gate" on a model without a router (its MLP's gate is gate_proj), DoRA on the
// router, a router tensor without its other half.
TEST(MoeLora, RouterLoraAllLinearPeftRoundTripMergeAndRefusals) {
  for (const nlohmann::json& j : {qwen3_moe_json(), mixtral_json()}) {
    const ModelConfig cfg = ModelConfig::from_json(j, "cfg");
    SCOPED_TRACE(cfg.architecture_name);
    const bool mixtral = cfg.arch == Arch::Mixtral;
    LoraConfig lc;
    lc.r = 4;
    lc.target_modules = {"all-linear"};
    LoraAdapter ad = init_lora(cfg, lc, 3);
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      const LoraLayer& layer = ad.layers[static_cast<size_t>(l)];
      EXPECT_EQ(layer.router_A.defined(), cfg.is_moe_layer(l)) << l;  // Qwen3-MoE's layer 1 is dense
      if (!cfg.is_moe_layer(l)) continue;
      EXPECT_EQ(layer.router_A.shape(), (Shape{4, cfg.hidden_size}));
      EXPECT_EQ(layer.router_B.shape(), (Shape{cfg.num_experts, 4}));
      EXPECT_EQ(layer.router_B.to_vector(), std::vector<float>(static_cast<size_t>(cfg.num_experts) * 4, 0.0f));
    }
    std::vector<std::string> want =
        mixtral ? std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "w1", "w3", "w2", "gate"}
                : std::vector<std::string>{"q_proj",    "k_proj",  "v_proj",    "o_proj",
                                           "gate_proj", "up_proj", "down_proj", "gate"};
    EXPECT_EQ(ad.config.resolved_targets(), want);
    ad.layers[0].router_B.copy_from(test::random_tensor(ad.layers[0].router_B.shape(), 5));
    test::TempDir dir;
    save_peft_adapter(ad, dir.path);
    const SafetensorsReader r = SafetensorsReader::open_file(dir.path + "/adapter_model.safetensors");
    const std::string gate =
        mixtral ? "base_model.model.model.layers.0.block_sparse_moe.gate" : "base_model.model.model.layers.0.mlp.gate";
    ASSERT_TRUE(r.contains(gate + ".lora_B.weight"));
    EXPECT_EQ(r.read(gate + ".lora_B.weight").to_vector(), ad.layers[0].router_B.to_vector());
    EXPECT_EQ(r.read(gate + ".lora_A.weight").to_vector(), ad.layers[0].router_A.to_vector());
    const nlohmann::json ac = nlohmann::json::parse(std::ifstream(dir.path + "/adapter_config.json"));
    EXPECT_EQ(ac.at("target_modules").get<std::vector<std::string>>(), want);
    const LoraAdapter back = load_peft_adapter(dir.path, cfg);
    EXPECT_EQ(back.layers[0].router_B.to_vector(), ad.layers[0].router_B.to_vector());
    EXPECT_EQ(back.layers[0].router_A.to_vector(), ad.layers[0].router_A.to_vector());
    EXPECT_EQ(back.config.resolved_targets(), want);
    // Merged: the router W + s·B·A, computed here in double.
    const ModelWeights base = init_random_weights(cfg, 8);
    const ModelWeights merged = merge_lora(base, ad);
    const std::vector<float> W = base.layers[0].router.to_vector(), M = merged.layers[0].router.to_vector();
    const std::vector<float> A = ad.layers[0].router_A.to_vector(), B = ad.layers[0].router_B.to_vector();
    const int64_t D = cfg.hidden_size;
    double worst = 0, delta = 0;
    for (int64_t e = 0; e < cfg.num_experts; ++e)
      for (int64_t i = 0; i < D; ++i) {
        double ba = 0;
        for (int64_t k = 0; k < 4; ++k) ba += static_cast<double>(B[e * 4 + k]) * A[k * D + i];
        const size_t at = static_cast<size_t>(e * D + i);
        worst = std::max(worst, std::fabs(M[at] - (W[at] + ad.config.scale() * ba)));
        delta = std::max(delta, std::fabs(static_cast<double>(M[at]) - W[at]));
      }
    EXPECT_LT(worst, 1e-6);
    EXPECT_GT(delta, 1e-3);  // the merge changed the router
    // The router's B without its A: refused, naming the missing tensor.
    NamedTensors ts;
    for (const std::string& n : r.names())
      if (n != gate + ".lora_A.weight") ts.emplace_back(n, r.read(n));
    write_safetensors(dir.path + "/adapter_model.safetensors", ts);
    const std::string msg = error_of(ErrorCode::DEP_MODEL_LOAD_FAILED, [&] { load_peft_adapter(dir.path, cfg); });
    EXPECT_NE(msg.find(gate + ".lora_A.weight' is missing"), std::string::npos) << msg;
    // DoRA on the router (all-linear or "gate"): refused, naming it.
    LoraConfig dora = lc;
    dora.use_dora = true;
    for (const char* t : {"all-linear", "gate"}) {
      dora.target_modules = {t};
      const std::string refused = error_of(ErrorCode::CONFIG_INVALID_SETTING, [&] { init_lora(cfg, dora, 1); });
      EXPECT_NE(refused.find("router"), std::string::npos) << t << ": " << refused;
    }
  }
  // On a dense model "gate" names no module (PEFT would find none): refused, pointing at gate_proj;
  // all-linear there takes the seven projections, no "gate".
  nlohmann::json dense = qwen3_moe_json();
  dense["architectures"] = {"Qwen3ForCausalLM"};
  for (const char* k : {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "mlp_only_layers"})
    dense.erase(k);
  const ModelConfig cfg = ModelConfig::from_json(dense, "cfg");
  ASSERT_FALSE(cfg.is_moe());
  LoraConfig lc;
  lc.target_modules = {"q_proj", "gate"};
  const std::string msg = error_of(ErrorCode::CONFIG_INVALID_SETTING, [&] { init_lora(cfg, lc, 1); });
  EXPECT_NE(msg.find("'gate' is a Mixture-of-Experts router"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gate_proj"), std::string::npos) << msg;
  lc.target_modules = {"all-linear"};
  const LoraAdapter ad = init_lora(cfg, lc, 1);
  EXPECT_EQ(ad.config.resolved_targets().size(), 7u);
  EXPECT_FALSE(ad.layers[0].router_A.defined());
}

}  // namespace
}  // namespace bp
