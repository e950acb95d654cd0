// Tensor-core variant of the CUDA attention kernels (attention.cuh: contract, layouts, tiling,
// determinism), for cards of compute capability >= 8.0 and head dims that are multiples of 16. The
// forward here runs only above kFa2MaxHeadDim (d = 256) and the dK/dV kernel only above
// kFa2BackwardMaxHeadDim (64): attention_fa2.cuh's register-resident kernels take the head dims up
// to them. The dQ kernel runs for every head dim.
// Included by attention.cuh only, between its kernels and its launchers (which pick these kernels
// by attention_uses_tensor_cores): it uses that file's tile walk and AttentionPass.
//
// Same blocks, same walks, same single writer per output element as the scalar kernels; what
// changes is the tile products. The Q, K, V, dO tiles are kept in shared memory as bf16 (converted
// from the stored T on load), and so are P and dS once computed; each product (S = Q·Kᵀ, O += P·V,
// dP = dO·Vᵀ, dV += Pᵀ·dO, dK += dSᵀ·Q, dQ += dS·K) is one block_mma: warp w of the block owns the
// 16×16 output tiles w, w + 4, ... of the product and runs its k loop in steps of 16 with
// wmma::mma_sync (bf16 inputs, f32 accumulation), loading the accumulator from and storing it to
// f32 shared memory. Softmax, masks, the rescale of O, lse, delta and dS = P∘(dP − delta) stay
// scalar f32, as in attention.cuh. So only the products' inputs are rounded to bf16 (Q, K, V, dO,
// P, dS): with bf16 storage Q, K, V, dO already are, and the f32 path differs from the scalar
// kernels by bf16-rounding-sized amounts.
//
// Shared memory per block (bf16 tiles with row stride d + 8 and B + 8, f32 with d + 4 and B + 4:
// wmma wants leading dimensions of a multiple of 16 bytes and 32-byte aligned tiles; the padding
// also spreads the rows over the banks; every buffer starts 128-byte aligned):
//   forward  Q, K, V bf16 [B, d]; P bf16 [B, B]; O f32 [B, d]; S f32 [B, B]; 3 row stats
//   dQ       Q, dO, K, V bf16; dS bf16; dQ f32; S, dP f32; lse, delta
//   dK/dV    Q, dO, K, V bf16; P, dS bf16; dK, dV f32; S, dP f32; lse, delta
// B (rows of a query and of a key tile) is the largest of 64, 32, 16 whose block fits
// kAttentionTcSharedBudget (64 KiB; above 48 KiB the launch opts in, which every card of compute
// capability >= 8.0 allows up to at least 99 KiB): d = 64: 32 rows in all three passes (30, 39,
// 50 KiB); d = 128: forward and dQ 32 (50, 63 KiB), dK/dV 16 (38 KiB); d = 16: forward 64; d = 256:
// 16 (dK/dV 71 KiB). The rows of a 16×16 warp tile are the reason for multiples of 16.
// The budget is untuned: no GPU has measured it.
// Blocks are 128 threads (4 warps); B is a multiple of 16 because the wmma tiles are 16×16.
#pragma once

#include <type_traits>

#include "backend/cuda/cuda_wmma.cuh"

