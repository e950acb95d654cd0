// Transformer behaviour beyond oracle parity: checkpointing changes memory but not numbers,
// micro-batch accumulation, frozen weights, LoRA dropout reproducibility, input errors.
#include <gtest/gtest.h>

#include <iostream>
#include <map>

#include "core/allocator.h"
#include "model/lora.h"
#include "model/model_test_helpers.h"

namespace bp::test {
namespace {

std::vector<std::vector<float>> grads_of(Model& m) {
  std::vector<std::vector<float>> g;
  for (auto& p : m.trainable_parameters()) g.push_back(p.grad->to_vector());
  return g;
}

void expect_same_grads(Model& a, Model& b, Tolerance tol) {
  auto ga = grads_of(a), gb = grads_of(b);
  ASSERT_EQ(ga.size(), gb.size());
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_TRUE(all_close(ga[i], gb[i], tol)) << "tensor " << i;
}

struct Pair {
  std::unique_ptr<Model> model;
  std::unique_ptr<TinyLora> lora;
};

Pair make(const TinySpec& s, TrainMode mode, bool ckpt, float dropout = 0.0f, uint64_t seed = 5) {
  ModelConfig cfg = tiny_config(s);
  Pair p;
  p.model = std::make_unique<Model>(tiny_weights(cfg, seed), ModelOptions{mode, ckpt});
  if (mode == TrainMode::Lora) {
    p.lora = std::make_unique<TinyLora>();
    make_tiny_lora(*p.lora, cfg, 4, 8.0f, false, all_roles(), dropout, seed + 1000);
    p.model->attach_lora(p.lora->view);
  }
  return p;
}

TEST(Transformer, CheckpointingGivesTheSameGradients) {
  for (TrainMode mode : {TrainMode::Lora, TrainMode::Full}) {
    for (float dropout : {0.0f, 0.25f}) {
      if (mode == TrainMode::Full && dropout > 0) continue;
      SCOPED_TRACE(::testing::Message() << "mode " << static_cast<int>(mode) << " dropout " << dropout);
      TinySpec s;
      s.qk_norm = true;
      Pair on = make(s, mode, true, dropout), off = make(s, mode, false, dropout);
      Batch b = tiny_batch(s.vocab, 3);
      auto r1 = on.model->forward_backward(b, 0.1f, 77);
      auto r2 = off.model->forward_backward(b, 0.1f, 77);
      EXPECT_EQ(r1.loss_sum, r2.loss_sum);
      // Same ops in the same order: bit-identical (dropout masks recomputed from the same seed).
      expect_same_grads(*on.model, *off.model, Tolerance{0, 0});
    }
  }
}

// Measured activation memory (the CPU allocator's peak during forward_backward minus what was
// in use before) with and without gradient checkpointing, on an 8-layer model.
TEST(Transformer, CheckpointingLowersMeasuredActivationMemory) {
  TinySpec s;
  s.layers = 8;
  s.hidden = 64;
  s.inter = 172;
  s.vocab = 512;
  std::vector<std::vector<int32_t>> samples;
  for (int i = 0; i < 2; ++i) {
    std::vector<int32_t> seq;
    for (int t = 0; t < 64; ++t) seq.push_back((i * 131 + t * 17) % 512);
    samples.push_back(seq);
  }
  Batch b = Batch::causal_lm(samples);
  size_t peak[2];
  for (int ckpt = 0; ckpt < 2; ++ckpt) {
    Pair p = make(s, TrainMode::Lora, ckpt == 1);
    Allocator& A = cpu_allocator();
    const size_t before = A.stats().bytes_in_use;
    A.reset_peak();
    p.model->forward_backward(b, 1.0f, 0);
    peak[ckpt] = A.stats().bytes_peak - before;
  }
  std::cout << "[checkpointing] 8 layers, D 64, 128 tokens: activation peak without " << peak[0] << " B, with "
            << peak[1] << " B (" << 100.0 * static_cast<double>(peak[1]) / static_cast<double>(peak[0]) << "%)\n";
  RecordProperty("activation_bytes_without_checkpointing", std::to_string(peak[0]));
  RecordProperty("activation_bytes_with_checkpointing", std::to_string(peak[1]));
  EXPECT_LT(peak[1], peak[0] / 2);
}

TEST(Transformer, LoraDropoutIsSeededAndOffInEval) {
  TinySpec s;
  Pair a = make(s, TrainMode::Lora, true, 0.5f), b = make(s, TrainMode::Lora, true, 0.5f);
  Batch batch = tiny_batch(s.vocab, 4);
  auto l1 = a.model->forward_backward(batch, 1.0f, 1).loss_sum;
  auto l2 = b.model->forward_backward(batch, 1.0f, 1).loss_sum;
  EXPECT_EQ(l1, l2);
  auto l3 = b.model->forward_backward(batch, 1.0f, 2).loss_sum;
  EXPECT_NE(l1, l3);  // another seed, other masks
  // Evaluation: dropout off, deterministic, equal to training mode without dropout.
  Pair nod = make(s, TrainMode::Lora, true, 0.0f);
  EXPECT_NEAR(a.model->forward_loss(batch).loss_sum, nod.model->forward_loss(batch).loss_sum, 1e-4);
}

TEST(Transformer, MicroBatchesAccumulateToTheFullBatchGradient) {
  TinySpec s;
  s.tied = false;
  Pair whole = make(s, TrainMode::Full, true), parts = make(s, TrainMode::Full, true);
  std::vector<std::vector<int32_t>> samples = {{1, 2, 3, 4, 5}, {6, 7, 8}, {9, 10, 11, 12, 13, 14}, {15, 16}};
  Batch all = Batch::causal_lm(samples);
  const float scale = 1.0f / static_cast<float>(all.num_label_tokens());
  whole.model->forward_backward(all, scale, 0);
  parts.model->forward_backward(Batch::causal_lm({samples[0], samples[1]}), scale, 0);
  parts.model->forward_backward(Batch::causal_lm({samples[2], samples[3]}), scale, 0);
  expect_same_grads(*whole.model, *parts.model, Tolerance{1e-6, 1e-4});
}

TEST(Transformer, FrozenWeightsGetNoGradientInLoraMode) {
  TinySpec s;
  s.bias = true;
  s.tied = false;
  Pair p = make(s, TrainMode::Lora, true);
  Model& m = *p.model;
  EXPECT_FALSE(m.grads().embed.defined());
  EXPECT_FALSE(m.grads().lm_head.defined());
  EXPECT_FALSE(m.grads().final_norm.defined());
  for (auto& l : m.grads().layers) {
    EXPECT_FALSE(l.w.q.defined());
    EXPECT_FALSE(l.w.q_bias.defined());
    EXPECT_FALSE(l.w.input_norm.defined());
    EXPECT_FALSE(l.w.down.defined());
  }
  for (auto& tp : m.trainable_parameters()) EXPECT_NE(tp.name.find("lora_"), std::string::npos) << tp.name;
  // r = 4, per layer: q 4·(32+32), k/v 4·(32+16), o 4·(32+32), gate/up/down 4·(32+48): 1856.
  EXPECT_EQ(m.num_trainable_parameters(), 2 * 1856);
}

TEST(Transformer, FullModeTrainsEveryTensorAndTiedEmbeddingGetsHeadGradient) {
  TinySpec s;  // tied
  Pair p = make(s, TrainMode::Full, true);
  Model& m = *p.model;
  size_t n_named = m.named_weights().size();
  EXPECT_EQ(m.trainable_parameters().size(), n_named);
  // A token that is only a label (never an input) still gets an embedding gradient through the
  // tied LM head.
  Batch b = Batch::pack({{1, 2, 3}}, {{60, 60, 60}});
  m.forward_backward(b, 1.0f, 0);
  auto g = m.grads().embed.to_vector();
  double row60 = 0, row61 = 0;
  for (int64_t e = 0; e < s.hidden; ++e) {
    row60 += std::fabs(g[static_cast<size_t>(60 * s.hidden + e)]);
    row61 += std::fabs(g[static_cast<size_t>(61 * s.hidden + e)]);
  }
  EXPECT_GT(row60, 0.0);
  EXPECT_GT(row61, 0.0);  // softmax mass on every vocabulary row
}

// With bf16 GEMM copies (matmul_dtype bf16) each trained matrix's entry names its copy, the one
// the GEMMs read (gemm_weight; the head's, which is the tied embedding's when tied), for the
// optimizer to rewrite; norms, biases and an untied embedding have none; with f32 GEMMs nothing has.
TEST(Transformer, TrainableParametersNameTheBf16GemmCopyTheGemmsRead) {
  for (bool tied : {true, false}) {
    TinySpec s;
    s.tied = tied;
    s.bias = true;
    Pair p = make(s, TrainMode::Full, true);
    Model& m = *p.model;
    for (const auto& tp : m.trainable_parameters()) EXPECT_EQ(tp.gemm_copy, nullptr) << tp.name;
    m.set_matmul_dtype(DType::BF16);
    std::map<const Tensor*, const Tensor*> want;
    for (int64_t l = 0; l < m.config().num_layers; ++l)
      for (int r = 0; r < kNumLinearRoles; ++r)
        want[&layer_matrix(m.weights().layers[static_cast<size_t>(l)], static_cast<LinearRole>(r))] =
            &m.gemm_weight(l, static_cast<LinearRole>(r));
    want[&m.weights().output_weight()] = &m.head_gemm_weight();
    size_t with_copy = 0;
    for (const auto& tp : m.trainable_parameters()) {
      const auto it = want.find(tp.param);
      if (it == want.end()) {
        EXPECT_EQ(tp.gemm_copy, nullptr) << tp.name;
        continue;
      }
      ++with_copy;
      EXPECT_EQ(tp.gemm_copy, it->second) << tp.name;
      ASSERT_NE(tp.gemm_copy, nullptr) << tp.name;
      EXPECT_EQ(tp.gemm_copy->dtype(), DType::BF16) << tp.name;
    }
    EXPECT_EQ(with_copy, want.size()) << (tied ? "tied" : "untied");
    EXPECT_EQ(with_copy, static_cast<size_t>(m.config().num_layers * kNumLinearRoles + 1));
  }
}

TEST(Transformer, AttachesAnAdapterFromInitLora) {
  TinySpec s;
  ModelConfig cfg = tiny_config(s);
  Model m(tiny_weights(cfg, 9), ModelOptions{TrainMode::Lora});
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  lc.target_modules = {"q_proj", "v_proj"};
  LoraAdapter ad = init_lora(cfg, lc, 1);
  m.attach_lora(ad);
  EXPECT_EQ(m.trainable_parameters().size(), static_cast<size_t>(2 * 2 * cfg.num_layers));
  // B = 0 at init: the adapter leaves the model's loss unchanged.
  Model base(tiny_weights(cfg, 9), ModelOptions{TrainMode::Frozen});
  Batch b = tiny_batch(s.vocab, 1);
  EXPECT_NEAR(m.forward_loss(b).loss_sum, base.forward_loss(b).loss_sum, 1e-5);
  m.forward_backward(b, 1.0f, 0);
  // dA = 0 (B is zero) but dB is not.
  for (auto& tp : m.trainable_parameters()) {
    double norm = 0;
    for (float x : tp.grad->to_vector()) norm += std::fabs(x);
    if (tp.name.find("lora_B") != std::string::npos) {
      EXPECT_GT(norm, 0.0) << tp.name;
    }
  }
}

// attach_lora lays each input group's A matrices (q/k/v, gate/up) out as rows of one tensor, values
// unchanged, and allocate_grads their dA likewise: what lets the LoRA products of the group's input
// run as one GEMM (ops/linear.h lora_group_forward; the oracle parity tests hold the gradients to
// PyTorch's). A group missing a member keeps its tensors; o and down are alone anyway.
TEST(Transformer, AttachLaysEachInputGroupsLoraAOutAsRowsOfOneTensor) {
  TinySpec s;
  const ModelConfig cfg = tiny_config(s);
  TinyLora fresh, attached, partial;
  make_tiny_lora(fresh, cfg, 4, 8.0f, false, all_roles(), 0.0f, 77);
  make_tiny_lora(attached, cfg, 4, 8.0f, false, all_roles(), 0.0f, 77);
  make_tiny_lora(partial, cfg, 4, 8.0f, false, {LinearRole::Q, LinearRole::V, LinearRole::Gate, LinearRole::Up}, 0.0f,
                 78);
  const float* o_before = attached.A[0][static_cast<size_t>(LinearRole::O)].data<float>();
  Model m(tiny_weights(cfg, 9), ModelOptions{TrainMode::Lora});
  m.attach_lora(attached.view);
  Model mp(tiny_weights(cfg, 9), ModelOptions{TrainMode::Lora});
  mp.attach_lora(partial.view);
  auto joined = [](const std::array<Tensor, kNumLinearRoles>& t, std::initializer_list<LinearRole> roles) {
    std::vector<const Tensor*> parts;
    for (LinearRole r : roles) parts.push_back(&t[static_cast<size_t>(r)]);
    return Tensor::joined_rows(parts).defined();
  };
  for (size_t l = 0; l < static_cast<size_t>(cfg.num_layers); ++l) {
    SCOPED_TRACE(::testing::Message() << "layer " << l);
    EXPECT_TRUE(joined(attached.A[l], {LinearRole::Q, LinearRole::K, LinearRole::V}));
    EXPECT_TRUE(joined(attached.A[l], {LinearRole::Gate, LinearRole::Up}));
    std::array<Tensor, kNumLinearRoles> dA;
    for (size_t r = 0; r < kNumLinearRoles; ++r) dA[r] = m.grads().layers[l].lora[r].dA;
    EXPECT_TRUE(joined(dA, {LinearRole::Q, LinearRole::K, LinearRole::V}));
    EXPECT_TRUE(joined(dA, {LinearRole::Gate, LinearRole::Up}));
    for (size_t r = 0; r < kNumLinearRoles; ++r)
      EXPECT_EQ(attached.A[l][r].to_vector(), fresh.A[l][r].to_vector()) << linear_role_name(LinearRole(r));
    EXPECT_FALSE(joined(partial.A[l], {LinearRole::Q, LinearRole::V}));
    EXPECT_TRUE(joined(partial.A[l], {LinearRole::Gate, LinearRole::Up}));
  }
  EXPECT_EQ(attached.A[0][static_cast<size_t>(LinearRole::O)].data<float>(), o_before);
}

TEST(Transformer, BadBatchesAreInputErrors) {
  TinySpec s;
  Pair p = make(s, TrainMode::Lora, true);
  auto code = [&](const Batch& b) {
    try {
      p.model->forward_backward(b, 1.0f, 0);
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::RUNTIME_INTERNAL;
  };
  Batch good = tiny_batch(s.vocab, 1);
  Batch b = good;
  b.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, 5, 3, 16}, {4});
  EXPECT_EQ(code(b), ErrorCode::INPUT_VALIDATION_FAILED);
  b = good;
  b.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, 5, 12}, {3});
  EXPECT_EQ(code(b), ErrorCode::INPUT_VALIDATION_FAILED);
  b = good;
  b.positions = Tensor::from_vector(std::vector<int32_t>{0, 1}, {2});
  EXPECT_EQ(code(b), ErrorCode::INPUT_VALIDATION_FAILED);
  b = Batch::pack({{1, 2, 3}}, {{2, 3, 500}});  // label outside the vocabulary
  EXPECT_EQ(code(b), ErrorCode::INPUT_VALIDATION_FAILED);
  b = Batch::pack({{1, 2, 300}}, {{2, 3, -100}});  // token outside the vocabulary
  EXPECT_EQ(code(b), ErrorCode::INPUT_VALIDATION_FAILED);
  EXPECT_THROW(Batch::pack({{1, 2}}, {{1}}), Error);
  // LoRA mode without an adapter.
  Model bare(tiny_weights(tiny_config(s), 1), ModelOptions{TrainMode::Lora});
  EXPECT_THROW(bare.forward_backward(good, 1.0f, 0), Error);
}

}  // namespace
}  // namespace bp::test
