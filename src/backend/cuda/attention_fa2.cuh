// FlashAttention-2-style kernels for cards of compute capability >= 8.0 and head dims that are
// multiples of 16: the forward up to kFa2MaxHeadDim, the backward's dK/dV up to
// kFa2BackwardMaxHeadDim and its dQ up to kFa2DqMaxHeadDim (below). attention.cuh: contract, layouts, tile walk; its
// launchers pick these kernels (tensor cores and d within the cap). Included by attention.cuh only.
//
// What lives where (one block = 4 warps = kFa2Rows = 64 query rows of one head; key tiles of 64):
// - registers, per warp (16 query rows each): the Q operand of its rows (loaded once, as PTX mma
//   A fragments, cuda_mma.cuh), the scores S = Q·Kᵀ of the current key tile (8 m16n8 accumulators),
//   the running row max and sum, and the O accumulator (d/8 m16n8 accumulators, f32);
// - shared memory, filled by the whole block for each key tile: K as bf16 [64 keys][d + 8] and V
//   transposed, bf16 [d][64 + 8] (the + 8 spreads a warp's fragment loads over all 32 banks: a lane
//   (g, t) reads word g·(row words) + t, and the row words are 4 mod 32), so both B operands are
//   pairs of consecutive bf16: one 32-bit load each.
// The online softmax runs in registers on the accumulator layout: lane (g = lane / 4, t = lane % 4)
// holds rows g and g + 8 of the warp's 16, columns 2t, 2t + 1 of each 8-wide tile; a row's max and
// sum combine the 4 lanes of a quad with __shfl_xor_sync (1, then 2: a fixed order). P is packed to
// bf16 straight from the S accumulators into the A operand of P·V: the A layout of the k step over
// keys 16s..16s+15 is exactly the C layout of S's tiles 2s (registers 0, 1) and 2s + 1 (2, 3). O is
// rescaled by exp(m_old − m_new) in registers, divided by the row sum at the end and stored once
// (one writer per element: the lane holding it); lse = m + log l as the other forwards write it.
// Every sum runs in a fixed order (key tiles in order, k steps in order, the quad reduction in a
// fixed pattern): bit-identical run to run. Numerics as attention_tc.cuh: Q, K, V, P rounded to
// bf16, products and softmax in f32.
//
// Why a cap: the registers of a thread hold d/4 words of Q, d/2 floats of O and 32 of S: 128
// values at d = 128 (ptxas: 186 registers with addressing and temporaries, no spill), 224 at
// d = 256, which with the same overhead is past the 255 a thread can have (it would spill to local
// memory); d = 256 keeps attention_tc.cuh's forward. The kernel is compiled for
// the widest head dim of its class (kMaxD 64 or 128), d below it skipping the unused fragments.
// Tile shape (64 × 64, 4 warps), padding and the cap are untuned: no GPU has measured this kernel.
#pragma once

#include "backend/cuda/cuda_mma.cuh"

