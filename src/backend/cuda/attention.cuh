// CUDA causal grouped-query attention over packed variable-length samples (contract:
// ops/attention.h; CPU sibling: backend/cpu/attention.cpp, same AttentionDims and layouts).
//
// Layout: q/o/dout/dq [T, Hq·d], k/v/dk/dv [T, Hkv·d] stored as T (f32 or bf16); query head h
// reads KV head h / (Hq/Hkv); sample s owns tokens [cu[s], cu[s+1]) and a query at position i of
// its sample sees the keys at positions 0..i of the same sample. lse and delta are f32 [Hq, T].
// Scale 1/sqrt(d). The options of AttentionDims (ops/attention.h) in every kernel: a window W
// hides keys j <= i - W (attention_visible) and the key / query tile walks skip the tiles no row
// of theirs sees; scale replaces 1/sqrt(d); a soft cap c maps each scaled score s to c·tanh(s/c)
// (attention_capped) and the backward multiplies dS by 1 - tanh² (attention_cap_slope).
//
// Two implementations of the same tiling, picked per call by attention_uses_tensor_cores:
// - the scalar kernels below: every product and sum f32, only the outputs rounded to T; on Turing
//   (compute capability 7.5) and for head dims that are not multiples of 16;
// - the tensor-core kernels (attention_tc.cuh) from compute capability 8.0 on: the same blocks and
//   walks, each tile product on wmma bf16 fragments with f32 accumulation, so Q, K, V, dO, P and dS
//   are rounded to bf16 inside the kernel (in f32 storage too); softmax, lse, delta stay f32. Their
//   forward and dQ give way to attention_fa2.cuh's up to head dim kFa2MaxHeadDim and
//   kFa2DqMaxHeadDim (128), their dK/dV up to kFa2BackwardMaxHeadDim (64): the same numerics, with
//   scores, softmax and the accumulators in registers (PTX mma, 64-row tiles).
// All run on the CPU simulation (sim/cuda_sim.h, sim/sim_wmma.h, sim/sim_mma.h); tests/cuda runs
// each.
//
// Flash-attention tiling (FlashAttention-2 math): shared-memory tiles of B rows, nothing [T × T]
// anywhere. The rest of this comment describes the scalar kernels (attention_tc.cuh gives its
// tile sizes and shared memory).
//   forward   one block per (query tile, query head): Q tile in shared memory; for each key tile
//             0..diagonal: K, V tiles → S = scale·Q·Kᵀ (masked) → online softmax per row (running
//             max m, running sum l, rescale factor for O) → O = O·α + P·V. Writes o = O / l and
//             lse = m + log l.
//   backward  1. delta[h, t] = Σ_c dO·O (one warp per row, warp_sum);
//             2. dK/dV: one block per (key tile, KV head): K, V tiles and the dK, dV accumulators
//                stay in shared memory while the block walks every query head of its group and
//                every query tile at or after the key tile: P = exp(scale·Q·Kᵀ − lse) (masked),
//                dP = dO·Vᵀ, dS = P∘(dP − delta); dV += Pᵀ·dO, dK += scale·dSᵀ·Q;
//             3. dQ: one block per (query tile, query head) walks the key tiles 0..diagonal,
//                recomputes P and dS the same way and accumulates dQ += scale·dS·K.
//             dQ and dK/dV are two kernels that both recompute P (7 tile products instead of 5)
//             so that every output element has exactly one writer: no atomics, every sum in a
//             fixed order, results bit-identical run to run; the GQA group is summed inside one
//             block (head order), so no partial [T, Hq·d] buffers are needed either.
// Blocks find their tile by walking cu_seqlens (every thread the same walk: no barrier); the grid
// holds an upper bound of the tile count, Σ ceil(len/B) <= (T + S·(B−1)) / B, and blocks past the
// last tile return at once. Query tiles of a sample are handed out last first (they see the most
// keys), so the costly blocks start early.
//
// Shared memory per block (f32; the tile row stride is d+1 so that the threads of a warp, one
// key row each, read different banks in the score products):
//   forward  Q, K, V tiles 3·B·(d+1) + O accumulator B·d + scores B·(B+1) + 3 row stats B
//   dQ       Q, dO, K, V tiles 4·B·(d+1) + dQ B·d + dS B·(B+1) + lse, delta 2·B
//   dK/dV    Q, dO, K, V tiles 4·B·(d+1) + dK, dV 2·B·d + P, dS 2·B·(B+1) + lse, delta 2·B
// B is the largest of 32, 16, 8 whose block fits the 48 KiB every architecture gives without
// opting in (d = 64: forward and dQ 32, dK/dV 16; d = 128: 16, 16, 8); above that (d > ~180,
// up to kCudaAttentionMaxHeadDim) B = 8 and the kernel opts in to more dynamic shared memory. The
// threads of a block (128) stride over the B·B score entries (thread → one (row, key) pair: a dot
// product over d from shared memory) and over the B·d accumulator entries (thread → one (row,
// column) pair: a sum over the tile's B rows); each thread owns the same accumulator entries for
// the whole kernel, so accumulators need no barrier between the last update and the store.
// Compiled by nvcc through attention.cu, and as host C++ on the CPU simulation in tests/cuda.
#pragma once

