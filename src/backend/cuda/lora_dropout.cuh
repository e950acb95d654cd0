// CUDA LoRA dropout without the dropped input: PEFT's dropout on the LoRA input (contract:
// ops/linear.h; CPU siblings: backend/cpu/linear.cpp lora_dropout_xa / lora_dropout_backward,
// which materialize xd = keep⊙x/(1−p) in the front-end's scratch and call sgemm). Here the mask
// is regenerated from the counter-based hash (dropout_mask.cuh dropout_keep_mixed: element t·in + c
// of the [T, in] input, the CPU's bit for bit) wherever x is read, so no [T, in] xd or dxd is
// ever written: on a card those were memory-bound passes per projection, forward, recompute and
// backward, and one saved [T, in] per projection without checkpointing.
//   lora_dropout_xa:         xa[T, r] = (keep⊙x)·Aᵀ/(1−p). A block is 256/R tokens × a chunk of
//                            R ranks (16, 32 or 64, by r; more chunks as grid.y past 64), one output
//                            per thread (r = 16, T = 2048: 128 blocks); it walks the input in slices
//                            of 32 columns, staging the dropped x slice and A's slice in shared
//                            memory: x is read once per rank chunk (once for r <= 64).
//   lora_dropout_dA:         dA[r, in] += dxaᵀ·(keep⊙x)/(1−p), a reduction over the tokens: a block
//                            is 32 columns × kDaRanks ranks with its tokens split over 16 thread rows
//                            (row g sums tokens g, g + 16, ... of its slice in order), the 16
//                            partials added in order g = 0..15 (column_sum.cuh's pattern). The
//                            base grid is small (in = 896, r = 16: 56 blocks), so the tokens are cut
//                            into S slices of consecutive tokens, one grid layer (blockIdx.z) each,
//                            S from the shape alone (lora_dropout_split.h lora_dA_split: up to ~512
//                            blocks, slices of 128 tokens or more; in = 896, r = 16, T = 2048: S = 9,
//                            504 blocks). S = 1: the block adds its sum into dA, no workspace. S > 1:
//                            slice z writes its sums to partial z of an [S, r, in] device workspace
//                            (lora_dropout_dA_bytes), then lora_dropout_dA_reduce adds partials
//                            0..S−1 in that order into dA. One writer per element; no atomics.
//   lora_dropout_dx:         dx[T, in] += keep⊙(dxa·A)/(1−p): a block is 32 columns × 32 tokens,
//                            dxa's rows and A's columns staged by chunks of 64 ranks; each element
//                            a sum of r products in rank order, masked, added into dx (one writer).
// Every sum's order depends on the shape alone: the same bits under any schedule. Products use
// __fmul_rn/__fadd_rn (no contraction: the rounding is the same on the card and in the simulation).
// Compiled by nvcc through lora_dropout.cu, and as host C++ on the CPU simulation in tests/cuda.
#pragma once

#include "backend/cuda/cuda_compat.cuh"
#include "backend/cuda/dropout_mask.cuh"
#include "backend/cuda/lora_dropout_split.h"

