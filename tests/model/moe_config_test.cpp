// Mixture-of-Experts configs and folders (Qwen3-MoE, Mixtral): config.json's MoE fields as
// transformers' Qwen3MoeConfig / MixtralConfig read them, sparse and dense layers, the stacked expert
// tensors (model/weights.h) loaded from and saved to Hugging Face's per-expert names, held types, and
// bad input: num_experts_per_tok out of range, experts without a router, a missing expert, a shape
// that disagrees with the config.
#include <gtest/gtest.h>

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
    try {
      load_peft_adapter(dir.path, cfg);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED);
      EXPECT_NE(std::string(e.what()).find(up1 + "' is missing"), std::string::npos) << e.what();
    }
    // The other architecture's expert names do not exist here.
    LoraConfig wrong = lc;
    wrong.target_modules = {mixtral ? "gate_proj" : "w1"};
    try {
      init_lora(cfg, wrong, 1);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::CONFIG_INVALID_SETTING);
      EXPECT_NE(std::string(e.what()).find("does not exist in"), std::string::npos) << e.what();
    }
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
