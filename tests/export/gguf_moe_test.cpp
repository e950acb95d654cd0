// Mixture-of-Experts GGUF (Qwen3-MoE as llama.cpp's qwen3moe, Mixtral as llama with experts):
// export writes llama.cpp's expert keys and stacked ffn_*_exps tensors (checked in our reader and in
// @huggingface/gguf, whose shapes are ggml's ne: [in, out, E] as llama.cpp's create_tensor asks),
// the router stays f32, and reading the file back gives the same model (exact at f32, within the
// type's error at f16 / q8_0 / q4_k_m, with the experts held in their stored quantized type).
// Bad input: expert metadata that disagrees with the tensors, a missing expert stack, expert_used_count
// past expert_count, and models llama.cpp cannot run as stored (dense layers, norm_topk_prob false).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/error.h"
#include "export/gguf_export.h"
#include "export/gguf_lora.h"
#include "export/gguf_tokenizer.h"
#include "hub/gguf_source.h"
#include "io/gguf_reader.h"
#include "model/loader.h"
#include "model/loader_gguf.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "model/weight_names.h"
#include "support/gguf_oracle.h"
#include "support/test_util.h"

namespace bp {
namespace {

std::string stories_dir() {
  return test::shared_dir() + "/models/stories260K";
}

// Tiny MoE configs on stories260K's vocabulary (its tokenizer files give the GGUF's tokenizer).
ModelConfig moe_config(Arch arch, int64_t hidden = 32, int64_t expert_width = 32) {
  nlohmann::json j = ModelConfig::from_file(stories_dir() + "/config.json").raw;
  j["hidden_size"] = hidden;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 2;
  j["head_dim"] = hidden / 4;
  j["num_hidden_layers"] = 2;
  j["tie_word_embeddings"] = false;
  j["num_experts_per_tok"] = 2;
  if (arch == Arch::Qwen3Moe) {
    j["architectures"] = {"Qwen3MoeForCausalLM"};
    j["model_type"] = "qwen3_moe";
    j["intermediate_size"] = 64;
    j["moe_intermediate_size"] = expert_width;
    j["num_experts"] = 4;
    j["norm_topk_prob"] = true;
  } else {
    j["architectures"] = {"MixtralForCausalLM"};
    j["model_type"] = "mixtral";
    j["intermediate_size"] = expert_width;
    j["num_local_experts"] = 3;
  }
  return ModelConfig::from_json(j, "moe_config");
}

ModelWeights load_back(const std::string& path) {
  GGUFReader r(path);
  const ModelConfig c = ModelConfig::from_json(hub::gguf_model_files(r, path).config, path);
  return load_gguf_weights(c, path, std::nullopt, nullptr);
}

// Writes `w` as export_gguf does, with `edit` applied to the writer before the file is written.
std::string write_edited(const ModelWeights& w, const test::TempDir& dir,
                         const std::function<void(GGUFWriter&)>& edit) {
  GGUFWriter g;
  add_model_to_gguf(g, w, GGUFQuant::F32, "moe");
  add_tokenizer_metadata(g, read_gguf_tokenizer(stories_dir(), w.config));
  edit(g);
  const std::string path = dir.path + "/edited.gguf";
  g.write(path);
  return path;
}

std::string load_error(const std::string& path) {
  try {
    load_back(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_MODEL_LOAD_FAILED) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected DEP_MODEL_LOAD_FAILED for " << path;
  return "";
}

double rel_rmse(const std::vector<float>& y, const std::vector<float>& x) {
  double se = 0, ss = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    se += double(y[i] - x[i]) * (y[i] - x[i]);
    ss += double(x[i]) * x[i];
  }
  return std::sqrt(se / ss);
}

TEST(GGUFMoe, Qwen3MoeAndMixtralRoundTripAsLlamaCppStoresThem) {
  for (Arch arch : {Arch::Qwen3Moe, Arch::Mixtral}) {
    const ModelConfig c = moe_config(arch);
    SCOPED_TRACE(c.architecture_name);
    const ModelWeights w = init_random_weights(c, 5);
    const int64_t E = c.num_experts, F = c.moe_intermediate_size, D = c.hidden_size;
    test::TempDir dir;
    const std::string path = dir.path + "/moe.gguf";
    export_gguf(w, stories_dir(), GGUFQuant::F32, path);
    GGUFReader r(path);
    const std::string a = arch == Arch::Qwen3Moe ? "qwen3moe" : "llama";
    EXPECT_EQ(r.get_string("general.architecture"), a);
    EXPECT_EQ(r.get_int(a + ".expert_count"), E);
    EXPECT_EQ(r.get_int(a + ".expert_used_count"), 2);
    if (arch == Arch::Qwen3Moe)
      EXPECT_EQ(r.get_int("qwen3moe.expert_feed_forward_length"), F);
    else
      EXPECT_FALSE(r.find("llama.expert_feed_forward_length"));  // LlamaModel writes feed_forward_length only
    EXPECT_EQ(r.get_int(a + ".feed_forward_length"), c.intermediate_size);
    for (int l = 0; l < 2; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      EXPECT_EQ(r.find_tensor(p + "ffn_gate.weight"), nullptr);
      ASSERT_NE(r.find_tensor(p + "ffn_gate_inp.weight"), nullptr);
      EXPECT_EQ(r.find_tensor(p + "ffn_gate_exps.weight")->shape, (std::vector<int64_t>{E, F, D}));
      EXPECT_EQ(r.find_tensor(p + "ffn_up_exps.weight")->shape, (std::vector<int64_t>{E, F, D}));
      EXPECT_EQ(r.find_tensor(p + "ffn_down_exps.weight")->shape, (std::vector<int64_t>{E, D, F}));
    }
    // Expert 2's down projection is the third slab of the stack (Mixtral's q/k are permuted, experts not).
    const std::vector<float> down = r.dequantize(*r.find_tensor("blk.1.ffn_down_exps.weight"));
    const std::vector<float> e2 = expert_matrix(w.layers[1].experts_down, 2).to_vector();
    EXPECT_EQ(std::vector<float>(down.begin() + 2 * D * F, down.begin() + 3 * D * F), e2);
    // The independent reader: the same file, and ggml's ne order llama.cpp's create_tensor asks for
    // ({n_embd, n_expert} router, {n_embd, n_ff_exp, n_expert} gate/up, {n_ff_exp, n_embd, n_expert} down).
    const nlohmann::json o = gguf_testing::oracle_read(path);
    gguf_testing::expect_oracle_matches(o, r);
    std::map<std::string, std::vector<int64_t>> ne;
    for (const auto& t : o["tensors"]) ne[t["name"].get<std::string>()] = t["shape"].get<std::vector<int64_t>>();
    EXPECT_EQ(ne["blk.0.ffn_gate_inp.weight"], (std::vector<int64_t>{D, E}));
    EXPECT_EQ(ne["blk.0.ffn_gate_exps.weight"], (std::vector<int64_t>{D, F, E}));
    EXPECT_EQ(ne["blk.0.ffn_up_exps.weight"], (std::vector<int64_t>{D, F, E}));
    EXPECT_EQ(ne["blk.0.ffn_down_exps.weight"], (std::vector<int64_t>{F, D, E}));

    const ModelWeights back = load_back(path);
    const ModelConfig& b = back.config;
    EXPECT_EQ(b.arch, arch);
    EXPECT_EQ(b.num_experts, E);
    EXPECT_EQ(b.num_experts_per_tok, 2);
    EXPECT_EQ(b.moe_intermediate_size, F);
    EXPECT_TRUE(b.norm_topk_prob);
    EXPECT_EQ(b.moe_layers, c.moe_layers);
    for (const auto& [role, layer] : model_roles(c))
      EXPECT_EQ(weight_ref(back, role, layer).to_vector(), weight_ref(w, role, layer).to_vector())
          << moe_aware_name(c, role, layer);
  }
}

// f16, q8_0 and q4_k_m: the router stays f32 (llama.cpp never quantizes ffn_gate_inp), the experts
// take the mixture's types (ffn_down_exps gets q4_k_m's extra bits like ffn_down), and loading
// with the stored type keeps them quantized (frozen experts held as they are stored).
TEST(GGUFMoe, QuantizedExpertsLoadHeldInTheirStoredType) {
  struct Case {
    GGUFQuant q;
    int64_t hidden;
    GGMLType gate, down;
    DType held;
    double tol;
  };
  for (const Case& k : {Case{GGUFQuant::F16, 32, GGMLType::F16, GGMLType::F16, DType::F16, 1e-3},
                        Case{GGUFQuant::Q8_0, 32, GGMLType::Q8_0, GGMLType::Q8_0, DType::Q8_0, 0.01},
                        Case{GGUFQuant::Q4_K_M, 256, GGMLType::Q4_K, GGMLType::Q6_K, DType::Q4_K, 0.15}}) {
    const ModelConfig c = moe_config(Arch::Qwen3Moe, k.hidden, k.hidden);
    SCOPED_TRACE(gguf_quant_name(k.q));
    const ModelWeights w = init_random_weights(c, 6);
    test::TempDir dir;
    const std::string path = dir.path + "/moe.gguf";
    export_gguf(w, stories_dir(), k.q, path);
    GGUFReader r(path);
    EXPECT_EQ(r.find_tensor("blk.0.ffn_gate_inp.weight")->type, GGMLType::F32);
    EXPECT_EQ(r.find_tensor("blk.0.ffn_gate_exps.weight")->type, k.gate);
    EXPECT_EQ(r.find_tensor("blk.1.ffn_down_exps.weight")->type, k.down);  // use_more_bits(1, 2)
    const ModelWeights back = load_back(path);
    EXPECT_EQ(back.layers[1].experts_gate.dtype(), k.held);
    EXPECT_EQ(back.layers[1].router.dtype(), DType::F32);
    EXPECT_EQ(back.layers[1].router.to_vector(), w.layers[1].router.to_vector());
    for (WeightRole role : {WeightRole::ExpertGate, WeightRole::ExpertUp, WeightRole::ExpertDown})
      for (int64_t l = 0; l < 2; ++l)
        EXPECT_LE(rel_rmse(weight_ref(back, role, l).to_vector(), weight_ref(w, role, l).to_vector()), k.tol)
            << moe_aware_name(c, role, l);
    // Asked for f32, the same file dequantizes every expert.
    GGUFReader r2(path);
    const ModelConfig c2 = ModelConfig::from_json(hub::gguf_model_files(r2, path).config, path);
    EXPECT_EQ(load_gguf_weights(c2, path, DType::F32).layers[0].experts_down.dtype(), DType::F32);
  }
}

TEST(GGUFMoe, ExpertMetadataThatDisagreesWithTheTensorsIsRefused) {
  const ModelConfig c = moe_config(Arch::Qwen3Moe);
  const ModelWeights w = init_random_weights(c, 7);
  test::TempDir dir;
  auto u32 = [](int64_t v) { return GGUFValue::u32(static_cast<uint32_t>(v)); };
  std::string msg = load_error(write_edited(w, dir, [&](GGUFWriter& g) { g.set("qwen3moe.expert_count", u32(5)); }));
  EXPECT_NE(msg.find("tensor 'blk.0.ffn_gate_inp.weight' has shape [4, 32]; qwen3moe.expert_count = 5"),
            std::string::npos)
      << msg;
  msg = load_error(write_edited(w, dir, [&](GGUFWriter& g) { g.set("qwen3moe.expert_feed_forward_length", u32(16)); }));
  EXPECT_NE(msg.find("tensor 'blk.0.ffn_gate_exps.weight' has shape [4, 32, 32]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expert width of 16"), std::string::npos) << msg;
  msg = load_error(write_edited(w, dir, [&](GGUFWriter& g) { g.set("qwen3moe.expert_used_count", u32(6)); }));
  EXPECT_NE(msg.find("metadata qwen3moe.expert_used_count is 6; it must be in [1, qwen3moe.expert_count = 4]"),
            std::string::npos)
      << msg;
  ModelWeights missing = w;
  missing.layers[1].experts_up = Tensor();  // not written
  msg = load_error(write_edited(missing, dir, [](GGUFWriter&) {}));
  EXPECT_NE(msg.find("tensor 'blk.1.ffn_up_exps.weight' is missing"), std::string::npos) << msg;
  // A llama file with a router but no expert_count.
  const ModelConfig mc = moe_config(Arch::Mixtral);
  const ModelWeights mw = init_random_weights(mc, 8);
  GGUFWriter g;
  add_model_to_gguf(g, mw, GGUFQuant::F32, "moe");
  add_tokenizer_metadata(g, read_gguf_tokenizer(stories_dir(), mc));
  g.set("llama.expert_count", u32(0));
  g.write(dir.path + "/no_count.gguf");
  msg = load_error(dir.path + "/no_count.gguf");
  EXPECT_NE(msg.find("tensor blk.0.ffn_gate_inp.weight (a Mixture-of-Experts router) is present but metadata "
                     "llama.expert_count is 0"),
            std::string::npos)
      << msg;
}

TEST(GGUFMoe, ModelsLlamaCppWouldRunDifferentlyAreNotExported) {
  auto export_error = [](const ModelConfig& c) {
    test::TempDir dir;
    try {
      export_gguf(init_random_weights(c, 9), stories_dir(), GGUFQuant::F32, dir.path + "/x.gguf");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::RUNTIME_GGUF_EXPORT_FAILED) << e.what();
      return std::string(e.what());
    }
    ADD_FAILURE() << "expected RUNTIME_GGUF_EXPORT_FAILED";
    return std::string();
  };
  nlohmann::json j = moe_config(Arch::Qwen3Moe).raw;
  j["mlp_only_layers"] = {1};
  EXPECT_NE(export_error(ModelConfig::from_json(j, "cfg")).find("dense MLP on layer 1"), std::string::npos);
  j = moe_config(Arch::Qwen3Moe).raw;
  j["norm_topk_prob"] = false;
  EXPECT_NE(export_error(ModelConfig::from_json(j, "cfg")).find("norm_topk_prob false"), std::string::npos);
}

// A GGUF LoRA adapter of a MoE base: attention under qwen3moe's names, and the experts' LoRA
// stacked on ffn_*_exps as llama.cpp's build_lora_mm_id reads it (lora_a ne {in, r, E}, lora_b
// ne {r, out, E}: checked in @huggingface/gguf too), every expert's values where they belong.
TEST(GGUFMoe, LoraAdapterOnAttentionAndExpertsAsLlamaCppReadsIt) {
  const ModelConfig c = moe_config(Arch::Qwen3Moe);
  const int64_t E = c.num_experts, F = c.moe_intermediate_size, D = c.hidden_size, r = 4;
  LoraConfig lc;
  lc.r = r;
  lc.alpha = 8;
  lc.target_modules = {"q_proj", "v_proj", "gate_proj", "down_proj", "gate"};  // gate: the router
  LoraAdapter ad = init_lora(c, lc, 3);
  for (auto& layer : ad.layers) {
    for (Tensor& B : layer.expert_B)
      if (B.defined()) B = test::random_tensor(B.shape(), 9, -1.0f, 1.0f);
    layer.router_B = test::random_tensor(layer.router_B.shape(), 10, -1.0f, 1.0f);
  }
  ASSERT_TRUE(ad.layers[1].expert_A[0].defined());
  ASSERT_FALSE(ad.layers[1].expert_A[1].defined());  // up_proj not targeted
  test::TempDir dir;
  const std::string path = dir.path + "/a.gguf";
  const GGUFLoraResult res = export_gguf_lora(ad, c, GGMLType::F32, path);
  EXPECT_EQ(res.tensor_count, c.num_layers * (2 + 2 + 1) * 2);
  GGUFReader r2(path);
  EXPECT_EQ(r2.get_string("general.architecture"), "qwen3moe");
  EXPECT_EQ(r2.dequantize(*r2.find_tensor("blk.1.attn_v.weight.lora_a")), ad.layers[1].a(LoraTarget::V).to_vector());
  EXPECT_EQ(r2.find_tensor("blk.0.ffn_up_exps.weight.lora_a"), nullptr);
  EXPECT_EQ(r2.find_tensor("blk.1.ffn_gate_exps.weight.lora_a")->shape, (std::vector<int64_t>{E, r, D}));
  EXPECT_EQ(r2.find_tensor("blk.1.ffn_down_exps.weight.lora_b")->shape, (std::vector<int64_t>{E, D, r}));
  EXPECT_EQ(r2.dequantize(*r2.find_tensor("blk.1.ffn_down_exps.weight.lora_b")), ad.layers[1].expert_B[2].to_vector());
  EXPECT_EQ(r2.dequantize(*r2.find_tensor("blk.0.ffn_gate_exps.weight.lora_a")), ad.layers[0].expert_A[0].to_vector());
  // The router's A [r, D] and B [E, r] on ffn_gate_inp (llama.cpp's build_moe_ffn: build_lora_mm(gate_inp, cur)).
  EXPECT_EQ(r2.dequantize(*r2.find_tensor("blk.1.ffn_gate_inp.weight.lora_a")), ad.layers[1].router_A.to_vector());
  EXPECT_EQ(r2.dequantize(*r2.find_tensor("blk.1.ffn_gate_inp.weight.lora_b")), ad.layers[1].router_B.to_vector());
  const nlohmann::json o = gguf_testing::oracle_read(path);
  gguf_testing::expect_oracle_matches(o, r2);
  std::map<std::string, std::vector<int64_t>> ne;
  for (const auto& t : o["tensors"]) ne[t["name"].get<std::string>()] = t["shape"].get<std::vector<int64_t>>();
  // llama-adapter.cpp's checks: a's ne[0] and b's ne[1] are the base's ne[0] and ne[1], a's ne[1] = b's ne[0].
  EXPECT_EQ(ne["blk.0.ffn_gate_exps.weight.lora_a"], (std::vector<int64_t>{D, r, E}));
  EXPECT_EQ(ne["blk.0.ffn_gate_exps.weight.lora_b"], (std::vector<int64_t>{r, F, E}));
  EXPECT_EQ(ne["blk.0.ffn_down_exps.weight.lora_a"], (std::vector<int64_t>{F, r, E}));
  EXPECT_EQ(ne["blk.0.ffn_down_exps.weight.lora_b"], (std::vector<int64_t>{r, D, E}));
  EXPECT_EQ(ne["blk.0.ffn_gate_inp.weight.lora_a"], (std::vector<int64_t>{D, r}));  // the router [E, D]: ne {D, E}
  EXPECT_EQ(ne["blk.0.ffn_gate_inp.weight.lora_b"], (std::vector<int64_t>{r, E}));
}

std::vector<float> logits_of(ModelWeights w) {
  Model m(std::move(w), ModelOptions{TrainMode::Frozen});
  m.set_training(false);
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 56, 424, 263, 17, 300, 5};
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  const auto T = static_cast<int64_t>(ids.size());
  return m.logits(Tensor::from_vector(ids, {T}), Tensor::from_vector(pos, {T})).to_vector();
}