#include <cmath>
#include <cstddef>

#include "backend/cpu/attention.h"  // AttentionDims: the dispatch passes one struct to either backend
#include "backend/cuda/attention_limits.h"
#include "backend/cuda/cuda_compat.cuh"

namespace bp::BP_CUDA_NS {

using AttentionDims = ::bp::cpu::AttentionDims;

constexpr int kAttentionThreads = 128;
constexpr size_t kAttentionDefaultSharedBytes = 48 * 1024;  // without cudaFuncSetAttribute

enum class AttentionPass { Forward, GradQ, GradKV };

// Floats of dynamic shared memory one block of `pass` uses with tiles of B rows (layout above).
inline int64_t attention_shared_floats(AttentionPass pass, int B, int d) {
  const int64_t tile = int64_t{B} * (d + 1), acc = int64_t{B} * d, scores = int64_t{B} * (B + 1);
  switch (pass) {
    case AttentionPass::Forward: return 3 * tile + acc + scores + 3 * B;
    case AttentionPass::GradQ: return 4 * tile + acc + scores + 2 * B;
    case AttentionPass::GradKV: break;
  }
  return 4 * tile + 2 * acc + 2 * scores + 2 * B;
}

// Rows per tile (queries and keys alike) of `pass` for head dimension d.
inline int attention_tile_rows(AttentionPass pass, int d) {
  for (int B : {32, 16})
    if (attention_shared_floats(pass, B, d) * sizeof(float) <= kAttentionDefaultSharedBytes) return B;
  return 8;
}

// Upper bound of Σ_s ceil(len_s / B) over S samples holding T tokens (the grid's x size).
inline int64_t attention_tile_bound(int64_t T_tokens, int64_t n_samples, int B) {
  return (T_tokens + n_samples * (B - 1)) / B;
}

struct AttentionTile {
  int64_t base;   // the sample's first token in the packed batch
  int64_t len;    // the sample's length
  int64_t start;  // the tile's first row, as a position inside the sample
  int rows;       // rows of the tile that exist: min(B, len − start)
};

// Tile `index` of the packed batch (samples in order; inside a sample, last tile first when
// `last_first`). False when index is past the last tile.
__device__ __forceinline__ bool find_attention_tile(const int32_t* cu, int64_t n_samples, int B, int64_t index,
                                                    bool last_first, AttentionTile& tile) {
  for (int64_t s = 0; s < n_samples; ++s) {
    const int64_t base = cu[s], len = cu[s + 1] - base, n_tiles = (len + B - 1) / B;
    if (index < n_tiles) {
      const int64_t t = last_first ? n_tiles - 1 - index : index;
      tile.base = base;
      tile.len = len;
      tile.start = t * B;
      tile.rows = static_cast<int>(len - t * B < B ? len - t * B : B);
      return true;
    }
    index -= n_tiles;
  }
  return false;
}

// Copies `rows` rows of one head (d columns, source row stride `stride`) into a shared tile with
// row stride d+1; rows past `rows` are zero so that masked products read finite numbers.
template <class T>
__device__ __forceinline__ void load_attention_tile(float* dst, const T* src, int64_t stride, int rows, int B, int d) {
  const int ld = d + 1;
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    dst[r * ld + c] = r < rows ? load_f32(src[r * stride + c]) : 0.0f;
  }
}

