// CPU kernels for RoPE (contract: ops/rope.h). Each target x: [T, n_heads·head_dim], positions: [T],
// inv_freq: [head_dim/2]. Positions are already checked (non-negative).
#pragma once

#include <cstdint>

namespace bp::cpu {

// A tensor RoPE rotates in place: x [T, n_heads·head_dim], and x_bf16 (may be null) where the
// rotated x is also rounded to nearest-even bf16 [T, n_heads·head_dim], for the bf16 GEMMs that read
// it (the backward's dq, dk: the dy of q_proj, k_proj). bias (may be null): [n_heads·head_dim] added
// to every row before the rotation (q_proj's / k_proj's bias, Qwen2: no launch of its own).
struct RopeTarget {
  float* x = nullptr;
  int64_t n_heads = 0;
  uint16_t* x_bf16 = nullptr;
  const float* bias = nullptr;
};

// Rotates every head of every token of `a` and of `b` (b.x null: none; q and k of one attention
// share the positions, so one call serves both, each token's angles computed once) in place by angle
// pos·inv_freq[i]; `inverse` rotates by the negative angle (the backward: the rotation is
// orthogonal, its transpose is its inverse). Only the first rot_dim dims of each head rotate (pairs
// (i, i + rot_dim/2), inv_freq [rot_dim/2]); the others pass through (bias added, bf16 copy
// written). cos and sin are multiplied by attn_scale (LongRoPE's attention factor; 1 otherwise).
void rope_apply(RopeTarget a, RopeTarget b, const int32_t* positions, const float* inv_freq, int64_t T,
                int64_t head_dim, int64_t rot_dim, float attn_scale, bool inverse);

}  // namespace bp::cpu