namespace bp::BP_CUDA_NS {

// Byte offsets of the buffers of one block (layout above), and their row strides in elements.
struct TcAttentionLayout {
  int ld16, ld16s, ld32, ld32s;  // bf16 [·, d], bf16 [·, B], f32 [·, d], f32 [·, B]
  size_t q, k, v, dout, p, ds, acc, acc2, s, dp, stats, bytes;
};

__host__ __device__ __forceinline__ TcAttentionLayout tc_attention_layout(AttentionPass pass, int B, int d) {
  TcAttentionLayout L{};
  L.ld16 = d + 8;
  L.ld16s = B + 8;
  L.ld32 = d + 4;
  L.ld32s = B + 4;
  const bool backward = pass != AttentionPass::Forward, kv = pass == AttentionPass::GradKV;
  size_t at = 0;
  const auto take = [&at](size_t bytes) {
    const size_t start = at;
    at += (bytes + 127) / 128 * 128;
    return start;
  };
  const size_t tile16 = size_t(B) * L.ld16 * 2, score16 = size_t(B) * L.ld16s * 2;
  const size_t tile32 = size_t(B) * L.ld32 * 4, score32 = size_t(B) * L.ld32s * 4;
  L.q = take(tile16);
  L.k = take(tile16);
  L.v = take(tile16);
  L.dout = backward ? take(tile16) : 0;
  L.p = pass != AttentionPass::GradQ ? take(score16) : 0;
  L.ds = backward ? take(score16) : 0;
  L.acc = take(tile32);
  L.acc2 = kv ? take(tile32) : 0;
  L.s = take(score32);
  L.dp = backward ? take(score32) : 0;
  L.stats = take(size_t(B) * (backward ? 2 : 3) * 4);
  L.bytes = at;
  return L;
}

inline size_t attention_tc_shared_bytes(AttentionPass pass, int B, int d) {
  return tc_attention_layout(pass, B, d).bytes;
}

// What a block's tiles may take before B drops: above 48 KiB the kernel opts in (every card of
// compute capability >= 8.0 gives a block at least 99 KiB). 64 KiB buys 32-row tiles up to d = 128
// (16-row tiles leave 3 of the 4 warps without a 16×16 tile of S = Q·Kᵀ); untuned, no GPU here.
constexpr size_t kAttentionTcSharedBudget = 64 * 1024;

inline int attention_tc_tile_rows(AttentionPass pass, int d) {
  for (int B : {64, 32})
    if (attention_tc_shared_bytes(pass, B, d) <= kAttentionTcSharedBudget) return B;
  return 16;
}

#if BP_CUDA_ARCH_HAS_BF16_MMA

// Rows [0, rows) of one head (d columns, source row stride `stride`) as bf16 into a tile of B rows
// with row stride ld; rows past `rows` are zero.
template <class T>
__device__ __forceinline__ void load_tc_tile(bf16* dst, const T* src, int64_t stride, int rows, int B, int d, int ld) {
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    dst[r * ld + c] = __float2bfloat16(r < rows ? load_f32(src[r * stride + c]) : 0.0f);
  }
}