// The K and V tiles of KV head g from token `token0` on.
template <class T>
__device__ __forceinline__ void load_kv_tiles(float* Ks, float* Vs, const T* k, const T* v, int64_t token0, int g,
                                              int64_t kv_stride, int keys, int B, int d) {
  load_attention_tile(Ks, k + token0 * kv_stride + int64_t{g} * d, kv_stride, keys, B, d);
  load_attention_tile(Vs, v + token0 * kv_stride + int64_t{g} * d, kv_stride, keys, B, d);
}

__device__ __forceinline__ float attention_dot(const float* a, const float* b, int d) {
  float s = 0.0f;
  for (int c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}

// Whether the query at position i of a sample sees the key at position j: causal, and inside the
// window (i - W < j) when there is one (W > 0).
__device__ __forceinline__ bool attention_visible(int64_t i, int64_t j, int64_t window) {
  return j <= i && (window <= 0 || i - j < window);
}

// A scaled score after the soft cap c (none when c = 0), and d capped / d score at a capped score
// (1 - tanh²; 1 without a cap).
__device__ __forceinline__ float attention_capped(float s, float cap) {
  return cap > 0.0f ? cap * tanhf(s / cap) : s;
}
__device__ __forceinline__ float attention_cap_slope(float capped, float cap) {
  if (cap <= 0.0f) return 1.0f;
  const float t = capped / cap;
  return 1.0f - t * t;
}

// The first key tile (a multiple of B) a query tile starting at position `start` sees, and the end
// of the query tiles that see a key tile whose last key is at position `last_key` (clamped to len).
__device__ __forceinline__ int64_t attention_first_key_tile(int64_t start, int64_t window, int B) {
  const int64_t first = window > 0 && start >= window ? start - window + 1 : 0;
  return first / B * B;
}
__device__ __forceinline__ int64_t attention_query_end(int64_t last_key, int64_t len, int64_t window) {
  return window > 0 && last_key + window < len ? last_key + window : len;
}

template <class T>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_forward_kernel(const T* q, const T* k, const T* v, const int32_t* cu, int64_t n_samples, int64_t T_tokens,
                             int n_heads, int group, int d, int B, float scale, int64_t window, float cap, T* o,
                             bf16* o16, float* lse) {
  AttentionTile tile;
  if (!find_attention_tile(cu, n_samples, B, blockIdx.x, true, tile)) return;  // the whole block alike
  BP_DYNAMIC_SHARED(float, smem);
  const int ld = d + 1, h = blockIdx.y, g = h / group, sld = B + 1;
  const int64_t q_stride = int64_t{n_heads} * d, kv_stride = int64_t{n_heads / group} * d;
  float* Qs = smem;
  float* Ks = Qs + B * ld;
  float* Vs = Ks + B * ld;
  float* Os = Vs + B * ld;
  float* Ss = Os + B * d;
  float* row_max = Ss + B * sld;
  float* row_sum = row_max + B;
  float* row_rescale = row_sum + B;

  load_attention_tile(Qs, q + (tile.base + tile.start) * q_stride + int64_t{h} * d, q_stride, tile.rows, B, d);
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) Os[e] = 0.0f;
  for (int r = threadIdx.x; r < B; r += blockDim.x) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;
  }
  const int64_t key_end = tile.start + tile.rows;  // causal: later keys are seen by no row here
  for (int64_t j0 = attention_first_key_tile(tile.start, window, B); j0 < key_end; j0 += B) {
    const int keys = static_cast<int>(key_end - j0 < B ? key_end - j0 : B);
    __syncthreads();  // the previous tile's readers of Ks, Vs, Ss are done (first time: Qs is loaded)
    load_kv_tiles(Ks, Vs, k, v, tile.base + j0, g, kv_stride, keys, B, d);
    __syncthreads();
    for (int e = threadIdx.x; e < B * B; e += blockDim.x) {
      const int r = e / B, j = e % B;
      const bool seen = r < tile.rows && j < keys && attention_visible(tile.start + r, j0 + j, window);
      Ss[r * sld + j] = seen ? attention_capped(scale * attention_dot(Qs + r * ld, Ks + j * ld, d), cap) : -INFINITY;
    }
    __syncthreads();
    // Online softmax, one thread per row: the new running max, the factor that rescales what was
    // accumulated under the old one, and the tile's probabilities (in place of the scores).
    for (int r = threadIdx.x; r < B; r += blockDim.x) {
      float* srow = Ss + r * sld;
      const float m_old = row_max[r];
      float m = m_old;
      for (int j = 0; j < keys; ++j) m = fmaxf(m, srow[j]);
      float alpha = 1.0f, sum = 0.0f;
      if (m == -INFINITY) {  // a row past the sample's end (every key masked): stays empty
        for (int j = 0; j < keys; ++j) srow[j] = 0.0f;
      } else {
        alpha = expf(m_old - m);  // 0 on the first tile (m_old = −inf)
        for (int j = 0; j < keys; ++j) {
          const float p = expf(srow[j] - m);  // masked: exp(−inf) = 0
          srow[j] = p;
          sum += p;
        }
      }
      row_max[r] = m;
      row_sum[r] = row_sum[r] * alpha + sum;
      row_rescale[r] = alpha;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
      const int r = e / d, c = e % d;
      const float* prow = Ss + r * sld;
      float acc = Os[e] * row_rescale[r];
      for (int j = 0; j < keys; ++j) acc += prow[j] * Vs[j * ld + c];
      Os[e] = acc;
    }
  }
  // Each thread stores the O entries it accumulated; row_sum/row_max were last written before the
  // barrier that preceded the last accumulation.
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    if (r < tile.rows)
      store_with_bf16(o, o16, (tile.base + tile.start + r) * q_stride + int64_t{h} * d + c, Os[e] / row_sum[r]);
  }
  if (lse)
    for (int r = threadIdx.x; r < tile.rows; r += blockDim.x)
      lse[int64_t{h} * T_tokens + tile.base + tile.start + r] = row_max[r] + logf(row_sum[r]);  // l >= 1
}

