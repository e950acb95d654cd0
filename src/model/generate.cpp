// Generation over a KV cache (see generate.h).
//
// decode_step runs the same layer math as Model::forward_layer (transformer.cpp) for the n new
// tokens only. Attention of new token i (absolute position p = start + i) reads cached rows
// [0, p], or [p - W + 1, p] in a layer with a sliding window W, with the layer's scale and soft
// cap (ModelConfig::attention_shape, as the training op applies them); it is a plain loop here because the training
// attention op takes equal-length q and k. Its agreement with the full forward is tested (generate_test.cpp: cached
// logits == Model::logits at every step, and stories260K's golden greedy continuations).
#include "model/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace bp {

void SamplingOptions::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[generate] temperature must be >= 0, got {}", temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[generate] top_p must be in (0, 1], got {}", top_p));
  if (top_k < 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[generate] top_k must be >= 0, got {}", top_k));
}

KvCache::KvCache(const ModelConfig& cfg, int64_t capacity_tokens) : capacity_(capacity_tokens) {
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    k_.push_back(Tensor::empty({capacity_tokens, cfg.kv_dim()}));
    v_.push_back(Tensor::empty({capacity_tokens, cfg.kv_dim()}));
  }
}

namespace {

// o[i] = softmax(cap(scale · q[i]·K[lo..p]ᵀ))·V[lo..p] per query head (GQA), p = start + i, lo =
// p - W + 1 with a window W (else 0), cap(s) = c·tanh(s/c) with a soft cap c (ops/attention.h).
void cached_attention(const Tensor& q, const Tensor& K, const Tensor& V, int64_t start, const AttentionShape& shape,
                      Tensor& o) {
  const int Hq = shape.n_heads, Hkv = shape.n_kv_heads;
  const int64_t d = shape.head_dim, n = q.dim(0), qd = Hq * d, kvd = Hkv * d;
  const float* qp = q.data<float>();
  const float* kp = K.data<float>();
  const float* vp = V.data<float>();
  float* op = o.data<float>();
  const int group = Hq / Hkv;
  const double scale = shape.scale > 0 ? shape.scale : 1.0 / std::sqrt(static_cast<double>(d)), cap = shape.softcap;
#pragma omp parallel for collapse(2) schedule(static) if (n * Hq * (start + n) * d > 65536)
  for (int64_t i = 0; i < n; ++i) {
    for (int h = 0; h < Hq; ++h) {
      const int64_t end = start + i + 1, lo = shape.window > 0 ? std::max<int64_t>(0, end - shape.window) : 0;
      const int64_t len = end - lo;
      const float* qi = qp + i * qd + h * d;
      const int64_t kvo = static_cast<int64_t>(h / group) * d;
      const float* kb = kp + lo * kvd;
      const float* vb = vp + lo * kvd;
      std::vector<double> s(static_cast<size_t>(len));
      double mx = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        const float* kj = kb + j * kvd + kvo;
        double acc = 0;
        for (int64_t e = 0; e < d; ++e) acc += static_cast<double>(qi[e]) * kj[e];
        acc *= scale;
        s[static_cast<size_t>(j)] = cap > 0 ? cap * std::tanh(acc / cap) : acc;
        mx = std::max(mx, s[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      float* oi = op + i * qd + h * d;
      for (int64_t e = 0; e < d; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < len; ++j) acc += s[static_cast<size_t>(j)] * vb[j * kvd + kvo + e];
        oi[e] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace

std::vector<float> decode_step(const Model& model, KvCache& cache, const std::vector<int32_t>& tokens) {
  const auto& c = model.config();
  const auto& W = model.weights();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t start = cache.length();
  if (n == 0) throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[generate] no tokens to decode");
  if (start + n > cache.capacity())
    throw Error(
        ErrorCode::INPUT_VALIDATION_FAILED,
        fmt::format("[generate] {} tokens do not fit the context of {} ({} already used)", n, cache.capacity(), start));
  const int Hq = static_cast<int>(c.num_heads), Hkv = static_cast<int>(c.num_kv_heads);
  const int64_t d = c.head_dim;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), static_cast<int32_t>(start));
  Tensor ids = Tensor::from_vector(tokens, {n});
  Tensor positions = Tensor::from_vector(pos, {n});
  auto opt = [](const Tensor& t) { return t.defined() ? &t : nullptr; };

  Tensor x = embedding_forward(ids, W.embed);
  if (c.embed_scale > 0) scale_inplace(x, c.embed_scale);
  auto nw = [&](const Tensor& w) { return model.norm_weight(w); };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const auto& w = W.layers[static_cast<size_t>(l)];
    LoraWeights ls[kNumLinearRoles];
    auto lora = [&](LinearRole r) { return model.lora_for(l, r, &ls[static_cast<int>(r)]); };
    Tensor xn = rms_norm_forward(x, nw(w.input_norm), c.rms_norm_eps, nullptr);
    // q's and k's biases as the training forward adds them (model/transformer.cpp): in RoPE's launch
    // unless q/k norms come first.
    const bool bias_in_rope = !c.qk_norm;
    Tensor q = linear_forward(xn, w.q, bias_in_rope ? nullptr : opt(w.q_bias), lora(LinearRole::Q), nullptr);
    Tensor k = linear_forward(xn, w.k, bias_in_rope ? nullptr : opt(w.k_bias), lora(LinearRole::K), nullptr);
    Tensor v = linear_forward(xn, w.v, opt(w.v_bias), lora(LinearRole::V), nullptr);
    if (c.qk_norm) {
      q = rms_norm_forward(q.reshape({n * Hq, d}), nw(w.q_norm), c.rms_norm_eps, nullptr).reshape({n, Hq * d});
      k = rms_norm_forward(k.reshape({n * Hkv, d}), nw(w.k_norm), c.rms_norm_eps, nullptr).reshape({n, Hkv * d});
    }
    rope_forward(q, k, positions, Hq, Hkv, c.rope_for_layer(l), bias_in_rope ? opt(w.q_bias) : nullptr,
                 bias_in_rope ? opt(w.k_bias) : nullptr);
    cache.k(l).rows(start, start + n).copy_from(k);
    cache.v(l).rows(start, start + n).copy_from(v);
    Tensor attn = Tensor::empty({n, Hq * d});
    cached_attention(q, cache.k(l), cache.v(l), start, c.attention_shape(l), attn);
    // out = res + proj(in) as the training forward adds the residuals (model/transformer.cpp): the
    // GEMM's beta matrix, or (Gemma's sandwich norms) res + rms_norm(proj(in), post).
    auto residual_out = [&](const Tensor& in, const Tensor& W, LinearRole r, const Tensor& post, const Tensor& res) {
      if (!c.sandwich_norms) return linear_forward(in, W, nullptr, lora(r), nullptr, nullptr, &res);
      Tensor y = rms_norm_forward(linear_forward(in, W, nullptr, lora(r), nullptr), nw(post), c.rms_norm_eps, nullptr);
      add_inplace(y, res);
      return y;
    };
    Tensor h = residual_out(attn, w.o, LinearRole::O, w.post_norm, x);
    Tensor hn = rms_norm_forward(h, nw(c.sandwich_norms ? w.pre_ffn_norm : w.post_norm), c.rms_norm_eps, nullptr);
    if (c.is_moe_layer(l)) {  // Mixture-of-Experts: the training forward's sparse MLP
      x = model.sparse_mlp(l, h, hn);
      continue;
    }
    Tensor g = linear_forward(hn, w.gate, nullptr, lora(LinearRole::Gate), nullptr);
    Tensor u = linear_forward(hn, w.up, nullptr, lora(LinearRole::Up), nullptr);
    Tensor m = c.hidden_act == GluActivation::GeluTanh ? geglu_forward(g, u) : swiglu_forward(g, u);
    x = residual_out(m, w.down, LinearRole::Down, w.post_ffn_norm, h);
  }
  cache.advance(n);
  Tensor last = rms_norm_forward(x.rows(n - 1, n), nw(W.final_norm), c.rms_norm_eps, nullptr);
  return lm_head_logits(last, W.output_weight(), c.final_logit_softcap).to_vector();
}

int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& opts, std::mt19937_64& rng) {
  const int64_t V = static_cast<int64_t>(logits.size());
  BP_CHECK(V > 0, "[generate] empty logits");
  if (opts.temperature == 0.0f || opts.top_k == 1) {
    // Greedy: first maximum (run.c's argmax).
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Candidates sorted by logit (descending, lower id first on ties).
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = idx.size();
  if (opts.top_k > 0) keep = std::min(keep, static_cast<size_t>(opts.top_k));
  // Softmax at the temperature over the kept candidates.
  std::vector<double> p(keep);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += (p[i] = std::exp((logits[idx[i]] - mx) / opts.temperature));
  for (auto& x : p) x /= sum;
  if (opts.top_p < 1.0f) {
    // Smallest prefix whose mass reaches top_p (always at least one token).
    double cum = 0;
    size_t n = 0;
    while (n < keep) {
      cum += p[n++];
      if (cum >= opts.top_p) break;
    }
    keep = n;
    p.resize(keep);
    sum = cum;
    for (auto& x : p) x /= sum;
  }
  // Inverse-CDF draw from a uniform in [0, 1).
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += p[i];
    if (u < cum) return idx[i];
  }
  return idx[keep - 1];
}

GenerateResult generate(const Model& model, const std::vector<int32_t>& prompt, const GenerateOptions& opts,
                        const std::function<void(int32_t)>& on_token) {
  opts.sampling.validate();
  if (prompt.empty()) throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[generate] the prompt has no tokens");
  if (opts.max_new_tokens < 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[generate] max_new_tokens must be >= 0, got {}", opts.max_new_tokens));
  const int64_t ctx = model.config().max_position_embeddings;
  const int64_t P = static_cast<int64_t>(prompt.size());
  if (P > ctx)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[generate] the prompt has {} tokens but the model's context is {}", P, ctx));
  GenerateResult res;
  if (opts.max_new_tokens == 0) return res;
  KvCache cache(model.config(), std::min(ctx, P + opts.max_new_tokens));
  std::mt19937_64 rng(opts.sampling.seed);
  std::vector<float> logits = decode_step(model, cache, prompt);
  for (int64_t i = 0; i < opts.max_new_tokens; ++i) {
    const int32_t t = sample_token(logits, opts.sampling, rng);
    res.tokens.push_back(t);
    if (on_token) on_token(t);
    if (std::find(opts.stop_ids.begin(), opts.stop_ids.end(), t) != opts.stop_ids.end()) {
      res.stopped = true;
      break;
    }
    if (i + 1 == opts.max_new_tokens) break;
    if (cache.length() >= cache.capacity()) {  // the capacity is below P + max_new_tokens only at the context
      res.context_full = true;
      break;
    }
    logits = decode_step(model, cache, {t});
  }
  return res;
}

}  // namespace bp