// C[M×N] (f32, ldc) = [C +] A·B over depth K, M, N, K multiples of 16; A is [M×K], stored row-major
// (A[m·lda + k]) or, with LayoutA = col_major, transposed (A[k·lda + m]); B is [K×N], row-major
// (B[k·ldb + n]) or col_major (B[n·ldb + k]). Warp w computes the output tiles w, w + warps, ... in
// row-major tile order; each sums its k steps in order (one writer, a fixed order).
template <class LayoutA, class LayoutB>
__device__ __forceinline__ void block_mma(float* C, int ldc, const bf16* A, int lda, const bf16* B, int ldb, int M,
                                          int N, int K, bool accumulate) {
  namespace wmma = nvcuda::wmma;
  constexpr bool a_rows = std::is_same_v<LayoutA, wmma::row_major>, b_rows = std::is_same_v<LayoutB, wmma::row_major>;
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32, tiles_n = N / 16;
  for (int t = warp; t < M / 16 * tiles_n; t += warps) {  // the same count for every lane of a warp
    const int m0 = t / tiles_n * 16, n0 = t % tiles_n * 16;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    if (accumulate)
      wmma::load_matrix_sync(acc, C + m0 * ldc + n0, ldc, wmma::mem_row_major);
    else
      wmma::fill_fragment(acc, 0.0f);
    for (int k0 = 0; k0 < K; k0 += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, LayoutA> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, LayoutB> b;
      wmma::load_matrix_sync(a, A + (a_rows ? m0 * lda + k0 : k0 * lda + m0), lda);
      wmma::load_matrix_sync(b, B + (b_rows ? k0 * ldb + n0 : n0 * ldb + k0), ldb);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(C + m0 * ldc + n0, acc, ldc, wmma::mem_row_major);
  }
}

__device__ __forceinline__ int round_up16(int n) {
  return (n + 15) / 16 * 16;
}

// The block's buffers, from its dynamic shared memory (128-byte aligned on a GPU and in the
// simulation).
struct TcTiles {
  bf16 *Q, *K, *V, *dO, *P, *dS;
  float *acc, *acc2, *S, *dP, *stats;
};
__device__ __forceinline__ TcTiles tc_tiles(unsigned char* smem, const TcAttentionLayout& L) {
  auto b16 = [smem](size_t at) { return reinterpret_cast<bf16*>(smem + at); };
  auto f32 = [smem](size_t at) { return reinterpret_cast<float*>(smem + at); };
  return {b16(L.q),   b16(L.k),    b16(L.v), b16(L.dout), b16(L.p),    b16(L.ds),
          f32(L.acc), f32(L.acc2), f32(L.s), f32(L.dp),   f32(L.stats)};
}

#ifdef __CUDACC__
#define BP_TC_SHARED(name) extern __shared__ __align__(128) unsigned char name[]
#else
#define BP_TC_SHARED(name) unsigned char* name = static_cast<unsigned char*>(::bp::sim::sim_dynamic_shared())
#endif

// The backward's operands of one query tile (attention.cuh's load_backward_query_tile in bf16).
template <class T>
__device__ __forceinline__ void load_tc_query_tile(const TcTiles& sh, const TcAttentionLayout& L, const T* q,
                                                   const T* dout, const float* lse, const float* delta, int64_t row0,
                                                   int rows, int h, int64_t q_stride, int64_t T_tokens, int B, int d) {
  const int64_t at = row0 * q_stride + int64_t{h} * d;
  load_tc_tile(sh.Q, q + at, q_stride, rows, B, d, L.ld16);
  load_tc_tile(sh.dO, dout + at, q_stride, rows, B, d, L.ld16);
  for (int r = threadIdx.x; r < B; r += blockDim.x) {
    sh.stats[r] = r < rows ? lse[int64_t{h} * T_tokens + row0 + r] : 0.0f;
    sh.stats[B + r] = r < rows ? delta[int64_t{h} * T_tokens + row0 + r] : 0.0f;
  }
}

// S = Q·Kᵀ and dP = dO·Vᵀ of the loaded tiles, then, per visible (row r, key j) with r a query row
// at position i0 + r and j a key at position j0 + j: P = exp(cap(scale·S) − lse), dS = P∘(dP −
// delta)·cap', both as bf16 (P only when the pass keeps it); invisible pairs (attention_visible)
// are 0. Ends with a barrier.
__device__ __forceinline__ void tc_probs_and_grads(const TcTiles& sh, const TcAttentionLayout& L, int B, int d,
                                                   int rows, int keys, int64_t i0, int64_t j0, float scale,
                                                   int64_t window, float cap, bool keep_p) {
  namespace wmma = nvcuda::wmma;
  block_mma<wmma::row_major, wmma::col_major>(sh.S, L.ld32s, sh.Q, L.ld16, sh.K, L.ld16, B, B, d, false);
  block_mma<wmma::row_major, wmma::col_major>(sh.dP, L.ld32s, sh.dO, L.ld16, sh.V, L.ld16, B, B, d, false);
  __syncthreads();
  for (int e = threadIdx.x; e < B * B; e += blockDim.x) {
    const int r = e / B, j = e % B;
    float p = 0.0f, ds = 0.0f;
    if (r < rows && j < keys && attention_visible(i0 + r, j0 + j, window)) {
      const float s = attention_capped(scale * sh.S[r * L.ld32s + j], cap);
      p = expf(s - sh.stats[r]);
      ds = p * (sh.dP[r * L.ld32s + j] - sh.stats[B + r]) * attention_cap_slope(s, cap);
    }
    if (keep_p) sh.P[r * L.ld16s + j] = __float2bfloat16(p);
    sh.dS[r * L.ld16s + j] = __float2bfloat16(ds);
  }
  __syncthreads();
}

#endif  // BP_CUDA_ARCH_HAS_BF16_MMA

// Forward (attention.cuh's forward, tile products on tensor cores).
template <class T>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_forward_tc_kernel(const T* q, const T* k, const T* v, const int32_t* cu, int64_t n_samples,
                                int64_t T_tokens, int n_heads, int group, int d, int B, float scale, int64_t window,
                                float cap, T* o, bf16* o16, float* lse) {
#if BP_CUDA_ARCH_HAS_BF16_MMA
  namespace wmma = nvcuda::wmma;
  AttentionTile tile;
  if (!find_attention_tile(cu, n_samples, B, blockIdx.x, true, tile)) return;  // the whole block alike
  BP_TC_SHARED(tc_smem);
  const TcAttentionLayout L = tc_attention_layout(AttentionPass::Forward, B, d);
  const TcTiles sh = tc_tiles(tc_smem, L);
  float *Os = sh.acc, *Ss = sh.S, *row_max = sh.stats, *row_sum = row_max + B;
  const int h = blockIdx.y, g = h / group;
  const int64_t q_stride = int64_t{n_heads} * d, kv_stride = int64_t{n_heads / group} * d;

  load_tc_tile(sh.Q, q + (tile.base + tile.start) * q_stride + int64_t{h} * d, q_stride, tile.rows, B, d, L.ld16);
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) Os[e / d * L.ld32 + e % d] = 0.0f;
  for (int r = threadIdx.x; r < B; r += blockDim.x) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;
  }
  const int64_t key_end = tile.start + tile.rows;  // causal: later keys are seen by no row here
  for (int64_t j0 = attention_first_key_tile(tile.start, window, B); j0 < key_end; j0 += B) {
    const int keys = static_cast<int>(key_end - j0 < B ? key_end - j0 : B);
    __syncthreads();  // the previous tile's readers of K, V, P are done (first time: Q is loaded)
    const T* k_at = k + (tile.base + j0) * kv_stride + int64_t{g} * d;
    load_tc_tile(sh.K, k_at, kv_stride, keys, B, d, L.ld16);
    load_tc_tile(sh.V, v + (k_at - k), kv_stride, keys, B, d, L.ld16);
    __syncthreads();
    block_mma<wmma::row_major, wmma::col_major>(Ss, L.ld32s, sh.Q, L.ld16, sh.K, L.ld16, B, B, d, false);
    __syncthreads();
    // Online softmax, one thread per row (attention.cuh), P as bf16 for the P·V product, and the
    // row's O accumulator rescaled here (its mma owner runs after the barrier below).
    for (int r = threadIdx.x; r < B; r += blockDim.x) {
      const float* srow = Ss + r * L.ld32s;
      bf16* prow = sh.P + r * L.ld16s;
      const float m_old = row_max[r];
      float m = m_old;
      for (int j = 0; j < keys; ++j)
        if (r < tile.rows && attention_visible(tile.start + r, j0 + j, window))
          m = fmaxf(m, attention_capped(scale * srow[j], cap));
      float alpha = 1.0f, sum = 0.0f;
      if (m != -INFINITY) alpha = expf(m_old - m);  // 0 on the first tile (m_old = −inf)
      for (int j = 0; j < B; ++j) {
        const bool seen = m != -INFINITY && j < keys && attention_visible(tile.start + r, j0 + j, window);
        const float p = seen ? expf(attention_capped(scale * srow[j], cap) - m) : 0.0f;
        prow[j] = __float2bfloat16(p);
        sum += p;
      }
      row_max[r] = m;
      row_sum[r] = row_sum[r] * alpha + sum;
      for (int c = 0; c < d; ++c) Os[r * L.ld32 + c] *= alpha;
    }
    __syncthreads();
    block_mma<wmma::row_major, wmma::row_major>(Os, L.ld32, sh.P, L.ld16s, sh.V, L.ld16, B, d, round_up16(keys), true);
  }
  __syncthreads();  // the mma owners of O are not the threads that store it
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    if (r < tile.rows)
      store_with_bf16(o, o16, (tile.base + tile.start + r) * q_stride + int64_t{h} * d + c,
                      Os[r * L.ld32 + c] / row_sum[r]);
  }
  if (lse)
    for (int r = threadIdx.x; r < tile.rows; r += blockDim.x)
      lse[int64_t{h} * T_tokens + tile.base + tile.start + r] = row_max[r] + logf(row_sum[r]);  // l >= 1
