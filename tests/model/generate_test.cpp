// KV-cache decoding and sampling: cached logits equal the full forward at every step (for each
// architecture, with LoRA, and with sliding windows shorter than the prompt, a custom scale and a
// soft cap; Gemma 2/3), the window changes what is generated, sampling options behave as documented,
// bad options are errors.
#include "model/generate.h"

#include <gtest/gtest.h>

#include <map>

#include "model/model_test_helpers.h"

namespace bp::test {
namespace {

// Runs a prompt through the cache, then one token at a time; after each step the cached logits
// of the last token must equal the full (uncached) forward of the whole sequence.
void expect_cache_matches_full_forward(Model& model, std::vector<int32_t> seq) {
  KvCache cache(model.config(), 32);
  const size_t prompt = 5;
  std::vector<int32_t> head(seq.begin(), seq.begin() + prompt);
  std::vector<float> cached = decode_step(model, cache, head);
  for (size_t n = prompt;; ++n) {
    const int64_t T = static_cast<int64_t>(n);
    std::vector<int32_t> pos(n);
    for (size_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(i);
    std::vector<int32_t> cur(seq.begin(), seq.begin() + static_cast<int64_t>(n));
    auto full = model.logits(Tensor::from_vector(cur, {T}), Tensor::from_vector(pos, {T})).to_vector();
    std::vector<float> last(full.end() - model.config().vocab_size, full.end());
    EXPECT_TRUE(all_close(cached, last, Tolerance{1e-4, 1e-4})) << "after " << n << " tokens";
    EXPECT_EQ(cache.length(), T);
    if (n == seq.size()) break;
    cached = decode_step(model, cache, {seq[n]});
  }
}

TEST(Generate, CachedDecodingEqualsFullForwardForEachArchitecture) {
  std::vector<TinySpec> specs(7);
  specs[1].arch = Arch::Qwen2, specs[1].bias = true, specs[1].tied = false, specs[1].kv_heads = 1;
  specs[2].arch = Arch::Qwen3, specs[2].qk_norm = true, specs[2].head_dim = 16, specs[2].llama3_rope = true;
  // Mistral's window (3, shorter than the 5-token prompt) on every layer; a full and a windowed
  // layer with a custom scale and a soft cap.
  specs[3].arch = Arch::Mistral, specs[3].sliding_window = 3;
  specs[4].sliding_window = 2, specs[4].layer_windows = {0, 2};
  specs[4].attention_scale = 0.6f, specs[4].attention_softcap = 1.5f;
  // Gemma 3: a sliding window (3) shorter than the sequence, the local RoPE base, sandwich norms, GeGLU.
  specs[5].arch = Arch::Gemma3, specs[5].layers = 3, specs[5].head_dim = 16, specs[5].linear_rope = 2.0f;
  specs[5].layer_types = {"sliding_attention", "full_attention", "sliding_attention"};
  // Gemma 2: attention and final logit soft-caps.
  specs[6].arch = Arch::Gemma2, specs[6].attention_softcap = 2.0f, specs[6].final_softcap = 3.0f;
  uint64_t seed = 3;
  for (const auto& s : specs) {
    ModelConfig cfg = tiny_config(s);
    Model model(tiny_weights(cfg, seed * 10), ModelOptions{TrainMode::Lora});
    TinyLora lora;
    make_tiny_lora(lora, cfg, 4, 8.0f, false, all_roles(), 0.3f, seed * 10 + 5);  // dropout is off in inference
    model.attach_lora(lora.view);
    std::vector<int32_t> seq;
    std::mt19937_64 rng(seed++);
    for (int i = 0; i < 12; ++i) seq.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.vocab_size)));
    SCOPED_TRACE(arch_name(cfg.arch));
    expect_cache_matches_full_forward(model, seq);
  }
}

// The window is applied while generating: a windowed model's cached logits differ from the same
// weights' without the window once the sequence is longer than the window.
TEST(Generate, SlidingWindowChangesTheCachedLogits) {
  TinySpec s;
  s.arch = Arch::Mistral;
  s.sliding_window = 3;
  ModelConfig windowed = tiny_config(s), full = windowed;
  full.sliding_window = 0;
  Model a(tiny_weights(windowed, 91), ModelOptions{TrainMode::Frozen});
  Model b(tiny_weights(full, 91), ModelOptions{TrainMode::Frozen});
  const std::vector<int32_t> prompt = {5, 9, 2, 40, 7, 11};
  KvCache ca(windowed, 16), cb(full, 16);
  const std::vector<float> la = decode_step(a, ca, prompt), lb = decode_step(b, cb, prompt);
  EXPECT_FALSE(all_close(la, lb, Tolerance{1e-3, 1e-3}));
  // With no more tokens than the window, the two agree.
  KvCache sa(windowed, 16), sb(full, 16);
  EXPECT_TRUE(all_close(decode_step(a, sa, {5, 9, 2}), decode_step(b, sb, {5, 9, 2}), Tolerance{1e-5, 1e-5}));
}

std::vector<float> test_logits() {
  return {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f};
}

