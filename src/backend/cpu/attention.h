// CPU kernels of causal grouped-query attention over packed sequences (contract: ops/attention.h).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace bp::cpu {

struct AttentionDims {
  int64_t tokens = 0;     // T, all samples packed
  int64_t n_samples = 0;  // S; cu_seqlens has S + 1 entries
  int n_heads = 0;        // Hq
  int n_kv_heads = 0;     // Hkv
  int head_dim = 0;       // d
  int64_t window = 0;     // sliding window W: query i sees keys i-W < j <= i; 0 = unlimited
  float scale = 0.0f;     // score scale; 0 = 1/sqrt(d) (attention_scale)
  float softcap = 0.0f;   // scores s -> softcap·tanh(s/softcap) before the softmax; 0 = none
};

// The scale the kernels apply to q·k: dims.scale, or 1/sqrt(d) when it is 0.
inline float attention_scale(const AttentionDims& dims) {
  return dims.scale > 0.0f ? dims.scale : 1.0f / std::sqrt(static_cast<float>(dims.head_dim));
}

// First key position (within the sample) visible to the query at position i: i - W + 1, or 0.
inline int64_t attention_first_key(const AttentionDims& dims, int64_t i) {
  return dims.window > 0 && i >= dims.window ? i - dims.window + 1 : 0;
}

// Query rows per block (blocked kernels) and per tile (plain kernels). Memory per task is
// O(block rows × sample length), never O(T²).
constexpr int64_t kAttentionTile = 64;

// Blocked kernels, GEMMs through OpenBLAS (attention.cpp). o [T, Hq·d] (overwritten); o_bf16 (o
// rounded to nearest-even bf16, for o_proj's bf16 GEMM: ops/attention.h) and lse [Hq, T] written
// when non-null. Scratch comes from the CPU allocator, sizes below.
void attention_forward(const float* q, const float* k, const float* v, const int32_t* cu_seqlens,
                       const AttentionDims& dims, float* o, uint16_t* o_bf16, float* lse);
// delta is scratch [Hq, T]; dq, dk, dv overwritten; dv_bf16 (dv rounded to nearest-even bf16, the
// dy of v_proj's bf16 GEMM: ops/attention.h) written when non-null.
void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                        const float* lse, const int32_t* cu_seqlens, const AttentionDims& dims, float* delta, float* dq,
                        float* dk, float* dv, uint16_t* dv_bf16);

// Floats of scratch the blocked kernels allocate (one tensor each) for samples of at most max_len
// tokens, with `threads` = omp_get_max_threads() at the call. Forward: one [min(64, max_len) ×
// keys] score block per thread, keys = max_len, or min(max_len, 64 + W - 1) with a window W.
// Backward: two such blocks per thread, plus per-query-head partial dk and dv ([T, Hq·d] each)
// when Hq > Hkv. Monotone in max_len: the memory plan passes the micro-batch token count as the
// bound.
int64_t attention_forward_scratch_floats(int64_t max_len, const AttentionDims& dims, int threads);
int64_t attention_backward_scratch_floats(int64_t max_len, const AttentionDims& dims, int threads);

// The plain kernels (one dot product per score, no scratch): the reference the blocked ones above
// are tested against.
void attention_forward_plain(const float* q, const float* k, const float* v, const int32_t* cu_seqlens,
                             const AttentionDims& dims, float* o, float* lse);
void attention_backward_plain(const float* dout, const float* q, const float* k, const float* v, const float* o,
                              const float* lse, const int32_t* cu_seqlens, const AttentionDims& dims, float* delta,
                              float* dq, float* dk, float* dv);

}  // namespace bp::cpu