// delta[h, t] = Σ_c dO[t, h·d + c] · O[t, h·d + c]: one warp per (token, head) row. With
// dout_as_bf16 (the tensor-core kernels, whose dP = dO·Vᵀ reads dO rounded to bf16) dO is rounded
// the same way here, so that dP − delta, which cancels to about zero on average over a row, does
// not also carry the difference between two roundings of dO (measured on tiny-chat: the largest
// LoRA gradient error 2.5% → 1.9%).
template <class T>
__global__ void attention_delta_kernel(const T* dout, const T* o, int64_t T_tokens, int n_heads, int d, float* delta,
                                       bool dout_as_bf16) {
  const int64_t row = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32;  // t·Hq + h
  if (row >= T_tokens * n_heads) return;                                           // the whole warp alike
  const T* a = dout + row * d;
  const T* b = o + row * d;
  float s = 0.0f;
  for (int c = threadIdx.x % 32; c < d; c += 32)
    s += (dout_as_bf16 ? __bfloat162float(__float2bfloat16(load_f32(a[c]))) : load_f32(a[c])) * load_f32(b[c]);
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) delta[(row % n_heads) * T_tokens + row / n_heads] = s;
}

// The backward's operands of one query tile: Q and dO rows of head h (zero past `rows`) and their
// lse and delta.
template <class T>
__device__ __forceinline__ void load_backward_query_tile(float* Qs, float* dOs, float* lse_s, float* delta_s,
                                                         const T* q, const T* dout, const float* lse,
                                                         const float* delta, int64_t row0, int rows, int h,
                                                         int64_t q_stride, int64_t T_tokens, int B, int d) {
  load_attention_tile(Qs, q + row0 * q_stride + int64_t{h} * d, q_stride, rows, B, d);
  load_attention_tile(dOs, dout + row0 * q_stride + int64_t{h} * d, q_stride, rows, B, d);
  for (int r = threadIdx.x; r < B; r += blockDim.x) {
    lse_s[r] = r < rows ? lse[int64_t{h} * T_tokens + row0 + r] : 0.0f;
    delta_s[r] = r < rows ? delta[int64_t{h} * T_tokens + row0 + r] : 0.0f;
  }
}

