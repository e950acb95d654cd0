// CPU kernels for RoPE (contract: ops/rope.h). x: [T, n_heads·head_dim], positions: [T],
// inv_freq: [head_dim/2]. Positions are already checked (non-negative).
#pragma once

#include <cstdint>

namespace bp::cpu {

// Rotates every head of every token in place by angle pos·inv_freq[i]; `inverse` rotates by
// the negative angle (the backward: the rotation is orthogonal, its transpose is its inverse).
// x_bf16 (may be null): the rotated x rounded to nearest-even bf16 as well [T, n_heads·head_dim],
// for the bf16 GEMMs that read it (the backward's dq, dk: the dy of q_proj, k_proj).
void rope_apply(float* x, const int32_t* positions, const float* inv_freq, int64_t T, int64_t n_heads, int64_t head_dim,
                bool inverse, uint16_t* x_bf16);

}  // namespace bp::cpu
