// CUDA RoPE (contract: ops/rope.h; CPU sibling: backend/cpu/rope.cpp), Hugging Face rotate_half
// layout: pair i of a head is (x[i], x[i + d/2]); x: [T, n_heads·head_dim] stored as T, rotated
// in place; positions [T]; inv_freq [head_dim/2] f32 in HOST memory: the launch passes the table
// by value as a kernel argument (RopeFreqs, up to kRopeMaxPairs pairs: heads up to the attention
// kernels' 256), so no per-call copy to the device and no device table to keep.
//   out[i] = x[i]·cos − x[i+d/2]·sin,   out[i+d/2] = x[i+d/2]·cos + x[i]·sin
// The angle is formed in f32 as pos·inv_freq[i] (as HF and the CPU kernel do); sin/cos are the
// non-fast-math f32 sincosf (a few ulp on the GPU; the CPU rounds the double result: the two
// differ by ~1e-7 relative). `inverse` rotates by −angle: the backward (the rotation is
// orthogonal). One thread per (token, head, pair).
#pragma once

#include "backend/cuda/attention_limits.h"
#include "backend/cuda/cuda_compat.cuh"

namespace bp::BP_CUDA_NS {

// 512 bytes of kernel arguments (CUDA allows 4 KiB), read in place (__grid_constant__: indexed at run
// time, a plain by-value struct may be copied into each thread's local memory first)
constexpr int64_t kRopeMaxPairs = kCudaRopeMaxHeadDim / 2;
struct RopeFreqs {
  float v[kRopeMaxPairs];
};

template <class T>
__global__ void rope_kernel(T* x, const int32_t* positions, const __grid_constant__ RopeFreqs inv_freq,
                            int64_t T_tokens, int64_t n_heads, int64_t head_dim, float sign, bf16* x16) {
  const int64_t half = head_dim / 2;
  const int64_t total = T_tokens * n_heads * half;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half, th = idx / half;  // th = t·n_heads + h
    const int64_t t = th / n_heads;
    const float angle = static_cast<float>(positions[t]) * inv_freq.v[i];
    float s, c;
    sincosf(angle, &s, &c);
    s *= sign;
    T* lo = x + th * head_dim;
    const float a = load_f32(lo[i]), b = load_f32(lo[i + half]);
    bf16* lo16 = x16 ? x16 + th * head_dim : nullptr;
    store_with_bf16(lo, lo16, i, a * c - b * s);
    store_with_bf16(lo, lo16, i + half, b * c + a * s);
  }
}

// inv_freq: host memory, head_dim/2 <= kRopeMaxPairs values (the caller refuses wider heads). x16
// (may be null): the rotated x's nearest-even bf16 copy, written beside it (the backward's dq, dk:
// the dy of q_proj's / k_proj's bf16 GEMMs).
template <class T>
void rope_apply(T* x, const int32_t* positions, const float* inv_freq, int64_t T_tokens, int64_t n_heads,
                int64_t head_dim, bool inverse, bf16* x16 = nullptr, cudaStream_t stream = nullptr) {
  const int64_t total = T_tokens * n_heads * (head_dim / 2);
  if (total == 0 || head_dim / 2 > kRopeMaxPairs) return;
  RopeFreqs freqs{};
  for (int64_t i = 0; i < head_dim / 2; ++i) freqs.v[i] = inv_freq[i];
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 65535));
  BP_LAUNCH(blocks, 256, 0, stream, rope_kernel<T>)
  (x, positions, freqs, T_tokens, n_heads, head_dim, inverse ? -1.0f : 1.0f, x16);
}

}  // namespace bp::BP_CUDA_NS