// The recomputed probability P = exp(cap(scale·q·k) − lse) of one visible (query, key) pair and its
// score gradient dS = P·(dO·v − delta)·cap'.
struct ProbAndGrad {
  float p, ds;
};
__device__ __forceinline__ ProbAndGrad backward_prob_and_grad(const float* q_row, const float* do_row,
                                                              const float* k_row, const float* v_row, int d,
                                                              float scale, float cap, float lse_r, float delta_r) {
  const float s = attention_capped(scale * attention_dot(q_row, k_row, d), cap);
  const float p = expf(s - lse_r);
  return {p, p * (attention_dot(do_row, v_row, d) - delta_r) * attention_cap_slope(s, cap)};
}

// The dynamic shared memory of a backward block, in the order attention_shared_floats counts it:
// Q, dO, K, V tiles; the accumulators (dQ, or dK and dV); the score buffers (dS, or P and dS);
// lse and delta of the query rows. The dQ pass has no dV accumulator and no P buffer (null).
struct BackwardTiles {
  float *Qs, *dOs, *Ks, *Vs, *acc, *acc2, *Ps, *dSs, *lse_s, *delta_s;
};
__device__ __forceinline__ BackwardTiles carve_backward_tiles(float* smem, AttentionPass pass, int B, int d) {
  const int ld = d + 1, sld = B + 1;
  const bool kv = pass == AttentionPass::GradKV;
  BackwardTiles t;
  t.Qs = smem;
  t.dOs = t.Qs + B * ld;
  t.Ks = t.dOs + B * ld;
  t.Vs = t.Ks + B * ld;
  t.acc = t.Vs + B * ld;
  t.acc2 = kv ? t.acc + B * d : nullptr;
  t.Ps = kv ? t.acc2 + B * d : nullptr;
  t.dSs = (kv ? t.Ps + B * sld : t.acc + B * d);
  t.lse_s = t.dSs + B * sld;
  t.delta_s = t.lse_s + B;
  return t;
}

template <class T>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_backward_dq_kernel(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                                 const float* delta, const int32_t* cu, int64_t n_samples, int64_t T_tokens,
                                 int n_heads, int group, int d, int B, float scale, int64_t window, float cap, T* dq) {
  AttentionTile tile;
  if (!find_attention_tile(cu, n_samples, B, blockIdx.x, true, tile)) return;
  BP_DYNAMIC_SHARED(float, smem);
  const int ld = d + 1, h = blockIdx.y, g = h / group, sld = B + 1;
  const int64_t q_stride = int64_t{n_heads} * d, kv_stride = int64_t{n_heads / group} * d;
  const int64_t row0 = tile.base + tile.start;  // first token of the tile
  const BackwardTiles sh = carve_backward_tiles(smem, AttentionPass::GradQ, B, d);
  float *Qs = sh.Qs, *dOs = sh.dOs, *Ks = sh.Ks, *Vs = sh.Vs, *dQs = sh.acc, *dSs = sh.dSs;
  float *lse_s = sh.lse_s, *delta_s = sh.delta_s;

  load_backward_query_tile(Qs, dOs, lse_s, delta_s, q, dout, lse, delta, row0, tile.rows, h, q_stride, T_tokens, B, d);
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) dQs[e] = 0.0f;
  const int64_t key_end = tile.start + tile.rows;
  for (int64_t j0 = attention_first_key_tile(tile.start, window, B); j0 < key_end; j0 += B) {
    const int keys = static_cast<int>(key_end - j0 < B ? key_end - j0 : B);
    __syncthreads();
    load_kv_tiles(Ks, Vs, k, v, tile.base + j0, g, kv_stride, keys, B, d);
    __syncthreads();
    for (int e = threadIdx.x; e < B * B; e += blockDim.x) {
      const int r = e / B, j = e % B;
      const bool seen = r < tile.rows && j < keys && attention_visible(tile.start + r, j0 + j, window);
      dSs[r * sld + j] = seen ? backward_prob_and_grad(Qs + r * ld, dOs + r * ld, Ks + j * ld, Vs + j * ld, d, scale,
                                                       cap, lse_s[r], delta_s[r])
                                    .ds
                              : 0.0f;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
      const int r = e / d, c = e % d;
      const float* dsrow = dSs + r * sld;
      float acc = dQs[e];
      for (int j = 0; j < keys; ++j) acc += dsrow[j] * Ks[j * ld + c];
      dQs[e] = acc;
    }
  }
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    if (r < tile.rows) dq[(row0 + r) * q_stride + int64_t{h} * d + c] = store_from_f32<T>(scale * dQs[e]);
  }
}

