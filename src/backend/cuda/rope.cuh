// CUDA RoPE (contract: ops/rope.h; CPU sibling: backend/cpu/rope.cpp), Hugging Face rotate_half
// layout: pair i of a head is (x[i], x[i + d/2]); x: [T, n_heads·head_dim] stored as T, rotated
// in place; positions [T]; inv_freq [head_dim/2] f32 in HOST memory: the launch passes the table
// by value as a kernel argument (RopeFreqs, up to kRopeMaxPairs pairs: heads up to the attention
// kernels' 256), so no per-call copy to the device and no device table to keep.
//   out[i] = x[i]·cos − x[i+d/2]·sin,   out[i+d/2] = x[i+d/2]·cos + x[i]·sin
// The angle is formed in f32 as pos·inv_freq[i] (as HF and the CPU kernel do); sin/cos are the
// non-fast-math f32 sincosf (a few ulp on the GPU; the CPU rounds the double result: the two
// differ by ~1e-7 relative). `inverse` rotates by −angle: the backward (the rotation is
// orthogonal). One thread per (token, head, pair); q and k (RopeOperand a, b) in one launch.
// Partial rotary (ops/rope.h): pairs (i, i + rot_dim/2) rotate for i < rot_dim/2; thread slots
// past them carry the pass-through dims two by two (bias added, bf16 copy written, else untouched).
// cos and sin are multiplied by attn_scale (LongRoPE's attention factor; 1 otherwise).
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

// One tensor the kernel rotates: x [T, n_heads·head_dim], its bf16 copy (may be null) and a bias
// [n_heads·head_dim] added to each row before the rotation (may be null: q_proj's / k_proj's).
template <class T>
struct RopeOperand {
  T* x = nullptr;
  int64_t n_heads = 0;
  bf16* x16 = nullptr;
  const float* bias = nullptr;
};

// Heads a.n_heads + b.n_heads per token (b.n_heads 0: a alone): q and k of one attention in one
// launch, each element rotated as a launch of its own tensor would (the same angle, the same sincosf).
template <class T>
__global__ void rope_kernel(RopeOperand<T> a, RopeOperand<T> b, const int32_t* positions,
                            const __grid_constant__ RopeFreqs inv_freq, int64_t T_tokens, int64_t head_dim,
                            int64_t rot_dim, float attn_scale, float sign) {
  const int64_t half = head_dim / 2, heads = a.n_heads + b.n_heads;
  const int64_t total = T_tokens * heads * half;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half, th = idx / half;  // th = t·heads + head
    const int64_t t = th / heads, head = th % heads;
    // Fields picked one by one: a reference to either parameter would copy both to local memory.
    const bool in_a = head < a.n_heads;
    T* x = in_a ? a.x : b.x;
    bf16* x16 = in_a ? a.x16 : b.x16;
    const float* bias = in_a ? a.bias : b.bias;
    const int64_t h = in_a ? head : head - a.n_heads;            // the head within x
    const int64_t row = t * (in_a ? a.n_heads : b.n_heads) + h;  // x's row of head_dim values
    T* lo = x + row * head_dim;
    bf16* lo16 = x16 ? x16 + row * head_dim : nullptr;
    const int64_t rhalf = rot_dim / 2;
    if (i >= rhalf) {  // two pass-through dims
      if (!bias && !x16) continue;
      const int64_t j = rot_dim + 2 * (i - rhalf);
      for (int64_t e = j; e < j + 2; ++e)
        store_with_bf16(lo, lo16, e, load_f32(lo[e]) + (bias ? bias[h * head_dim + e] : 0.0f));
      continue;
    }
    const float angle = static_cast<float>(positions[t]) * inv_freq.v[i];
    float s, c;
    sincosf(angle, &s, &c);
    c *= attn_scale;
    s = sign * (s * attn_scale);
    float x0 = load_f32(lo[i]), x1 = load_f32(lo[i + rhalf]);
    if (bias) {  // x + bias, then rotated
      x0 += bias[h * head_dim + i];
      x1 += bias[h * head_dim + i + rhalf];
    }
    store_with_bf16(lo, lo16, i, x0 * c - x1 * s);
    store_with_bf16(lo, lo16, i + rhalf, x1 * c + x0 * s);
  }
}

// inv_freq: host memory, rot_dim/2 <= kRopeMaxPairs values (the caller refuses wider heads).
// a [T, a_heads·head_dim] and b [T, b_heads·head_dim] (b null: a alone) rotated in place in one
// launch. a16, b16 (may be null): the rotated tensor's nearest-even bf16 copy, written beside it
// (the backward's dq, dk: the dy of q_proj's / k_proj's bf16 GEMMs). a_bias, b_bias (may be null):
// [heads·head_dim] added to each row before its rotation (q_proj's and k_proj's biases, forward).
template <class T>
void rope_apply(T* a, int64_t a_heads, bf16* a16, const float* a_bias, T* b, int64_t b_heads, bf16* b16,
                const float* b_bias, const int32_t* positions, const float* inv_freq, int64_t T_tokens,
                int64_t head_dim, int64_t rot_dim, float attn_scale, bool inverse, cudaStream_t stream = nullptr) {
  const RopeOperand<T> first{a, a ? a_heads : 0, a16, a_bias}, second{b, b ? b_heads : 0, b16, b_bias};
  const int64_t total = T_tokens * (first.n_heads + second.n_heads) * (head_dim / 2);
  if (total == 0 || head_dim / 2 > kRopeMaxPairs) return;
  RopeFreqs freqs{};
  for (int64_t i = 0; i < rot_dim / 2; ++i) freqs.v[i] = inv_freq[i];
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 65535));
  BP_LAUNCH(blocks, 256, 0, stream, rope_kernel<T>)
  (first, second, positions, freqs, T_tokens, head_dim, rot_dim, attn_scale, inverse ? -1.0f : 1.0f);
}

}  // namespace bp::BP_CUDA_NS
