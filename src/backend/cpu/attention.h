// CPU kernels of causal grouped-query attention over packed sequences (contract: ops/attention.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace bp::cpu {

struct AttentionDims {
  int64_t tokens = 0;     // T, all samples packed
  int64_t n_samples = 0;  // S; cu_seqlens has S + 1 entries
  int n_heads = 0;        // Hq
  int n_kv_heads = 0;     // Hkv
  int head_dim = 0;       // d
};

// Query rows and key columns per tile. Memory per task is O(tile), never O(T²).
constexpr int64_t kAttentionTile = 64;

// o [T, Hq·d] (overwritten); lse [Hq, T] written when non-null. Per-thread scratch (four
// [d × 64] tiles) comes from the CPU allocator.
void attention_forward(const float* q, const float* k, const float* v, const int32_t* cu_seqlens,
                       const AttentionDims& dims, float* o, float* lse);
// delta is scratch [Hq, T]; dq, dk, dv overwritten.
void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                        const float* lse, const int32_t* cu_seqlens, const AttentionDims& dims, float* delta, float* dq,
                        float* dk, float* dv);

// Bytes of that scratch for the current OpenMP thread count.
size_t attention_scratch_bytes(int head_dim);

// The plain kernels (one dot product per score, no scratch): the reference the tiled ones above
// are tested against.
void attention_forward_plain(const float* q, const float* k, const float* v, const int32_t* cu_seqlens,
                             const AttentionDims& dims, float* o, float* lse);
void attention_backward_plain(const float* dout, const float* q, const float* k, const float* v, const float* o,
                              const float* lse, const int32_t* cu_seqlens, const AttentionDims& dims, float* delta,
                              float* dq, float* dk, float* dv);

}  // namespace bp::cpu