template <class T>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_backward_dkdv_kernel(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                                   const float* delta, const int32_t* cu, int64_t n_samples, int64_t T_tokens,
                                   int n_heads, int group, int d, int B, float scale, int64_t window, float cap, T* dk,
                                   T* dv, bf16* dv16) {
  AttentionTile tile;  // a tile of keys
  if (!find_attention_tile(cu, n_samples, B, blockIdx.x, false, tile)) return;
  BP_DYNAMIC_SHARED(float, smem);
  const int ld = d + 1, g = blockIdx.y, sld = B + 1, keys = tile.rows;
  const int64_t q_stride = int64_t{n_heads} * d, kv_stride = int64_t{n_heads / group} * d;
  const int64_t key0 = tile.base + tile.start;  // first token of the key tile
  const BackwardTiles sh = carve_backward_tiles(smem, AttentionPass::GradKV, B, d);
  float *Qs = sh.Qs, *dOs = sh.dOs, *Ks = sh.Ks, *Vs = sh.Vs, *dKs = sh.acc, *dVs = sh.acc2, *Ps = sh.Ps;
  float *dSs = sh.dSs, *lse_s = sh.lse_s, *delta_s = sh.delta_s;

  load_kv_tiles(Ks, Vs, k, v, key0, g, kv_stride, keys, B, d);
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
    dKs[e] = 0.0f;
    dVs[e] = 0.0f;
  }
  // Every query head of the group, every query tile that sees a key of this tile, in a fixed order.
  const int64_t query_end = attention_query_end(tile.start + keys - 1, tile.len, window);
  for (int h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i0 = tile.start; i0 < query_end; i0 += B) {
      const int rows = static_cast<int>(tile.len - i0 < B ? tile.len - i0 : B);
      const int64_t row0 = tile.base + i0;
      __syncthreads();  // the previous query tile's readers of Qs, dOs, Ps, dSs are done
      load_backward_query_tile(Qs, dOs, lse_s, delta_s, q, dout, lse, delta, row0, rows, h, q_stride, T_tokens, B, d);
      __syncthreads();
      for (int e = threadIdx.x; e < B * B; e += blockDim.x) {
        const int r = e / B, j = e % B;
        ProbAndGrad pg{0.0f, 0.0f};
        if (r < rows && j < keys && attention_visible(i0 + r, tile.start + j, window))
          pg = backward_prob_and_grad(Qs + r * ld, dOs + r * ld, Ks + j * ld, Vs + j * ld, d, scale, cap, lse_s[r],
                                      delta_s[r]);
        Ps[r * sld + j] = pg.p;
        dSs[r * sld + j] = pg.ds;
      }
      __syncthreads();
      for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
        const int j = e / d, c = e % d;
        float acc_k = dKs[e], acc_v = dVs[e];
        for (int r = 0; r < rows; ++r) {
          acc_v += Ps[r * sld + j] * dOs[r * ld + c];
          acc_k += dSs[r * sld + j] * Qs[r * ld + c];
        }
        dKs[e] = acc_k;
        dVs[e] = acc_v;
      }
    }
  }
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
    const int j = e / d, c = e % d;
    if (j < keys) {
      const int64_t off = (key0 + j) * kv_stride + int64_t{g} * d + c;
      dk[off] = store_from_f32<T>(scale * dKs[e]);
      store_with_bf16(dv, dv16, off, dVs[e]);
    }
  }
}

}  // namespace bp::BP_CUDA_NS

#include "backend/cuda/attention_tc.cuh"  // the tensor-core kernels, beside the scalar ones above
// after attention_tc.cuh (its shared-memory macro): the register-resident kernels
#include "backend/cuda/attention_fa2.cuh"