#else
  __trap();  // never launched below compute capability 8.0 (attention_uses_tensor_cores)
#endif
}

template <class T>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_backward_dq_tc_kernel(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                                    const float* delta, const int32_t* cu, int64_t n_samples, int64_t T_tokens,
                                    int n_heads, int group, int d, int B, float scale, int64_t window, float cap,
                                    T* dq) {
#if BP_CUDA_ARCH_HAS_BF16_MMA
  namespace wmma = nvcuda::wmma;
  AttentionTile tile;
  if (!find_attention_tile(cu, n_samples, B, blockIdx.x, true, tile)) return;
  BP_TC_SHARED(tc_smem);
  const TcAttentionLayout L = tc_attention_layout(AttentionPass::GradQ, B, d);
  const TcTiles sh = tc_tiles(tc_smem, L);
  const int h = blockIdx.y, g = h / group;
  const int64_t q_stride = int64_t{n_heads} * d, kv_stride = int64_t{n_heads / group} * d;
  const int64_t row0 = tile.base + tile.start;

  load_tc_query_tile(sh, L, q, dout, lse, delta, row0, tile.rows, h, q_stride, T_tokens, B, d);
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) sh.acc[e / d * L.ld32 + e % d] = 0.0f;
  const int64_t key_end = tile.start + tile.rows;
  for (int64_t j0 = attention_first_key_tile(tile.start, window, B); j0 < key_end; j0 += B) {
    const int keys = static_cast<int>(key_end - j0 < B ? key_end - j0 : B);
    __syncthreads();  // the previous tile's readers of K and dS are done
    const int64_t at = (tile.base + j0) * kv_stride + int64_t{g} * d;
    load_tc_tile(sh.K, k + at, kv_stride, keys, B, d, L.ld16);
    load_tc_tile(sh.V, v + at, kv_stride, keys, B, d, L.ld16);
    __syncthreads();
    tc_probs_and_grads(sh, L, B, d, tile.rows, keys, tile.start, j0, scale, window, cap, false);
    block_mma<wmma::row_major, wmma::row_major>(sh.acc, L.ld32, sh.dS, L.ld16s, sh.K, L.ld16, B, d, round_up16(keys),
                                                true);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    if (r < tile.rows)
      dq[(row0 + r) * q_stride + int64_t{h} * d + c] = store_from_f32<T>(scale * sh.acc[r * L.ld32 + c]);
  }