TEST(Sampling, GreedyTakesTheFirstMaximum) {
  std::mt19937_64 rng(1);
  SamplingOptions o;
  EXPECT_EQ(sample_token(test_logits(), o, rng), 1);
  o.temperature = 1.0f;
  o.top_k = 1;
  EXPECT_EQ(sample_token(test_logits(), o, rng), 1);
}

TEST(Sampling, FrequenciesFollowSoftmaxAndFilters) {
  const auto logits = test_logits();
  auto histogram = [&](SamplingOptions o) {
    std::mt19937_64 rng(o.seed);
    std::map<int32_t, int> h;
    for (int i = 0; i < 20000; ++i) ++h[sample_token(logits, o, rng)];
    return h;
  };
  SamplingOptions o;
  o.temperature = 1.0f;
  o.seed = 5;
  auto h = histogram(o);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  for (int32_t i = 0; i < 6; ++i) EXPECT_NEAR(h[i] / 20000.0, std::exp(logits[static_cast<size_t>(i)]) / z, 0.015);
  // top-k 2: only the two best (ids 1 and 4, equal logits) ever appear, about evenly.
  o.top_k = 2;
  h = histogram(o);
  EXPECT_EQ(h[1] + h[4], 20000);
  EXPECT_NEAR(h[1] / 20000.0, 0.5, 0.02);
  // top-p 0.5: ids 1 and 4 each hold ~0.32 of the mass, so the nucleus is {1, 4}.
  o.top_k = 0;
  o.top_p = 0.5f;
  h = histogram(o);
  EXPECT_EQ(h[1] + h[4], 20000);
  // Low temperature sharpens towards the maxima; high temperature flattens.
  o.top_p = 1.0f;
  o.temperature = 0.1f;
  h = histogram(o);
  EXPECT_GT(h[1] + h[4], 19900);
  o.temperature = 100.0f;
  h = histogram(o);
  EXPECT_GT(h[3], 2500);  // the worst token gets ~1/6
}

TEST(Sampling, SameSeedSameTokensAcrossGeneration) {
  ModelConfig cfg = tiny_config(TinySpec{});
  Model model(tiny_weights(cfg, 77), ModelOptions{TrainMode::Frozen});
  GenerateOptions o;
  o.max_new_tokens = 20;
  o.sampling.temperature = 4.0f;  // the random tiny model is very peaked at temperature 1
  o.sampling.top_p = 0.95f;
  o.sampling.top_k = 20;
  o.sampling.seed = 42;
  auto a = generate(model, {1, 2, 3}, o);
  auto b = generate(model, {1, 2, 3}, o);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens.size(), 20u);
  o.sampling.seed = 43;
  EXPECT_NE(generate(model, {1, 2, 3}, o).tokens, a.tokens);
}

TEST(Generate, StopsOnStopIdAndStreamsTokens) {
  ModelConfig cfg = tiny_config(TinySpec{});
  Model model(tiny_weights(cfg, 78), ModelOptions{TrainMode::Frozen});
  GenerateOptions o;
  o.max_new_tokens = 10;
  auto free_run = generate(model, {5, 6}, o);
  ASSERT_EQ(free_run.tokens.size(), 10u);
  o.stop_ids = {free_run.tokens[3]};
  std::vector<int32_t> streamed;
  auto stopped = generate(model, {5, 6}, o, [&](int32_t t) { streamed.push_back(t); });
  EXPECT_TRUE(stopped.stopped);
  EXPECT_EQ(stopped.tokens.back(), free_run.tokens[3]);
  EXPECT_LE(stopped.tokens.size(), 4u);
  EXPECT_EQ(streamed, stopped.tokens);
}

TEST(Generate, BadOptionsAreInputErrors) {
  ModelConfig cfg = tiny_config(TinySpec{});
  Model model(tiny_weights(cfg, 79), ModelOptions{TrainMode::Frozen});
  auto code_of = [&](GenerateOptions o, std::vector<int32_t> prompt) {
    try {
      generate(model, prompt, o);
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::RUNTIME_INTERNAL;
  };
  GenerateOptions o;
  EXPECT_EQ(code_of(o, {}), ErrorCode::INPUT_VALIDATION_FAILED);
  o.sampling.temperature = -1.0f;
  EXPECT_EQ(code_of(o, {1}), ErrorCode::INPUT_VALIDATION_FAILED);
  o.sampling.temperature = 1.0f;
  o.sampling.top_p = 0.0f;
  EXPECT_EQ(code_of(o, {1}), ErrorCode::INPUT_VALIDATION_FAILED);
  o.sampling.top_p = 1.0f;
  o.sampling.top_k = -2;
  EXPECT_EQ(code_of(o, {1}), ErrorCode::INPUT_VALIDATION_FAILED);
  o.sampling.top_k = 0;
  EXPECT_EQ(code_of(o, std::vector<int32_t>(200, 1)), ErrorCode::INPUT_VALIDATION_FAILED);  // context 128
  EXPECT_EQ(code_of(o, {static_cast<int32_t>(cfg.vocab_size)}), ErrorCode::INPUT_VALIDATION_FAILED);
}

}  // namespace
}  // namespace bp::test