namespace bp::BP_CUDA_NS {

constexpr int kFa2Rows = 64;  // query rows per block (16 per warp) and keys per key tile
constexpr int kFa2MaxHeadDim = 128;

// Dynamic shared bytes of one block: K [64][d + 8] and Vᵀ [d][64 + 8], bf16.
inline size_t attention_fa2_shared_bytes(int d) {
  return (size_t(kFa2Rows) * (d + 8) + size_t(d) * (kFa2Rows + 8)) * 2;
}

#if BP_CUDA_ARCH_HAS_BF16_MMA

// Two consecutive elements (row, col), (row, col + 1) of one head's rows as a bf16 pair, straight
// from global memory; zero for rows past `rows`.
template <class T>
__device__ __forceinline__ uint32_t fa2_pair(const T* src, int64_t stride, int row, int rows, int col) {
  if (row >= rows) return 0u;
  return pack_bf16x2(load_f32(src[row * stride + col]), load_f32(src[row * stride + col + 1]));
}

// The A operand of k step s (columns 16s..16s + 15) for the 16 rows from `row0` of one head.
template <class T>
__device__ __forceinline__ void fa2_load_a(uint32_t a[4], const T* src, int64_t stride, int row0, int rows, int s) {
  const int g = threadIdx.x % 32 / 4, c = s * 16 + 2 * (threadIdx.x % 4);
  a[0] = fa2_pair(src, stride, row0 + g, rows, c);
  a[1] = fa2_pair(src, stride, row0 + g + 8, rows, c);
  a[2] = fa2_pair(src, stride, row0 + g, rows, c + 8);
  a[3] = fa2_pair(src, stride, row0 + g + 8, rows, c + 8);
}

// The A operands of every k step (d columns) for the 16 rows from `row0` of two tensors of one
// layout (K and V, or Q and dO), into a and b.
template <int kSteps, class T>
__device__ __forceinline__ void fa2_load_a_pair(uint32_t (*a)[4], uint32_t (*b)[4], const T* src_a, const T* src_b,
                                                int64_t stride, int row0, int rows, int d) {
  BP_UNROLL
  for (int s = 0; s < kSteps; ++s)
    if (s * 16 < d) {
      fa2_load_a(a[s], src_a, stride, row0, rows, s);
      fa2_load_a(b[s], src_b, stride, row0, rows, s);
    }
}

// Rows [0, n) of one head (d columns) as bf16, zero up to row 64: into `by_row` [64][d + 8] and/or
// transposed into `by_col` [d][64 + 8] (either may be null).
template <class T>
__device__ __forceinline__ void fa2_stage(bf16* by_row, bf16* by_col, const T* src, int64_t stride, int n, int d) {
  for (int e = threadIdx.x; e < kFa2Rows * d; e += blockDim.x) {
    const int j = e / d, c = e % d;
    const bf16 x = __float2bfloat16(j < n ? load_f32(src[j * stride + c]) : 0.0f);
    if (by_row) by_row[j * (d + 8) + c] = x;
    if (by_col) by_col[c * (kFa2Rows + 8) + j] = x;
  }
}

// The A operand of a k step over 16 columns from the C accumulators of its two 8-column halves
// (the C layout of tiles c0, c1 is exactly that A layout), rounded to bf16.
__device__ __forceinline__ void fa2_c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
  a[0] = pack_bf16x2(c0[0], c0[1]);
  a[1] = pack_bf16x2(c0[2], c0[3]);
  a[2] = pack_bf16x2(c1[0], c1[1]);
  a[3] = pack_bf16x2(c1[2], c1[3]);
}

// acc[n] += A·B over the d/8 output tiles, the B operand of k step ks (columns 16ks..16ks + 15)
// from a transposed stage [d][64 + 8] (fa2_stage's by_col).
template <int kOutTiles>
__device__ __forceinline__ void fa2_mma_by_col(float (*acc)[4], const uint32_t a[4], const bf16* by_col, int ks,
                                               int d) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  BP_UNROLL
  for (int n = 0; n < kOutTiles; ++n) {
    if (n * 8 >= d) break;
    const bf16* col = by_col + (n * 8 + g) * (kFa2Rows + 8) + ks * 16 + 2 * t;  // row n·8 + g, columns 2t, 2t + 1
    const uint32_t b[2] = {load_bf16x2(col), load_bf16x2(col + 8)};
    mma_m16n8k16_bf16(acc[n], a, b, acc[n]);
  }
}

