// CPU kernels for RoPE (contract: ops/rope.h). x: [T, n_heads·head_dim], positions: [T],
// inv_freq: [head_dim/2]. Positions are already checked (non-negative).
#pragma once

#include <cstdint>

namespace bp::cpu {

// Rotates every head of every token in place by angle pos·inv_freq[i]; `inverse` rotates by
// the negative angle (the backward: the rotation is orthogonal, its transpose is its inverse).
void rope_apply(float* x, const int32_t* positions, const float* inv_freq, int64_t T, int64_t n_heads, int64_t head_dim,
                bool inverse);

}  // namespace bp::cpu
