#include "model/lora.h"

#include <cmath>

#include "support/test_util.h"

namespace bp {
namespace {

ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  return c;
}

}  // namespace

TEST(Lora, ScaleAndTargets) {
  LoraConfig l;
  l.r = 16;
  l.alpha = 32;
  EXPECT_FLOAT_EQ(l.scale(), 2.0f);
  l.use_rslora = true;
  EXPECT_FLOAT_EQ(l.scale(), 8.0f);
  l.target_modules = {"q_proj", "v_proj"};
  EXPECT_TRUE(l.targets(LoraTarget::Q));
  EXPECT_FALSE(l.targets(LoraTarget::K));
  EXPECT_EQ(l.resolved_targets(), (std::vector<std::string>{"q_proj", "v_proj"}));
  l.target_modules = {"all-linear"};
  EXPECT_EQ(l.resolved_targets().size(), 7u);
  EXPECT_EQ(parse_lora_target("down_proj"), LoraTarget::Down);
  EXPECT_FALSE(parse_lora_target("lm_head").has_value());
}

TEST(Lora, ValidateRejectsBadSettings) {
  LoraConfig l;
  l.target_modules = {"qproj"};
  try {
    l.validate();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::CONFIG_INVALID_SETTING);
    EXPECT_NE(std::string(e.what()).find("qproj"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("gate_proj"), std::string::npos);
  }
  LoraConfig r0;
  r0.r = 0;
  EXPECT_THROW(r0.validate(), Error);
  LoraConfig d1;
  d1.dropout = 1.0f;
  EXPECT_THROW(d1.validate(), Error);
}

TEST(Lora, InitFollowsPeft) {
  ModelConfig c = tiny_config();
  LoraConfig l;
  l.r = 3;
  l.target_modules = {"all-linear"};
  LoraAdapter ad = init_lora(c, l, 7);
  ASSERT_EQ(ad.layers.size(), 2u);
  for (const LoraLayer& layer : ad.layers) {
    for (LoraTarget t : kAllLoraTargets) {
      ASSERT_TRUE(layer.has(t));
      const int64_t in = lora_target_in(c, t), out = lora_target_out(c, t);
      EXPECT_EQ(layer.a(t).shape(), Shape({3, in}));
      EXPECT_EQ(layer.b(t).shape(), Shape({out, 3}));
      const float bound = 1.0f / std::sqrt(static_cast<float>(in));
      float max_abs = 0;
      for (float v : layer.a(t).to_vector()) max_abs = std::max(max_abs, std::fabs(v));
      EXPECT_LE(max_abs, bound);
      EXPECT_GT(max_abs, 0.5f * bound);  // spread over the range, not all tiny
      for (float v : layer.b(t).to_vector()) EXPECT_EQ(v, 0.0f);
    }
  }
  EXPECT_EQ(lora_target_out(c, LoraTarget::K), 8);
  EXPECT_EQ(lora_target_in(c, LoraTarget::Down), 24);
  // 2 layers x (q 3*(16+16) + k 3*(16+8) + v same + o 3*(16+16) + gate/up 3*(16+24) x2 + down 3*(24+16))
  EXPECT_EQ(ad.num_parameters(), 2 * 3 * (32 + 24 + 24 + 32 + 40 + 40 + 40));
}

TEST(Lora, InitIsDeterministicAndPerTarget) {
  ModelConfig c = tiny_config();
  LoraConfig all;
  all.target_modules = {"all-linear"};
  LoraConfig qv;
  qv.target_modules = {"q_proj", "v_proj"};
  LoraAdapter a1 = init_lora(c, all, 5), a2 = init_lora(c, all, 5), b = init_lora(c, qv, 5), d = init_lora(c, all, 6);
  EXPECT_EQ(a1.layers[1].a(LoraTarget::Up).to_vector(), a2.layers[1].a(LoraTarget::Up).to_vector());
  EXPECT_EQ(a1.layers[1].a(LoraTarget::V).to_vector(), b.layers[1].a(LoraTarget::V).to_vector());
  EXPECT_FALSE(b.layers[0].has(LoraTarget::K));
  EXPECT_NE(a1.layers[0].a(LoraTarget::Q).to_vector(), d.layers[0].a(LoraTarget::Q).to_vector());
  EXPECT_NE(a1.layers[0].a(LoraTarget::Q).to_vector(), a1.layers[1].a(LoraTarget::Q).to_vector());
}

}  // namespace bp