// Max (or sum) of a row's value over the 4 lanes of its quad.
// Row `r` (0: g, 1: g + 8) of a warp's C accumulators (kOutTiles m16n8 tiles, columns 2t, 2t + 1
// of each) times `mul`, stored at `out` (the row's first element + 2t): the backward's dK, dV, dQ.
template <int kOutTiles, class T>
__device__ __forceinline__ void fa2_store_row(T* out, const float (*acc)[4], int r, float mul, int d,
                                              bf16* out16 = nullptr) {
  BP_UNROLL
  for (int n = 0; n < kOutTiles; ++n) {
    if (n * 8 >= d) break;
    store_with_bf16(out, out16, n * 8, mul * acc[n][2 * r]);
    store_with_bf16(out, out16, n * 8 + 1, mul * acc[n][2 * r + 1]);
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

#endif  // BP_CUDA_ARCH_HAS_BF16_MMA

template <class T, int kMaxD>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_forward_fa2_kernel(const T* q, const T* k, const T* v, const int32_t* cu, int64_t n_samples,
                                 int64_t T_tokens, int n_heads, int group, int d, float scale, int64_t window,
                                 float cap, T* o, bf16* o16, float* lse) {
#if BP_CUDA_ARCH_HAS_BF16_MMA
  constexpr int kKeyTiles = kFa2Rows / 8, kSteps = kMaxD / 16, kOutTiles = kMaxD / 8;
  AttentionTile tile;
  if (!find_attention_tile(cu, n_samples, kFa2Rows, blockIdx.x, true, tile)) return;  // the whole block alike
  BP_TC_SHARED(fa2_smem);
  bf16* Ks = reinterpret_cast<bf16*>(fa2_smem);
  bf16* Vt = Ks + kFa2Rows * (d + 8);
  const int ldk = d + 8, ldv = kFa2Rows + 8;
  const int h = blockIdx.y, g_kv = h / group, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4, row0 = warp * 16;  // the warp's rows in the tile
  const int64_t q_stride = int64_t{n_heads} * d, kv_stride = int64_t{n_heads / group} * d;
  const int64_t first_row = tile.base + tile.start;  // the tile's first token

  uint32_t qa[kSteps][4];
  const T* q_head = q + first_row * q_stride + int64_t{h} * d;
  BP_UNROLL
  for (int s = 0; s < kSteps; ++s)
    if (s * 16 < d) fa2_load_a(qa[s], q_head, q_stride, row0, tile.rows, s);
  float acc[kOutTiles][4];
  BP_UNROLL
  for (int n = 0; n < kOutTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g + 8: running max, own-lane sum
  const int64_t pos[2] = {tile.start + row0 + g, tile.start + row0 + g + 8};
  const bool warp_has_rows = row0 < tile.rows;  // the same for every lane of the warp

  const int64_t key_end = tile.start + tile.rows;  // causal: later keys are seen by no row here
  for (int64_t j0 = attention_first_key_tile(tile.start, window, kFa2Rows); j0 < key_end; j0 += kFa2Rows) {
    const int keys = static_cast<int>(key_end - j0 < kFa2Rows ? key_end - j0 : kFa2Rows);
    __syncthreads();  // the previous tile's readers of Ks, Vt are done
    const int64_t kv_at = (tile.base + j0) * kv_stride + int64_t{g_kv} * d;
    fa2_stage(Ks, nullptr, k + kv_at, kv_stride, keys, d);
    fa2_stage(nullptr, Vt, v + kv_at, kv_stride, keys, d);
    __syncthreads();
    if (!warp_has_rows) continue;  // rows past the sample: nothing to compute (no mma, warp-uniform)
    // Keys past `visible` are after every row of the warp (causal) or past the tile: their scores
    // are masked anyway, so their products are skipped (the diagonal tile's upper triangle).
    const int64_t after_last_row = tile.start + row0 + 16 - j0;
    const int visible = static_cast<int>(after_last_row < keys ? after_last_row : keys);

    // S = Q·Kᵀ for the tile's 64 keys: 8 tiles of 8 keys, k steps over d.
    float s[kKeyTiles][4];
    BP_UNROLL
    for (int n = 0; n < kKeyTiles; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      if (n * 8 >= visible) continue;
      const bf16* krow = Ks + (n * 8 + g) * ldk + 2 * t;  // key n·8 + g, dims 2t, 2t + 1 of each step
      BP_UNROLL
      for (int st = 0; st < kSteps; ++st) {
        if (st * 16 >= d) break;
        const uint32_t kb[2] = {load_bf16x2(krow + st * 16), load_bf16x2(krow + st * 16 + 8)};
        mma_m16n8k16_bf16(s[n], qa[st], kb, s[n]);
      }
    }
    // Scale and mask (row past the sample, key past the tile, key after the query), new row max.
    float tile_max[2] = {-INFINITY, -INFINITY};
    BP_UNROLL
    for (int n = 0; n < kKeyTiles; ++n) BP_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int r = i / 2, j = n * 8 + 2 * t + i % 2;
      const bool seen = row0 + g + 8 * r < tile.rows && j < keys && attention_visible(pos[r], j0 + j, window);
      s[n][i] = seen ? attention_capped(scale * s[n][i], cap) : -INFINITY;
      tile_max[r] = fmaxf(tile_max[r], s[n][i]);
    }
    float alpha[2];
    BP_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(tile_max[r]));
      alpha[r] = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);  // 0 on the first tile (m = −inf)
      m[r] = m_new;
    }
    // P = exp(S − m) (0 where masked or the row has seen nothing), the lane's part of the row sums.
    float tile_sum[2] = {0.0f, 0.0f};
    BP_UNROLL
    for (int n = 0; n < kKeyTiles; ++n) BP_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int r = i / 2;
      const float p = m[r] == -INFINITY ? 0.0f : expf(s[n][i] - m[r]);  // masked: exp(−inf) = 0
      s[n][i] = p;
      tile_sum[r] += p;
    }
    BP_UNROLL
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + tile_sum[r];
    BP_UNROLL
    for (int n = 0; n < kOutTiles; ++n) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }
    // O += P·V: k steps of 16 keys, P's A operand from S's accumulators 2·ks and 2·ks + 1.
    BP_UNROLL
    for (int ks = 0; ks < kFa2Rows / 16; ++ks) {
      if (ks * 16 >= visible) break;  // P = 0 from here on
      const float* s0 = s[2 * ks];
      const float* s1 = s[2 * ks + 1];
      const uint32_t pa[4] = {pack_bf16x2(s0[0], s0[1]), pack_bf16x2(s0[2], s0[3]), pack_bf16x2(s1[0], s1[1]),
                              pack_bf16x2(s1[2], s1[3])};
      BP_UNROLL
      for (int n = 0; n < kOutTiles; ++n) {
        if (n * 8 >= d) break;
        const bf16* vrow = Vt + (n * 8 + g) * ldv + ks * 16 + 2 * t;  // dim n·8 + g, keys 2t, 2t + 1
        const uint32_t vb[2] = {load_bf16x2(vrow), load_bf16x2(vrow + 8)};
        mma_m16n8k16_bf16(acc[n], pa, vb, acc[n]);
      }
    }
  }
  if (!warp_has_rows) return;
  float row_sum[2];
  BP_UNROLL
  for (int r = 0; r < 2; ++r) row_sum[r] = quad_sum(l[r]);
  BP_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    if (row >= tile.rows) continue;
    const int64_t at = (first_row + row) * q_stride + int64_t{h} * d;
    T* out = o + at;
    bf16* out16 = o16 ? o16 + at : nullptr;
    BP_UNROLL
    for (int n = 0; n < kOutTiles; ++n) {
      if (n * 8 >= d) break;
      store_with_bf16(out, out16, n * 8 + 2 * t, acc[n][2 * r] / row_sum[r]);
      store_with_bf16(out, out16, n * 8 + 2 * t + 1, acc[n][2 * r + 1] / row_sum[r]);
    }
    if (lse && t == 0) lse[int64_t{h} * T_tokens + first_row + row] = m[r] + logf(row_sum[r]);  // l >= 1
  }