// The file runs as the model did: Model::logits of the GGUF read back (experts held in the stored
// type) against the original weights' — the same at f32, within q8_0's error otherwise.
TEST(GGUFMoe, LogitsOfTheFileAreTheModels) {
  for (Arch arch : {Arch::Qwen3Moe, Arch::Mixtral}) {
    const ModelConfig c = moe_config(arch);
    SCOPED_TRACE(c.architecture_name);
    const ModelWeights w = init_random_weights(c, 12);
    const std::vector<float> ref = logits_of(w);
    for (GGUFQuant q : {GGUFQuant::F32, GGUFQuant::F16, GGUFQuant::Q8_0}) {
      SCOPED_TRACE(gguf_quant_name(q));
      test::TempDir dir;
      export_gguf(w, stories_dir(), q, dir.path + "/m.gguf");
      const ModelWeights back = load_back(dir.path + "/m.gguf");
      if (q == GGUFQuant::Q8_0) {
        EXPECT_EQ(back.layers[0].experts_up.dtype(), DType::Q8_0);
      }
      const std::vector<float> got = logits_of(back);
      EXPECT_LE(rel_rmse(got, ref), q == GGUFQuant::F32 ? 1e-6 : q == GGUFQuant::F16 ? 2e-3 : 2e-2);
    }
  }
}

}  // namespace
}  // namespace bp
