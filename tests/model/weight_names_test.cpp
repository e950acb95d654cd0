// The weight-name table: names per role, parsing back, presence per architecture, shapes.
#include "model/weight_names.h"

#include <set>

#include "support/test_util.h"

namespace bp {

TEST(WeightNames, NamesForEachColumn) {
  EXPECT_EQ(hf_name(WeightRole::Q, 3), "model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(peft_module_name(WeightRole::Q, 3), "base_model.model.model.layers.3.self_attn.q_proj");
  EXPECT_EQ(gguf_name(WeightRole::Q, 3), "blk.3.attn_q.weight");
  EXPECT_EQ(hf_name(WeightRole::Embed), "model.embed_tokens.weight");
  EXPECT_EQ(gguf_name(WeightRole::Embed), "token_embd.weight");
  EXPECT_EQ(gguf_name(WeightRole::FinalNorm), "output_norm.weight");
  EXPECT_EQ(gguf_name(WeightRole::LmHead), "output.weight");
  EXPECT_EQ(gguf_name(WeightRole::InputNorm, 0), "blk.0.attn_norm.weight");
  EXPECT_EQ(gguf_name(WeightRole::PostNorm, 1), "blk.1.ffn_norm.weight");
  EXPECT_EQ(gguf_name(WeightRole::O, 2), "blk.2.attn_output.weight");
  EXPECT_EQ(gguf_name(WeightRole::QBias, 2), "blk.2.attn_q.bias");
  EXPECT_EQ(gguf_name(WeightRole::KNorm, 2), "blk.2.attn_k_norm.weight");
  EXPECT_EQ(hf_name(WeightRole::Down, 11), "model.layers.11.mlp.down_proj.weight");
  EXPECT_EQ(gguf_name(WeightRole::Down, 11), "blk.11.ffn_down.weight");
  EXPECT_EQ(peft_lora_name(0, LoraTarget::Up, true), "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight");
  EXPECT_EQ(peft_lora_name(5, LoraTarget::O, false), "base_model.model.model.layers.5.self_attn.o_proj.lora_B.weight");
  EXPECT_THROW(hf_name(WeightRole::Q), Error);  // per-layer role needs a layer
}

TEST(WeightNames, EveryNameParsesBackAndIsUnique) {
  std::set<std::string> hf, gguf;
  EXPECT_EQ(weight_name_table().size(), static_cast<size_t>(kNumWeightRoles));
  for (const WeightNameEntry& e : weight_name_table()) {
    if (!*e.gguf) continue;  // named per architecture (GemmaSandwichNormsInGguf)
    for (int64_t layer : {0L, 7L, 123L}) {
      const int64_t l = e.per_layer ? layer : -1;
      EXPECT_EQ(parse_hf_name(hf_name(e.role, l)), std::pair(e.role, l)) << e.hf;
      EXPECT_EQ(parse_gguf_name(gguf_name(e.role, l)), std::pair(e.role, l)) << e.gguf;
      hf.insert(hf_name(e.role, l));
      gguf.insert(gguf_name(e.role, l));
    }
  }
  EXPECT_EQ(hf.size(), gguf.size());
  EXPECT_FALSE(parse_hf_name("model.layers.x.mlp.up_proj.weight"));
  EXPECT_FALSE(parse_hf_name("model.layers..mlp.up_proj.weight"));
  EXPECT_FALSE(parse_hf_name("model.layers.-1.mlp.up_proj.weight"));
  EXPECT_FALSE(parse_hf_name("model.rotary_emb.inv_freq"));
  EXPECT_FALSE(parse_gguf_name("blk.1.attn_q"));
}

// Gemma's four norms a layer: HF names as transformers saves them, GGUF names as llama.cpp's
// llama-arch.cpp gives LLM_ARCH_GEMMA2/GEMMA3 (attn_norm, post_attention_norm, ffn_norm, post_ffw_norm).
TEST(WeightNames, GemmaSandwichNormsInGguf) {
  ModelConfig g;
  g.sandwich_norms = true;
  EXPECT_EQ(hf_name(WeightRole::PostNorm, 2), "model.layers.2.post_attention_layernorm.weight");
  EXPECT_EQ(hf_name(WeightRole::PreFfnNorm, 2), "model.layers.2.pre_feedforward_layernorm.weight");
  EXPECT_EQ(hf_name(WeightRole::PostFfnNorm, 2), "model.layers.2.post_feedforward_layernorm.weight");
  EXPECT_EQ(gguf_name(g, WeightRole::InputNorm, 2), "blk.2.attn_norm.weight");
  EXPECT_EQ(gguf_name(g, WeightRole::PostNorm, 2), "blk.2.post_attention_norm.weight");
  EXPECT_EQ(gguf_name(g, WeightRole::PreFfnNorm, 2), "blk.2.ffn_norm.weight");
  EXPECT_EQ(gguf_name(g, WeightRole::PostFfnNorm, 2), "blk.2.post_ffw_norm.weight");
  for (WeightRole r : {WeightRole::InputNorm, WeightRole::PostNorm, WeightRole::PreFfnNorm, WeightRole::PostFfnNorm,
                       WeightRole::Q, WeightRole::QNorm})
    EXPECT_EQ(parse_gguf_name(g, gguf_name(g, r, 5)), std::pair(r, int64_t{5}));
  const ModelConfig llama;
  EXPECT_EQ(gguf_name(llama, WeightRole::PostNorm, 2), "blk.2.ffn_norm.weight");
  EXPECT_EQ(parse_gguf_name(llama, "blk.2.ffn_norm.weight"), std::pair(WeightRole::PostNorm, int64_t{2}));
  EXPECT_THROW(gguf_name(WeightRole::PreFfnNorm, 0), Error);
}

TEST(WeightNames, PresenceAndShapesFollowTheConfig) {
  ModelConfig c;
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 12;
  c.tie_word_embeddings = true;
  auto roles = model_roles(c);
  EXPECT_EQ(roles.size(), 1u + 2u * 9u + 1u);  // embed, 9 per layer, final norm
  EXPECT_EQ(roles.front().first, WeightRole::Embed);
  EXPECT_EQ(roles.back().first, WeightRole::FinalNorm);
  c.tie_word_embeddings = false;
  c.attention_bias = true;
  c.qk_norm = true;
  roles = model_roles(c);
  EXPECT_EQ(roles.size(), 2u + 2u * 14u + 1u);
  EXPECT_EQ(roles.back().first, WeightRole::LmHead);
  EXPECT_EQ(role_shape(c, WeightRole::Q), Shape({48, 32}));
  EXPECT_EQ(role_shape(c, WeightRole::K), Shape({24, 32}));
  EXPECT_EQ(role_shape(c, WeightRole::O), Shape({32, 48}));
  EXPECT_EQ(role_shape(c, WeightRole::VBias), Shape({24}));
  EXPECT_EQ(role_shape(c, WeightRole::QNorm), Shape({12}));
  EXPECT_EQ(role_shape(c, WeightRole::Down), Shape({32, 48}));
  EXPECT_EQ(role_shape(c, WeightRole::LmHead), Shape({50, 32}));
  // The LoRA targets and their base weights agree on shapes.
  for (LoraTarget t : kAllLoraTargets)
    EXPECT_EQ(role_shape(c, lora_target_role(t)), Shape({lora_target_out(c, t), lora_target_in(c, t)}));
  int64_t n = 0;
  for (auto [r, l] : roles) n += role_shape(c, r).numel();
  EXPECT_EQ(n, c.num_parameters());
}

}  // namespace bp