#else
  __trap();  // never launched below compute capability 8.0 (attention_forward)
#endif
}

// dK/dV in the same style (the backward's step 2, attention.cuh): one block per (64-key tile, KV
// head), warp w owning keys 16w..16w + 15, whose K and V rows stay in registers as A operands and
// whose dK and dV accumulators (d/8 m16n8 tiles each) stay in registers for the whole walk over
// every query head of the group and every query tile at or after the key tile (a fixed order).
// Per query tile the block stages Q and dO in bf16 twice, by row [64][d + 8] (the B operands of
// Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ) and transposed [d][64 + 8] (the B operands of dV += Pᵀ·dO and
// dK += dSᵀ·Q), and lse, delta [64]. Pᵀ = exp(scale·Sᵀ − lse) and dSᵀ = Pᵀ∘(dPᵀ − delta) are
// computed on the accumulators and packed into the A operands of the two updates. Capped at head
// dim kFa2BackwardMaxHeadDim: K, V (d/4 words each), dK, dV (d/2 floats each), Sᵀ and dPᵀ (32
// each) hold 1.5·d + 64 values a thread: 160 at d = 64 (ptxas: 222 registers, no spill), 256 at
// d = 128, past a thread's 255; wider heads keep attention_tc.cuh's dK/dV kernel.
// dQ has its own kernel below (one writer per element, no atomics).
constexpr int kFa2BackwardMaxHeadDim = 64;

