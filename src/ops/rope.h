// Rotary position embedding in Hugging Face's rotate_half layout:
//   for head h, pair i in [0, d/2):  (x[i], x[i+d/2]) rotated by angle pos·inv_freq[i]
//   out[i]       = x[i]·cos − x[i+d/2]·sin
//   out[i+d/2]   = x[i+d/2]·cos + x[i]·sin
// inv_freq[i] = theta^(−2i/d), optionally rescaled by Llama-3's rope_scaling (rope_type "llama3":
// factor, low_freq_factor, high_freq_factor, original_max_position_embeddings), or by linear scaling
// (rope_type "linear", Gemma 3's global layers: inv_freq / linear_factor).
// Applied in place to x [T, n_heads·head_dim] with per-token positions (i32 [T], restarting per
// packed sample). Backward is the inverse rotation of dy, also in place (= semantics); dx_bf16 (an
// output, may be null; allocated when undefined): the rotated dx also rounded to nearest-even bf16
// by the same kernel, the dy of q_proj's / k_proj's bf16 GEMM (ops/linear.h dy_bf16).
// The two-tensor forms rotate q and k of one attention (their own head counts, the same positions)
// in one kernel launch, each token's angles computed once for both: the values are those of two
// one-tensor calls. q_bias, k_bias (forward, may be null): [q_heads·head_dim], [k_heads·head_dim] added
// to each row before the rotation: q_proj's and k_proj's biases (Qwen2) in the same launch, the
// projections then run without theirs (model/transformer.cpp).
// Partial rotary (Phi-3's partial_rotary_factor, modeling_phi3.py apply_rotary_pos_emb): only the
// first rotary_dim dims of each head rotate, pairs (i, i + rotary_dim/2); the rest pass through
// unchanged (their bias still added, their bf16 copy still written). rotary_dim 0: nothing rotates
// (SmolLM3's layers without RoPE, ModelConfig::rope_for_layer), the launch only adds the biases.
// LongRoPE (rope_type "longrope", modeling_rope_utils.py _compute_longrope_parameters):
//   inv_freq[i] = 1 / (ext[i] · theta^(2i/rotary_dim)), ext = long_factor when the call's largest
//   position + 1 exceeds original_max_position (HF decides per forward on max(position_ids) + 1),
//   short_factor otherwise; cos and sin are multiplied by attention_factor (both lists and the
//   factor in RopeConfig, the factor from config.cpp). The backward is the transpose: the inverse
//   rotation times the same attention_factor.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace bp {

struct RopeConfig {
  int head_dim = 0;
  float theta = 10000.0f;
  bool llama3_scaling = false;
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;  // llama3 and longrope
  int rotary_dim = -1;               // dims of each head that rotate (even); -1 = head_dim
  bool longrope = false;
  std::vector<float> short_factor, long_factor;  // [rotary_dim/2] each, longrope only
  float attention_factor = 1.0f;                 // multiplies cos and sin (longrope)
  float linear_factor = 1.0f;                    // rope_type "linear": every inv_freq divided by it (1 = none)

  int rot_dim() const { return rotary_dim < 0 ? head_dim : rotary_dim; }
};

// [rot_dim/2]; max_position: the largest position of the call (longrope picks its factors by it).
std::vector<float> rope_inv_freq(const RopeConfig& cfg, int64_t max_position = 0);
void rope_forward(Tensor& x, const Tensor& positions, int n_heads, const RopeConfig& cfg);
void rope_backward(Tensor& dx, const Tensor& positions, int n_heads, const RopeConfig& cfg, Tensor* dx_bf16 = nullptr);
void rope_forward(Tensor& q, Tensor& k, const Tensor& positions, int q_heads, int k_heads, const RopeConfig& cfg,
                  const Tensor* q_bias = nullptr, const Tensor* k_bias = nullptr);
void rope_backward(Tensor& dq, Tensor& dk, const Tensor& positions, int q_heads, int k_heads, const RopeConfig& cfg,
                   Tensor* dq_bf16 = nullptr, Tensor* dk_bf16 = nullptr);

}  // namespace bp