namespace bp::BP_CUDA_NS {

// Lets `kernel` use more than the default 48 KiB of dynamic shared memory (only big head dims).
// False when the card refuses (its opt-in limit is smaller): the error is then the runtime's last
// error, which the caller's launch check reports, and the kernel must not be launched.
template <class Kernel>
inline bool allow_attention_shared(Kernel kernel, size_t bytes) {
  if (bytes <= kAttentionDefaultSharedBytes) return true;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) ==
         cudaSuccess;
}

// The tensor-core kernels (attention_tc.cuh) run on cards of compute capability 8.0 and later
// (bf16 mma) when the head dim is a multiple of 16 (their 16×16 fragments); the scalar kernels
// above everywhere else (Turing, other head dims). The card asked is the current one, the one the
// kernels launch on (a tensor-core kernel on a Turing card would trap); a runtime that cannot say
// takes the scalar kernels, which run on every card.
inline bool attention_uses_tensor_cores(int head_dim) {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 8 && head_dim % 16 == 0;
}

// Launch geometry of one pass: rows per tile, dynamic shared bytes, grid.
struct AttentionLaunch {
  int rows;
  size_t shared_bytes;
  dim3 grid;
};

inline AttentionLaunch attention_launch(AttentionPass pass, const AttentionDims& dims, bool tensor_cores) {
  const int d = dims.head_dim;
  const int B = tensor_cores ? attention_tc_tile_rows(pass, d) : attention_tile_rows(pass, d);
  const size_t bytes = tensor_cores ? attention_tc_shared_bytes(pass, B, d)
                                    : static_cast<size_t>(attention_shared_floats(pass, B, d)) * sizeof(float);
  const int heads = pass == AttentionPass::GradKV ? dims.n_kv_heads : dims.n_heads;
  const auto tiles = attention_tile_bound(dims.tokens, dims.n_samples, B);
  return {B, bytes, dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(heads))};
}

// The grid of attention_fa2.cuh's kernels: 64-row tiles × `heads`.
inline dim3 fa2_grid(const AttentionDims& dims, int heads) {
  return dim3(static_cast<unsigned>(attention_tile_bound(dims.tokens, dims.n_samples, kFa2Rows)),
              static_cast<unsigned>(heads));
}

// o (overwritten), its nearest-even bf16 copy o16 (written when non-null: the operand of o_proj's
// bf16 GEMM) and lse (written when non-null). Device pointers; cu_seqlens [S+1] i32 on the
// device, dims.n_samples = S. Needs 1 <= head_dim <= kCudaAttentionMaxHeadDim and Hkv dividing Hq
// (the front-end checks both).
template <class T>
void attention_forward(const T* q, const T* k, const T* v, const int32_t* cu_seqlens, const AttentionDims& dims, T* o,
                       bf16* o16, float* lse, cudaStream_t stream = nullptr) {
  if (dims.tokens == 0 || dims.n_heads == 0) return;
  const bool tensor_cores = attention_uses_tensor_cores(dims.head_dim);
  const float scale = ::bp::cpu::attention_scale(dims), cap = dims.softcap;
  const int64_t window = dims.window;
  const int group = dims.n_heads / dims.n_kv_heads;
  if (tensor_cores && dims.head_dim <= kFa2MaxHeadDim) {  // attention_fa2.cuh; wider heads: below
    const auto kernel =
        dims.head_dim <= 64 ? attention_forward_fa2_kernel<T, 64> : attention_forward_fa2_kernel<T, 128>;
    const size_t bytes = attention_fa2_shared_bytes(dims.head_dim);
    if (!allow_attention_shared(kernel, bytes)) return;
    BP_LAUNCH(fa2_grid(dims, dims.n_heads), kAttentionThreads, bytes, stream, kernel)
    (q, k, v, cu_seqlens, dims.n_samples, dims.tokens, dims.n_heads, group, dims.head_dim, scale, window, cap, o, o16,
     lse);
    return;
  }
  const AttentionLaunch L = attention_launch(AttentionPass::Forward, dims, tensor_cores);
  const auto kernel = tensor_cores ? attention_forward_tc_kernel<T> : attention_forward_kernel<T>;
  if (!allow_attention_shared(kernel, L.shared_bytes)) return;
  BP_LAUNCH(L.grid, kAttentionThreads, L.shared_bytes, stream, kernel)
  (q, k, v, cu_seqlens, dims.n_samples, dims.tokens, dims.n_heads, group, dims.head_dim, L.rows, scale, window, cap, o,
   o16, lse);
}