// Q, dO by row and transposed (bf16), then lse and delta (f32).
inline size_t attention_fa2_dkdv_shared_bytes(int d) {
  return (2 * size_t(kFa2Rows) * (d + 8) + 2 * size_t(d) * (kFa2Rows + 8)) * 2 + 2 * kFa2Rows * sizeof(float);
}

template <class T, int kMaxD>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_backward_dkdv_fa2_kernel(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                                       const float* delta, const int32_t* cu, int64_t n_samples, int64_t T_tokens,
                                       int n_heads, int group, int d, float scale, int64_t window, float cap, T* dk,
                                       T* dv, bf16* dv16) {
#if BP_CUDA_ARCH_HAS_BF16_MMA
  constexpr int kQueryTiles = kFa2Rows / 8, kSteps = kMaxD / 16, kOutTiles = kMaxD / 8;
  AttentionTile tile;  // a tile of keys
  if (!find_attention_tile(cu, n_samples, kFa2Rows, blockIdx.x, false, tile)) return;
  BP_TC_SHARED(fa2_smem);
  const int ld = d + 8, ldt = kFa2Rows + 8;
  bf16* Qs = reinterpret_cast<bf16*>(fa2_smem);
  bf16* dOs = Qs + kFa2Rows * ld;
  bf16* Qt = dOs + kFa2Rows * ld;
  bf16* dOt = Qt + d * ldt;
  float* lse_s = reinterpret_cast<float*>(dOt + d * ldt);
  float* delta_s = lse_s + kFa2Rows;
  const int g_kv = blockIdx.y, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int key0 = threadIdx.x / 32 * 16;  // the warp's first key in the tile
  const int64_t q_stride = int64_t{n_heads} * d, kv_stride = int64_t{n_heads / group} * d;
  const int64_t first_key = tile.base + tile.start;
  const bool warp_has_keys = key0 < tile.rows;  // the same for every lane of the warp

  uint32_t ka[kSteps][4], va[kSteps][4];
  const int64_t kv_at = first_key * kv_stride + int64_t{g_kv} * d;
  fa2_load_a_pair<kSteps>(ka, va, k + kv_at, v + kv_at, kv_stride, key0, tile.rows, d);
  float dk_acc[kOutTiles][4], dv_acc[kOutTiles][4];
  BP_UNROLL
  for (int n = 0; n < kOutTiles; ++n)
    for (int i = 0; i < 4; ++i) dk_acc[n][i] = dv_acc[n][i] = 0.0f;
  const int64_t key_pos[2] = {tile.start + key0 + g, tile.start + key0 + g + 8};

  const int64_t query_end = attention_query_end(tile.start + tile.rows - 1, tile.len, window);
  for (int h = g_kv * group; h < (g_kv + 1) * group; ++h) {
    for (int64_t i0 = tile.start; i0 < query_end; i0 += kFa2Rows) {
      const int rows = static_cast<int>(tile.len - i0 < kFa2Rows ? tile.len - i0 : kFa2Rows);
      __syncthreads();  // the previous query tile's readers are done
      const int64_t q_at = (tile.base + i0) * q_stride + int64_t{h} * d;
      fa2_stage(Qs, Qt, q + q_at, q_stride, rows, d);
      fa2_stage(dOs, dOt, dout + q_at, q_stride, rows, d);
      for (int r = threadIdx.x; r < kFa2Rows; r += blockDim.x) {
        lse_s[r] = r < rows ? lse[int64_t{h} * T_tokens + tile.base + i0 + r] : 0.0f;
        delta_s[r] = r < rows ? delta[int64_t{h} * T_tokens + tile.base + i0 + r] : 0.0f;
      }
      __syncthreads();
      if (!warp_has_keys) continue;  // warp-uniform: no mma
      // Queries before `first_seen` come before every key of the warp (causal; only in the diagonal
      // tile, where it is 16w): their products are skipped, their P and dS are 0.
      const int64_t before = tile.start + key0 - i0;
      const int first_seen = before > 0 ? static_cast<int>(before) : 0;
      float p[kQueryTiles][4], ds[kQueryTiles][4];  // Sᵀ then Pᵀ; dPᵀ then dSᵀ (keys × queries)
      BP_UNROLL
      for (int n = 0; n < kQueryTiles; ++n) {
        for (int i = 0; i < 4; ++i) p[n][i] = ds[n][i] = 0.0f;
        if (n * 8 >= rows || n * 8 + 8 <= first_seen) continue;
        const bf16* q_row = Qs + (n * 8 + g) * ld + 2 * t;  // query n·8 + g, dims 2t, 2t + 1
        const bf16* do_row = dOs + (n * 8 + g) * ld + 2 * t;
        BP_UNROLL
        for (int st = 0; st < kSteps; ++st) {
          if (st * 16 >= d) break;
          const uint32_t qb[2] = {load_bf16x2(q_row + st * 16), load_bf16x2(q_row + st * 16 + 8)};
          const uint32_t dob[2] = {load_bf16x2(do_row + st * 16), load_bf16x2(do_row + st * 16 + 8)};
          mma_m16n8k16_bf16(p[n], ka[st], qb, p[n]);
          mma_m16n8k16_bf16(ds[n], va[st], dob, ds[n]);
        }
      }
      BP_UNROLL
      for (int n = 0; n < kQueryTiles; ++n) BP_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int r = i / 2, j = n * 8 + 2 * t + i % 2;  // key row g + 8r of the warp, query j
        const bool seen = key0 + g + 8 * r < tile.rows && j < rows && attention_visible(i0 + j, key_pos[r], window);
        const float sc = attention_capped(scale * p[n][i], cap);
        const float pv = seen ? expf(sc - lse_s[j]) : 0.0f;
        ds[n][i] = seen ? pv * (ds[n][i] - delta_s[j]) * attention_cap_slope(sc, cap) : 0.0f;
        p[n][i] = pv;
      }
      // dV += Pᵀ·dO, dK += dSᵀ·Q: k steps of 16 queries, the A operands from the accumulators.
      BP_UNROLL
      for (int ks = 0; ks < kFa2Rows / 16; ++ks) {
        if (ks * 16 >= rows) break;
        if (ks * 16 + 16 <= first_seen) continue;
        uint32_t pa[4], dsa[4];
        fa2_c_to_a(pa, p[2 * ks], p[2 * ks + 1]);
        fa2_c_to_a(dsa, ds[2 * ks], ds[2 * ks + 1]);
        fa2_mma_by_col<kOutTiles>(dv_acc, pa, dOt, ks, d);
        fa2_mma_by_col<kOutTiles>(dk_acc, dsa, Qt, ks, d);
      }
    }
  }
  if (!warp_has_keys) return;
  BP_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + g + 8 * r;
    if (key >= tile.rows) continue;
    const int64_t off = (first_key + key) * kv_stride + int64_t{g_kv} * d + 2 * t;
    fa2_store_row<kOutTiles>(dk + off, dk_acc, r, scale, d);
    fa2_store_row<kOutTiles>(dv + off, dv_acc, r, 1.0f, d, dv16 ? dv16 + off : nullptr);
  }
