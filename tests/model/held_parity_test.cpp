// QLoRA on the CPU against PyTorch: LoRA runs whose frozen base is held at q8_0, q4_K and bf16
// (model/held_weights.h) give the same loss, logits and LoRA gradients, and the same 10-step AdamW
// trajectory, as tests/oracles/torch_llama.py run on the very same dequantized values (the oracle
// gets each held tensor through Tensor::to_vector, i.e. dequantized by core/quant_blocks.h).
// Tolerances are parity_test.cpp's (f32 against the oracle's f64): the held path changes where
// the values come from, not the precision of the arithmetic.
//
// Shapes: hidden 256 and intermediate 512 so every projection and the embedding are whole q4_K
// blocks (256); the tied cases make the LM head read the quantized embedding. The q8_0 case is
// untied, so the LM head is a held weight of its own. If /usr/bin/python3 or torch is missing these
// tests FAIL (never skip).
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "model/held_weights.h"
#include "model/model_test_helpers.h"
#include "support/f32_cpu_gemms.h"

namespace bp::test {
namespace {

struct HeldCase {
  std::string name;
  DType base;
  bool tied = true;
  int adamw_steps = 0;
  uint64_t seed = 1;
};

std::vector<HeldCase> held_cases() {
  return {{"q4_k_tied", DType::Q4_K, true, 0, 11},
          {"q8_0_untied", DType::Q8_0, false, 0, 12},
          {"bf16_tied", DType::BF16, true, 0, 13},
          {"adamw_q4_k", DType::Q4_K, true, 10, 14},
          {"adamw_q8_0", DType::Q8_0, false, 10, 15}};
}

struct Built {
  std::unique_ptr<Model> model;
  std::unique_ptr<TinyLora> lora;
  Batch batch;
};

Built build(const HeldCase& hc) {
  TinySpec spec;
  spec.hidden = 256;
  spec.inter = 512;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 64;
  spec.tied = hc.tied;
  const ModelConfig cfg = tiny_config(spec);
  ModelWeights w = tiny_weights(cfg, hc.seed * 100);
  EXPECT_TRUE(hold_weights(w, hc.base).empty()) << "every row is whole blocks: no fallback expected";
  Built b;
  b.model = std::make_unique<Model>(std::move(w), ModelOptions{TrainMode::Lora, true});
  b.lora = std::make_unique<TinyLora>();
  make_tiny_lora(*b.lora, cfg, 4, 8.0f, false, all_roles(), 0.0f, hc.seed * 100 + 50);
  b.model->attach_lora(b.lora->view);
  b.batch = tiny_batch(cfg.vocab_size, hc.seed);
  return b;
}

OracleAdamW adamw_settings(const HeldCase& hc) {
  OracleAdamW a;
  a.steps = hc.adamw_steps;
  a.lr = 1e-2f;
  a.weight_decay = 0.01f;
  return a;
}

const std::map<std::string, OracleResult>& oracle_results(std::string* error) {
  static std::string err;
  static TempDir dir;
  static const std::map<std::string, OracleResult> results =
      run_oracle_cases(held_cases(), dir.path, build, adamw_settings, &err);
  *error = err;
  return results;
}

// The base really is held: every projection and the embedding (and an untied head) in the asked
// type, norms in f32.
void expect_held(const Model& model, DType base) {
  const ModelWeights& w = model.weights();
  EXPECT_EQ(w.embed.dtype(), base);
  if (!w.config.tie_word_embeddings) {
    EXPECT_EQ(w.lm_head.dtype(), base);
  }
  for (const auto& l : w.layers) {
    for (const Tensor* t : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) EXPECT_EQ(t->dtype(), base);
    EXPECT_EQ(l.input_norm.dtype(), DType::F32);
  }
}

void check_case(const HeldCase& hc, const OracleResult& ref) {
  // The oracle multiplies in f32: a bf16 base is compared on --cpu-gemm openblas.
  const test::F32CpuGemms f32_gemms(hc.base == DType::BF16);
  Built b = build(hc);
  Model& model = *b.model;
  expect_held(model, hc.base);
  Tensor logits = model.logits(b.batch);
  EXPECT_TRUE(all_close(to_double(logits), ref.arrays.at("logits"), kParityLogits)) << "logits";
  model.zero_grads();
  const int64_t n = b.batch.num_label_tokens();
  const CrossEntropyResult res = model.forward_backward(b.batch, 1.0f / static_cast<float>(n), 1234);
  EXPECT_NEAR(res.mean(), ref.loss, kParityLossRel * std::fabs(ref.loss)) << "loss";
  size_t compared = 0;
  for (const auto& p : model.trainable_parameters()) {
    auto it = ref.arrays.find("grad:" + p.name);
    ASSERT_NE(it, ref.arrays.end()) << p.name;
    const double scale = max_abs(it->second);
    ASSERT_GT(scale, 0.0) << p.name;
    EXPECT_TRUE(all_close(to_double(*p.grad), it->second, Tolerance{kParityGradOfMax * scale, kParityGradRel}))
        << p.name;
    ++compared;
  }
  EXPECT_EQ(compared, 2 * all_roles().size() * static_cast<size_t>(model.config().num_layers));
}

void check_trajectory(const HeldCase& c, const OracleResult& ref) {
  ASSERT_EQ(ref.adamw_losses.size(), 10u);
  Built b = build(c);
  expect_adamw_trajectory_matches(*b.model, b.batch, adamw_settings(c), ref.adamw_losses);
}

TEST(HeldParity, LoraOnQuantizedBaseMatchesTorchOnTheDequantizedValues) {
  std::string error;
  const auto& results = oracle_results(&error);
  ASSERT_TRUE(error.empty()) << error;
  for (const auto& hc : held_cases()) {
    SCOPED_TRACE("case " + hc.name);
    const auto it = results.find(hc.name);
    ASSERT_NE(it, results.end());
    if (hc.adamw_steps)
      check_trajectory(hc, it->second);
    else
      check_case(hc, it->second);
  }
}

// The oracle is fed the dequantized values, so the test above cannot tell a held run from an f32
// run of the same values. This one can: the held model's outputs differ from the f32 model it was
// quantized from (by the quantization error), and equal the f32 model of the dequantized values.
TEST(HeldParity, HeldBaseComputesWithTheQuantizedValuesNotTheOriginalOnes) {
  TinySpec spec;
  spec.hidden = 256;
  spec.inter = 512;
  spec.head_dim = 64;
  const ModelConfig cfg = tiny_config(spec);
  ModelWeights held_w = tiny_weights(cfg, 7);
  hold_weights(held_w, DType::Q4_K);
  ModelWeights dequantized = tiny_weights(cfg, 7);
  for (const auto& [role, layer] : model_roles(cfg)) {
    Tensor& t = weight_ref(dequantized, role, layer);
    t = Tensor::from_vector(weight_ref(held_w, role, layer).to_vector(), t.shape());
  }
  const Batch batch = tiny_batch(cfg.vocab_size, 3);
  const Tensor l_held = Model(std::move(held_w), ModelOptions{TrainMode::Lora, true}).logits(batch);
  const Tensor l_orig = Model(tiny_weights(cfg, 7), ModelOptions{TrainMode::Lora, true}).logits(batch);
  const Tensor l_deq = Model(std::move(dequantized), ModelOptions{TrainMode::Lora, true}).logits(batch);
  EXPECT_TRUE(all_close(to_double(l_held), to_double(l_deq), Tolerance{1e-5, 1e-5}));
  EXPECT_FALSE(all_close(to_double(l_held), to_double(l_orig), Tolerance{1e-4, 1e-4}));
}

}  // namespace
}  // namespace bp::test