// dq, dk, dv overwritten (=), and dv's nearest-even bf16 copy dv16 when non-null (the dy of
// v_proj's bf16 GEMM; written by the dK/dV kernel beside dv). delta: device scratch of [Hq, T] f32
// (rowsum(dO∘O), as on the CPU).
template <class T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* o, const float* lse,
                        const int32_t* cu_seqlens, const AttentionDims& dims, float* delta, T* dq, T* dk, T* dv,
                        bf16* dv16 = nullptr, cudaStream_t stream = nullptr) {
  if (dims.tokens == 0 || dims.n_heads == 0) return;
  const float scale = ::bp::cpu::attention_scale(dims), cap = dims.softcap;
  const int64_t window = dims.window;
  const int group = dims.n_heads / dims.n_kv_heads, d = dims.head_dim;
  const int64_t delta_rows = dims.tokens * dims.n_heads;
  const bool tensor_cores = attention_uses_tensor_cores(d);
  BP_LAUNCH(blocks_for(delta_rows, kAttentionThreads / 32), kAttentionThreads, 0, stream, attention_delta_kernel<T>)
  (dout, o, dims.tokens, dims.n_heads, d, delta, tensor_cores);

  if (tensor_cores && d <= kFa2BackwardMaxHeadDim) {  // attention_fa2.cuh; wider heads: below
    const size_t bytes = attention_fa2_dkdv_shared_bytes(d);
    if (!allow_attention_shared(attention_backward_dkdv_fa2_kernel<T, 64>, bytes)) return;
    BP_LAUNCH(fa2_grid(dims, dims.n_kv_heads), kAttentionThreads, bytes, stream,
              attention_backward_dkdv_fa2_kernel<T, 64>)
    (dout, q, k, v, lse, delta, cu_seqlens, dims.n_samples, dims.tokens, dims.n_heads, group, d, scale, window, cap, dk,
     dv, dv16);
  } else {
    const AttentionLaunch Lkv = attention_launch(AttentionPass::GradKV, dims, tensor_cores);
    const auto dkdv_kernel = tensor_cores ? attention_backward_dkdv_tc_kernel<T> : attention_backward_dkdv_kernel<T>;
    if (!allow_attention_shared(dkdv_kernel, Lkv.shared_bytes)) return;
    BP_LAUNCH(Lkv.grid, kAttentionThreads, Lkv.shared_bytes, stream, dkdv_kernel)
    (dout, q, k, v, lse, delta, cu_seqlens, dims.n_samples, dims.tokens, dims.n_heads, group, d, Lkv.rows, scale,
     window, cap, dk, dv, dv16);
  }

  if (tensor_cores && d <= kFa2DqMaxHeadDim) {  // attention_fa2.cuh; wider heads: below
    const auto dq_kernel = d <= 64 ? attention_backward_dq_fa2_kernel<T, 64> : attention_backward_dq_fa2_kernel<T, 128>;
    const size_t bytes = attention_fa2_dq_shared_bytes(d);
    if (!allow_attention_shared(dq_kernel, bytes)) return;
    BP_LAUNCH(fa2_grid(dims, dims.n_heads), kAttentionThreads, bytes, stream, dq_kernel)
    (dout, q, k, v, lse, delta, cu_seqlens, dims.n_samples, dims.tokens, dims.n_heads, group, d, scale, window, cap,
     dq);
    return;
  }
  const AttentionLaunch Lq = attention_launch(AttentionPass::GradQ, dims, tensor_cores);
  const auto dq_kernel = tensor_cores ? attention_backward_dq_tc_kernel<T> : attention_backward_dq_kernel<T>;
  if (!allow_attention_shared(dq_kernel, Lq.shared_bytes)) return;
  BP_LAUNCH(Lq.grid, kAttentionThreads, Lq.shared_bytes, stream, dq_kernel)
  (dout, q, k, v, lse, delta, cu_seqlens, dims.n_samples, dims.tokens, dims.n_heads, group, d, Lq.rows, scale, window,
   cap, dq);
}

}  // namespace bp::BP_CUDA_NS