namespace bp::BP_CUDA_NS {

constexpr int kLoraThreads = 256;
constexpr int kLoraCols = 32;    // input columns per slice / per block (a warp's width)
constexpr int kXaOutputs = 256;  // xa values per block: rows × R, one per thread
constexpr int kXaMaxRanks = 64;  // rank chunk of the xa kernel at most
// Ranks per dA block (grid.y = ceil(r / kDaRanks)): lora_dropout_split.h counts the blocks with it.
constexpr int kDaRanks = static_cast<int>(cuda_workspace::kLoraDaRanks);
constexpr int kDaRowGroups = 16;       // thread rows splitting the tokens of a dA block
constexpr int kDaReduceThreads = 256;  // threads per block of the pass adding the slices' partials
static_assert(kLoraCols == cuda_workspace::kLoraDaCols, "lora_dA_split counts the dA kernel's blocks");
constexpr int kDxRows = 32, kDxThreadRows = 8, kDxRanks = 64;

// The xa kernel's rank chunk: the smallest of 16, 32, 64 holding r (64 past that).
inline int lora_xa_rank_chunk(int64_t r) {
  return r <= 16 ? 16 : r <= 32 ? 32 : kXaMaxRanks;
}

// x[t, c] kept and scaled (inverted dropout), or 0 outside [T, in] or where dropped.
__device__ __forceinline__ float dropped_input(const float* x, int64_t t, int64_t c, int64_t T, int64_t in,
                                               const DropoutMask& m) {
  if (t >= T || c >= in) return 0.0f;
  return m.keep(static_cast<uint64_t>(t * in + c)) ? __fmul_rn(x[t * in + c], m.inv_keep) : 0.0f;
}

// grid (ceil(T / rows), ceil(r / R)), kLoraThreads threads; rows·R = kXaOutputs.
__global__ void lora_dropout_xa_kernel(const float* x, const float* A, float* xa, int64_t T, int64_t in, int64_t r,
                                       int R, DropoutMask m) {
  __shared__ float xs[kXaOutputs / 16][kLoraCols + 1];  // rows = kXaOutputs / R <= kXaOutputs / 16
  __shared__ float as[kXaMaxRanks][kLoraCols + 1];
  constexpr int kPerThread = kXaOutputs / kLoraThreads;
  const int tid = static_cast<int>(threadIdx.x), rows = kXaOutputs / R;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * rows, j0 = static_cast<int64_t>(blockIdx.y) * R;
  float acc[kPerThread];
  for (int k = 0; k < kPerThread; ++k) acc[k] = 0.0f;
  for (int64_t c0 = 0; c0 < in; c0 += kLoraCols) {
    for (int i = tid; i < rows * kLoraCols; i += kLoraThreads)
      xs[i / kLoraCols][i % kLoraCols] = dropped_input(x, t0 + i / kLoraCols, c0 + i % kLoraCols, T, in, m);
    for (int i = tid; i < R * kLoraCols; i += kLoraThreads) {
      const int64_t j = j0 + i / kLoraCols, c = c0 + i % kLoraCols;
      as[i / kLoraCols][i % kLoraCols] = j < r && c < in ? A[j * in + c] : 0.0f;
    }
    __syncthreads();
    for (int k = 0; k < kPerThread; ++k) {
      const int o = tid + k * kLoraThreads, row = o / R, j = o % R;
      float s = acc[k];
      for (int cc = 0; cc < kLoraCols; ++cc) s = __fadd_rn(s, __fmul_rn(xs[row][cc], as[j][cc]));
      acc[k] = s;
    }
    __syncthreads();
  }
  for (int k = 0; k < kPerThread; ++k) {
    const int o = tid + k * kLoraThreads;
    const int64_t t = t0 + o / R, j = j0 + o % R;
    if (t < T && j < r) xa[t * r + j] = acc[k];
  }
}

// grid (ceil(in / 32), ceil(r / kDaRanks), S), block (32, kDaRowGroups). Layer z sums tokens
// [z·L, min((z + 1)·L, T)) (L = slice_tokens). S = 1 (L = T): the sums are added into out = dA.
// S > 1: layer z writes its sums to out + z·r·in, its partial (overwritten, every element).
__global__ void lora_dropout_dA_kernel(const float* dxa, const float* x, float* out, int64_t T, int64_t in, int64_t r,
                                       int64_t slice_tokens, bool partials, DropoutMask m) {
  __shared__ float partial[kDaRowGroups][kDaRanks][kLoraCols + 1];
  const int c = static_cast<int>(threadIdx.x), g = static_cast<int>(threadIdx.y);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kLoraCols + c,
                j0 = static_cast<int64_t>(blockIdx.y) * kDaRanks;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * slice_tokens,
                t1 = T - t0 < slice_tokens ? T : t0 + slice_tokens;
  const int nj = static_cast<int>(r - j0 < kDaRanks ? r - j0 : kDaRanks);
  float acc[kDaRanks];
  for (int jj = 0; jj < kDaRanks; ++jj) acc[jj] = 0.0f;
  if (col < in)
    for (int64_t t = t0 + g; t < t1; t += kDaRowGroups) {
      const float v = dropped_input(x, t, col, T, in, m);
      const float* d = dxa + t * r + j0;
      for (int jj = 0; jj < nj; ++jj) acc[jj] = __fadd_rn(acc[jj], __fmul_rn(d[jj], v));
    }
  for (int jj = 0; jj < kDaRanks; ++jj) partial[g][jj][c] = acc[jj];
  __syncthreads();
  if (col >= in) return;
  // Thread row g adds up ranks g, g + 16, ... (at most one with kDaRanks <= kDaRowGroups): the
  // row groups' partials in order 0..15, then into dA or the slice's partial.
  float* dst = partials ? out + static_cast<int64_t>(blockIdx.z) * r * in : out;
  for (int jj = g; jj < nj; jj += kDaRowGroups) {
    float s = partial[0][jj][c];
    for (int q = 1; q < kDaRowGroups; ++q) s = __fadd_rn(s, partial[q][jj][c]);
    float* o = dst + (j0 + jj) * in + col;
    *o = partials ? s : __fadd_rn(*o, s);
  }
}

// grid ceil(n / kDaReduceThreads), kDaReduceThreads threads: dA[i] += Σ_{z = 0..S−1} partials[z·n + i],
// summed in slice order, then added to dA[i] (n = r·in; one thread per element).
__global__ void lora_dropout_dA_reduce_kernel(const float* partials, float* dA, int64_t n, int64_t slices) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kDaReduceThreads + threadIdx.x;
  if (i >= n) return;
  float s = partials[i];
  for (int64_t z = 1; z < slices; ++z) s = __fadd_rn(s, partials[z * n + i]);
  dA[i] = __fadd_rn(dA[i], s);
}

