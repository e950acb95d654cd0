// Text generation over a KV cache (incremental decoding): the prompt is run once (prefill),
// each later step runs only the new token and attends to the cached keys/values of every
// earlier position, so the prefix is never recomputed.
//
// Decoding: greedy (temperature 0: argmax, lowest id on ties, like llama2.c's run.c) or sampling
// with temperature, then top-k (keep the k most likely), then top-p (keep the smallest set whose
// probability reaches p), from a seeded generator (same seed -> same tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "model/transformer.h"

namespace bp {

struct SamplingOptions {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int64_t top_k = 0;         // 0 = off
  uint64_t seed = 0;
  void validate() const;  // INPUT_VALIDATION_FAILED naming the bad value
};

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these (it is kept)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // the new tokens only
  bool stopped = false;         // ended on a stop id (else: max_new_tokens or context length)
  bool context_full = false;    // ended because the model's context (max_position_embeddings) is full
};

// Keys/values of every layer for positions [0, length). K/V rows are after RoPE (and q/k norm).
class KvCache {
 public:
  KvCache(const ModelConfig& cfg, int64_t capacity_tokens);
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  Tensor& k(int64_t layer) { return k_[static_cast<size_t>(layer)]; }  // [capacity, Hkv·d]
  Tensor& v(int64_t layer) { return v_[static_cast<size_t>(layer)]; }
  void advance(int64_t n) { length_ += n; }
  void clear() { length_ = 0; }

 private:
  std::vector<Tensor> k_, v_;
  int64_t length_ = 0, capacity_ = 0;
};

// Runs `tokens` (positions cache.length() ...) through the model, appends their keys/values to
// the cache and returns the logits of the last token [V]. Dropout is off.
std::vector<float> decode_step(const Model& model, KvCache& cache, const std::vector<int32_t>& tokens);

// Picks the next token from logits [V] with the options; rng is advanced only when sampling.
int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& opts, std::mt19937_64& rng);

// Generates after `prompt` (non-empty). on_token (may be empty) sees each new token as it comes.
GenerateResult generate(const Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& opts,
                        const std::function<void(int32_t)>& on_token = {});

}  // namespace bp