#else
  __trap();  // never launched below compute capability 8.0 (attention_backward)
#endif
}

// dQ in the same style (the backward's step 3, attention.cuh): one block per (64-query tile, query
// head) walking the key tiles 0..diagonal like the forward. Warp w keeps its 16 query rows' Q and
// dO operands (A fragments), their lse and delta, and the dQ accumulator (d/8 m16n8 tiles, f32) in
// registers for the whole walk. Per key tile the block stages K by row [64][d + 8] (the B operand
// of S = Q·Kᵀ), V by row (of dP = dO·Vᵀ) and K transposed [d][64 + 8] (of dQ += dS·K), bf16. A
// warp takes the tile's keys 16 at a time: S and dP of those keys (2 m16n8 tiles each), then
// P = exp(scale·S − lse) and dS = P∘(dP − delta) on the accumulators, dS packed straight into the A
// operand of dQ += dS·K (the C→A reuse of the forward's P). Sixteen keys at a time rather than 64
// keep S and dP at 16 values a thread: with Q, dO (d/4 words each) and dQ (d/2) that is d + 16
// values, 144 at d = 128 (ptxas: 202 registers for sm_90, 197 for sm_80..89, 124..128 at
// d <= 64, no spill), so the cap is the forward's; d = 256 keeps attention_tc.cuh's dQ kernel. The sum over keys runs
// in key order (tiles, then 16-key steps): bit-identical run to run, one writer per element.
constexpr int kFa2DqMaxHeadDim = 128;