// grid (ceil(in / 32), ceil(T / kDxRows)), block (32, kDxThreadRows).
__global__ void lora_dropout_dx_kernel(const float* dxa, const float* A, float* dx, int64_t T, int64_t in, int64_t r,
                                       DropoutMask m) {
  __shared__ float as[kDxRanks][kLoraCols + 1];
  __shared__ float ds[kDxRows][kDxRanks + 1];
  constexpr int kPerThread = kDxRows / kDxThreadRows;
  const int c = static_cast<int>(threadIdx.x), g = static_cast<int>(threadIdx.y);
  const int tid = g * kLoraCols + c, n_threads = kLoraCols * kDxThreadRows;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kLoraCols + c, t0 = static_cast<int64_t>(blockIdx.y) * kDxRows;
  float acc[kPerThread];
  for (int k = 0; k < kPerThread; ++k) acc[k] = 0.0f;
  for (int64_t j0 = 0; j0 < r; j0 += kDxRanks) {
    const int nj = static_cast<int>(r - j0 < kDxRanks ? r - j0 : kDxRanks);
    for (int i = tid; i < kDxRanks * kLoraCols; i += n_threads) {
      const int64_t j = j0 + i / kLoraCols, cc = static_cast<int64_t>(blockIdx.x) * kLoraCols + i % kLoraCols;
      as[i / kLoraCols][i % kLoraCols] = j < r && cc < in ? A[j * in + cc] : 0.0f;
    }
    for (int i = tid; i < kDxRows * kDxRanks; i += n_threads) {
      const int64_t t = t0 + i / kDxRanks, j = j0 + i % kDxRanks;
      ds[i / kDxRanks][i % kDxRanks] = t < T && j < r ? dxa[t * r + j] : 0.0f;
    }
    __syncthreads();
    for (int k = 0; k < kPerThread; ++k) {
      const int row = g + k * kDxThreadRows;
      float s = acc[k];
      for (int jj = 0; jj < nj; ++jj) s = __fadd_rn(s, __fmul_rn(ds[row][jj], as[jj][c]));
      acc[k] = s;
    }
    __syncthreads();
  }
  if (col >= in) return;
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t t = t0 + g + k * kDxThreadRows;
    if (t < T && m.keep(static_cast<uint64_t>(t * in + col)))
      dx[t * in + col] = __fadd_rn(dx[t * in + col], __fmul_rn(acc[k], m.inv_keep));
  }
}

// xa[T, r] = dropout(x)·Aᵀ (overwritten).
BP_HOST_FN void lora_dropout_xa(const float* x, const float* A, float* xa, int64_t T, int64_t in, int64_t r, float p,
                                uint64_t seed, cudaStream_t stream = nullptr) {
  if (T <= 0 || r <= 0) return;
  const int R = lora_xa_rank_chunk(r), rows = kXaOutputs / R;
  BP_LAUNCH(dim3(blocks_for(T, rows), blocks_for(r, R)), kLoraThreads, 0, stream, lora_dropout_xa_kernel)
  (x, A, xa, T, in, r, R, dropout_mask(p, seed));
}
// dA[r, in] += dxaᵀ·dropout(x). `workspace`: cuda_workspace::lora_dropout_dA_bytes(T, in, r) bytes of
// device memory (none, and may be null, when lora_dA_split gives one slice), for this call only.
BP_HOST_FN void lora_dropout_dA_accumulate(const float* dxa, const float* x, float* dA, int64_t T, int64_t in,
                                           int64_t r, float p, uint64_t seed, float* workspace,
                                           cudaStream_t stream = nullptr) {
  if (T <= 0 || r <= 0 || in <= 0) return;
  const cuda_workspace::LoraDaSplit split = cuda_workspace::lora_dA_split(T, in, r);
  const bool partials = split.slices > 1;
  BP_LAUNCH(dim3(blocks_for(in, kLoraCols), blocks_for(r, kDaRanks), static_cast<unsigned>(split.slices)),
            dim3(kLoraCols, kDaRowGroups), 0, stream, lora_dropout_dA_kernel)
  (dxa, x, partials ? workspace : dA, T, in, r, split.slice_tokens, partials, dropout_mask(p, seed));
  if (!partials) return;
  BP_LAUNCH(blocks_for(r * in, kDaReduceThreads), kDaReduceThreads, 0, stream, lora_dropout_dA_reduce_kernel)
  (workspace, dA, r * in, split.slices);
}
// dx[T, in] += dropout'(dxa·A): kept elements get (dxa·A)/(1−p), dropped ones nothing.
BP_HOST_FN void lora_dropout_dx_accumulate(const float* dxa, const float* A, float* dx, int64_t T, int64_t in,
                                           int64_t r, float p, uint64_t seed, cudaStream_t stream = nullptr) {
  if (T <= 0 || r <= 0 || in <= 0) return;
  BP_LAUNCH(dim3(blocks_for(in, kLoraCols), blocks_for(T, kDxRows)), dim3(kLoraCols, kDxThreadRows), 0, stream,
            lora_dropout_dx_kernel)
  (dxa, A, dx, T, in, r, dropout_mask(p, seed));
}

}  // namespace bp::BP_CUDA_NS
