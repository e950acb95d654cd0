// FlashAttention-2-style forward for cards of compute capability >= 8.0 and head dims that are
// multiples of 16 up to kFa2MaxHeadDim (attention.cuh: contract, layouts, tile walk; the launcher
// picks this kernel by attention_uses_fa2_forward). Included by attention.cuh only.
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
// Why a cap: the registers of a thread hold d/4 words of Q, d/2 floats of O and 32 of S; at
// d = 128 that is ~130 live values, at d = 256 ~260, past the 255 a thread can have (it would
// spill to local memory); d = 256 keeps attention_tc.cuh's forward. The kernel is compiled for
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

// The A operand (rows g, g + 8 of the warp's 16; k step kk) of one head's query rows, straight from
// global memory; rows past `rows` are zero.
template <class T>
__device__ __forceinline__ uint32_t fa2_query_pair(const T* q, int64_t stride, int row, int rows, int col) {
  if (row >= rows) return 0u;
  return pack_bf16x2(load_f32(q[row * stride + col]), load_f32(q[row * stride + col + 1]));
}

// K rows [0, keys) → Ks [64][d + 8], V rows → Vt [d][64 + 8] transposed, bf16, zero past `keys`.
template <class T>
__device__ __forceinline__ void fa2_load_kv(bf16* Ks, bf16* Vt, const T* k, const T* v, int64_t stride, int keys,
                                            int d) {
  const int ldk = d + 8, ldv = kFa2Rows + 8;
  for (int e = threadIdx.x; e < kFa2Rows * d; e += blockDim.x) {
    const int j = e / d, c = e % d;
    const bool in = j < keys;
    Ks[j * ldk + c] = __float2bfloat16(in ? load_f32(k[j * stride + c]) : 0.0f);
    Vt[c * ldv + j] = __float2bfloat16(in ? load_f32(v[j * stride + c]) : 0.0f);
  }
}

// Max (or sum) of a row's value over the 4 lanes of its quad.
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
                                 int64_t T_tokens, int n_heads, int group, int d, float scale, T* o, float* lse) {
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
  for (int s = 0; s < kSteps; ++s) {
    if (s * 16 >= d) break;
    const int c = s * 16 + 2 * t;
    qa[s][0] = fa2_query_pair(q_head, q_stride, row0 + g, tile.rows, c);
    qa[s][1] = fa2_query_pair(q_head, q_stride, row0 + g + 8, tile.rows, c);
    qa[s][2] = fa2_query_pair(q_head, q_stride, row0 + g, tile.rows, c + 8);
    qa[s][3] = fa2_query_pair(q_head, q_stride, row0 + g + 8, tile.rows, c + 8);
  }
  float acc[kOutTiles][4];
  BP_UNROLL
  for (int n = 0; n < kOutTiles; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g + 8: running max, own-lane sum
  const int64_t pos[2] = {tile.start + row0 + g, tile.start + row0 + g + 8};
  const bool warp_has_rows = row0 < tile.rows;  // the same for every lane of the warp

  const int64_t key_end = tile.start + tile.rows;  // causal: later keys are seen by no row here
  for (int64_t j0 = 0; j0 < key_end; j0 += kFa2Rows) {
    const int keys = static_cast<int>(key_end - j0 < kFa2Rows ? key_end - j0 : kFa2Rows);
    __syncthreads();  // the previous tile's readers of Ks, Vt are done
    const int64_t kv_at = (tile.base + j0) * kv_stride + int64_t{g_kv} * d;
    fa2_load_kv(Ks, Vt, k + kv_at, v + kv_at, kv_stride, keys, d);
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
      const bool seen = row0 + g + 8 * r < tile.rows && j < keys && j0 + j <= pos[r];
      s[n][i] = seen ? scale * s[n][i] : -INFINITY;
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
    T* out = o + (first_row + row) * q_stride + int64_t{h} * d;
    BP_UNROLL
    for (int n = 0; n < kOutTiles; ++n) {
      if (n * 8 >= d) break;
      out[n * 8 + 2 * t] = store_from_f32<T>(acc[n][2 * r] / row_sum[r]);
      out[n * 8 + 2 * t + 1] = store_from_f32<T>(acc[n][2 * r + 1] / row_sum[r]);
    }
    if (lse && t == 0) lse[int64_t{h} * T_tokens + first_row + row] = m[r] + logf(row_sum[r]);  // l >= 1
  }
#else
  __trap();  // never launched below compute capability 8.0 (attention_uses_fa2_forward)
#endif
}

}  // namespace bp::BP_CUDA_NS