// K by row, V by row, K transposed (bf16): 52 KiB at d = 128, past the default 48 (the launcher
// opts in, as for the wide wmma kernels).
inline size_t attention_fa2_dq_shared_bytes(int d) {
  return (2 * size_t(kFa2Rows) * (d + 8) + size_t(d) * (kFa2Rows + 8)) * 2;
}

template <class T, int kMaxD>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_backward_dq_fa2_kernel(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                                     const float* delta, const int32_t* cu, int64_t n_samples, int64_t T_tokens,
                                     int n_heads, int group, int d, float scale, int64_t window, float cap, T* dq) {
#if BP_CUDA_ARCH_HAS_BF16_MMA
  constexpr int kSteps = kMaxD / 16, kOutTiles = kMaxD / 8;
  AttentionTile tile;
  if (!find_attention_tile(cu, n_samples, kFa2Rows, blockIdx.x, true, tile)) return;  // the whole block alike
  BP_TC_SHARED(fa2_smem);
  const int ld = d + 8;
  bf16* Ks = reinterpret_cast<bf16*>(fa2_smem);
  bf16* Vs = Ks + kFa2Rows * ld;
  bf16* Kt = Vs + kFa2Rows * ld;
  const int h = blockIdx.y, g_kv = h / group, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int row0 = threadIdx.x / 32 * 16;  // the warp's rows in the tile
  const int64_t q_stride = int64_t{n_heads} * d, kv_stride = int64_t{n_heads / group} * d;
  const int64_t first_row = tile.base + tile.start;  // the tile's first token
  const bool warp_has_rows = row0 < tile.rows;       // the same for every lane of the warp

  uint32_t qa[kSteps][4], doa[kSteps][4];
  const int64_t q_at = first_row * q_stride + int64_t{h} * d;
  fa2_load_a_pair<kSteps>(qa, doa, q + q_at, dout + q_at, q_stride, row0, tile.rows, d);
  float acc[kOutTiles][4];
  BP_UNROLL
  for (int n = 0; n < kOutTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float row_lse[2], row_delta[2];  // rows g, g + 8 of the warp
  int64_t pos[2];
  BP_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    const int64_t at = int64_t{h} * T_tokens + first_row + row;
    row_lse[r] = row < tile.rows ? lse[at] : 0.0f;
    row_delta[r] = row < tile.rows ? delta[at] : 0.0f;
    pos[r] = tile.start + row;
  }

  const int64_t key_end = tile.start + tile.rows;  // causal: later keys are seen by no row here
  for (int64_t j0 = attention_first_key_tile(tile.start, window, kFa2Rows); j0 < key_end; j0 += kFa2Rows) {
    const int keys = static_cast<int>(key_end - j0 < kFa2Rows ? key_end - j0 : kFa2Rows);
    __syncthreads();  // the previous tile's readers of Ks, Vs, Kt are done
    const int64_t kv_at = (tile.base + j0) * kv_stride + int64_t{g_kv} * d;
    fa2_stage(Ks, Kt, k + kv_at, kv_stride, keys, d);
    fa2_stage(Vs, nullptr, v + kv_at, kv_stride, keys, d);
    __syncthreads();
    if (!warp_has_rows) continue;  // warp-uniform: no mma
    // Keys from `visible` on are after every row of the warp or past the tile (masked, skipped).
    const int64_t after_last_row = tile.start + row0 + 16 - j0;
    const int visible = static_cast<int>(after_last_row < keys ? after_last_row : keys);
    BP_UNROLL
    for (int ks = 0; ks < kFa2Rows / 16; ++ks) {
      if (ks * 16 >= visible) break;  // dS = 0 from here on
      // S and dP of keys 16ks..16ks + 15: tiles of 8 keys, k steps over d.
      float s[2][4], dp[2][4];
      BP_UNROLL
      for (int half = 0; half < 2; ++half) {
        for (int i = 0; i < 4; ++i) s[half][i] = dp[half][i] = 0.0f;
        const int key = ks * 16 + half * 8;
        if (key >= visible) continue;
        const int at = (key + g) * ld + 2 * t;  // key + g, dims 2t, 2t + 1 of each step
        BP_UNROLL
        for (int st = 0; st < kSteps; ++st) {
          if (st * 16 >= d) break;
          const uint32_t kb[2] = {load_bf16x2(Ks + at + st * 16), load_bf16x2(Ks + at + st * 16 + 8)};
          const uint32_t vb[2] = {load_bf16x2(Vs + at + st * 16), load_bf16x2(Vs + at + st * 16 + 8)};
          mma_m16n8k16_bf16(s[half], qa[st], kb, s[half]);
          mma_m16n8k16_bf16(dp[half], doa[st], vb, dp[half]);
        }
      }
      // dS = P∘(dP − delta) in place of dP, 0 where masked (row past the sample, key past the
      // tile, key after the query).
      BP_UNROLL
      for (int half = 0; half < 2; ++half) BP_UNROLL
      for (int i = 0; i < 4; ++i) {
        const int r = i / 2, j = ks * 16 + half * 8 + 2 * t + i % 2;
        const bool seen = row0 + g + 8 * r < tile.rows && j < keys && attention_visible(pos[r], j0 + j, window);
        const float sc = attention_capped(scale * s[half][i], cap);
        const float p = seen ? expf(sc - row_lse[r]) : 0.0f;
        dp[half][i] = seen ? p * (dp[half][i] - row_delta[r]) * attention_cap_slope(sc, cap) : 0.0f;
      }
      // dQ += dS·K over these 16 keys: the A operand from the two dS tiles.
      uint32_t dsa[4];
      fa2_c_to_a(dsa, dp[0], dp[1]);
      fa2_mma_by_col<kOutTiles>(acc, dsa, Kt, ks, d);
    }
  }
  if (!warp_has_rows) return;
  BP_UNROLL
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    if (row >= tile.rows) continue;
    fa2_store_row<kOutTiles>(dq + (first_row + row) * q_stride + int64_t{h} * d + 2 * t, acc, r, scale, d);
  }
#else
  __trap();  // never launched below compute capability 8.0 (attention_backward)
#endif
}

}  // namespace bp::BP_CUDA_NS