#else
  __trap();  // never launched below compute capability 8.0 (attention_uses_tensor_cores)
#endif
}

template <class T>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_backward_dkdv_tc_kernel(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                                      const float* delta, const int32_t* cu, int64_t n_samples, int64_t T_tokens,
                                      int n_heads, int group, int d, int B, float scale, int64_t window, float cap,
                                      T* dk, T* dv, bf16* dv16) {
#if BP_CUDA_ARCH_HAS_BF16_MMA
  namespace wmma = nvcuda::wmma;
  AttentionTile tile;  // a tile of keys
  if (!find_attention_tile(cu, n_samples, B, blockIdx.x, false, tile)) return;
  BP_TC_SHARED(tc_smem);
  const TcAttentionLayout L = tc_attention_layout(AttentionPass::GradKV, B, d);
  const TcTiles sh = tc_tiles(tc_smem, L);
  const int g = blockIdx.y, keys = tile.rows;
  const int64_t q_stride = int64_t{n_heads} * d, kv_stride = int64_t{n_heads / group} * d;
  const int64_t key0 = tile.base + tile.start;

  load_tc_tile(sh.K, k + key0 * kv_stride + int64_t{g} * d, kv_stride, keys, B, d, L.ld16);
  load_tc_tile(sh.V, v + key0 * kv_stride + int64_t{g} * d, kv_stride, keys, B, d, L.ld16);
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
    sh.acc[e / d * L.ld32 + e % d] = 0.0f;
    sh.acc2[e / d * L.ld32 + e % d] = 0.0f;
  }
  // Every query head of the group, every query tile that sees a key of this tile, in a fixed order.
  const int64_t query_end = attention_query_end(tile.start + keys - 1, tile.len, window);
  for (int h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i0 = tile.start; i0 < query_end; i0 += B) {
      const int rows = static_cast<int>(tile.len - i0 < B ? tile.len - i0 : B);
      __syncthreads();  // the previous query tile's readers of Q, dO, P, dS are done
      load_tc_query_tile(sh, L, q, dout, lse, delta, tile.base + i0, rows, h, q_stride, T_tokens, B, d);
      __syncthreads();
      tc_probs_and_grads(sh, L, B, d, rows, keys, i0, tile.start, scale, window, cap, true);
      const int depth = round_up16(rows);  // query rows past `rows` hold P = dS = 0
      block_mma<wmma::col_major, wmma::row_major>(sh.acc2, L.ld32, sh.P, L.ld16s, sh.dO, L.ld16, B, d, depth, true);
      block_mma<wmma::col_major, wmma::row_major>(sh.acc, L.ld32, sh.dS, L.ld16s, sh.Q, L.ld16, B, d, depth, true);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < B * d; e += blockDim.x) {
    const int j = e / d, c = e % d;
    if (j < keys) {
      const int64_t off = (key0 + j) * kv_stride + int64_t{g} * d + c;
      dk[off] = store_from_f32<T>(scale * sh.acc[j * L.ld32 + c]);
      store_with_bf16(dv, dv16, off, sh.acc2[j * L.ld32 + c]);
    }
  }
#else
  __trap();  // never launched below compute capability 8.0 (attention_uses_tensor_cores)
#endif
}

}  // namespace bp::BP_CUDA_NS
