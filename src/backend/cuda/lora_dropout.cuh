// CUDA LoRA dropout without the dropped input: PEFT's dropout on the LoRA input (contract:
// ops/linear.h; CPU siblings: backend/cpu/linear.cpp lora_dropout_xa / lora_dropout_backward,
// which materialize xd = keep⊙x/(1−p) in the front-end's scratch and call sgemm). Here the mask
// is regenerated from the counter-based hash (dropout_mask.cuh dropout_keep_mixed: element t·in + c
// of the [T, in] input, the CPU's bit for bit) wherever x is read, so no [T, in] xd or dxd is
// ever written: on a card those were memory-bound passes per projection, forward, recompute and
// backward, and one saved [T, in] per projection without checkpointing. Each launch takes a list of
// members (LoraDropoutList): the projections of one input group (q/k/v, gate/up), their A matrices
// rows of one [Σr, in] matrix and their xa / dxa columns of one [T, Σr], each with its own mask, so a
// group makes one launch per product instead of one per projection (a projection alone: one member).
//   lora_dropout_xa:         xa[T, r] = (keep⊙x)·Aᵀ/(1−p). A block is 256/R tokens × a chunk of
//                            R ranks (16, 32 or 64, by the largest r; more chunks as grid.y past 64), one output
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
//                            a sum of r products in rank order, masked, added into dx (one writer),
//                            the members' terms in member order to one read and one write of dx.
// xa and dA give each grid row a chunk of one member's ranks (its mask, its rows of A); dA's token
// split is that of r = Σr (lora_dropout_split.h), its partials [S, Σr, in].
// Every sum's order depends on the shape alone: the same bits under any schedule. Products use
// __fmul_rn/__fadd_rn (no contraction: the rounding is the same on the card and in the simulation).
// Compiled by nvcc through lora_dropout.cu, and as host C++ on the CPU simulation in tests/cuda.
#pragma once

#include "backend/cpu/linear.h"  // LoraDropoutMember, kMaxLoraDropoutMembers
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

// The members of one launch as a kernel argument: an input group's projections (q/k/v, gate/up)
// whose A matrices are rows of one [ld, in] matrix (ld = Σ r) and whose xa / dxa are columns of one
// [T, ld] matrix, each with its own mask (its own seed, one p). One projection alone is a list of
// one. Members are read at constant indices only (pick_member's unrolled loop): a by-value
// argument indexed at run time would make nvcc copy the whole struct to local memory.
constexpr int kMaxLoraDropoutMembers = cpu::kMaxLoraDropoutMembers;
struct LoraDropoutList {
  int n;       // 1..kMaxLoraDropoutMembers
  int64_t ld;  // Σ r: A's rows, xa's and dxa's row stride
  int64_t r[kMaxLoraDropoutMembers];
  DropoutMask mask[kMaxLoraDropoutMembers];
};
struct LoraMemberChunk {
  int64_t col, r, j0;  // the member's first row of A (column of xa), its rank, the chunk's first rank
  DropoutMask mask;
};
// Grid row `y` of a grid with ceil(r_m / chunk) rows per member, members in order.
__device__ __forceinline__ LoraMemberChunk pick_member(const LoraDropoutList& list, int64_t y, int chunk) {
  LoraMemberChunk out{0, list.r[0], y * chunk, list.mask[0]};
  int64_t first = 0, col = 0;
  BP_UNROLL
  for (int k = 0; k < kMaxLoraDropoutMembers; ++k) {
    if (k < list.n) {
      const int64_t rows = (list.r[k] + chunk - 1) / chunk;
      if (y >= first && y < first + rows) out = {col, list.r[k], (y - first) * chunk, list.mask[k]};
      first += rows;
      col += list.r[k];
    }
  }
  return out;
}
// Member k (0 <= k < list.n) without a chunk: its column and rank, its mask.
__device__ __forceinline__ LoraMemberChunk member_at(const LoraDropoutList& list, int k) {
  LoraMemberChunk out{0, list.r[0], 0, list.mask[0]};
  int64_t col = 0;
  BP_UNROLL
  for (int i = 0; i < kMaxLoraDropoutMembers; ++i) {
    if (i == k) out = {col, list.r[i], 0, list.mask[i]};
    if (i < list.n) col += list.r[i];
  }
  return out;
}

// grid (ceil(T / rows), Σ ceil(r_m / R)), kLoraThreads threads; rows·R = kXaOutputs. Grid row y is a
// chunk of R ranks of one member (pick_member). 5 blocks an SM asked of ptxas (4 on Turing, whose SM
// holds 1024 threads): it then keeps the kernel at 46 registers a thread on sm_90 without spills
// (56 unbounded, 48 before the member lists: 4 and 5 blocks).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define BP_LORA_XA_MIN_BLOCKS 4
#else
#define BP_LORA_XA_MIN_BLOCKS 5
#endif
__global__ void __launch_bounds__(kLoraThreads, BP_LORA_XA_MIN_BLOCKS)
    lora_dropout_xa_kernel(const float* x, const float* A, float* xa, int64_t T, int64_t in, int R,
                           LoraDropoutList list) {
  __shared__ float xs[kXaOutputs / 16][kLoraCols + 1];  // rows = kXaOutputs / R <= kXaOutputs / 16
  __shared__ float as[kXaMaxRanks][kLoraCols + 1];
  constexpr int kPerThread = kXaOutputs / kLoraThreads;
  const LoraMemberChunk m = pick_member(list, blockIdx.y, R);
  const int tid = static_cast<int>(threadIdx.x), rows = kXaOutputs / R;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * rows, j0 = m.j0, r = m.r, ld = list.ld;
  const float* Am = A + m.col * in;
  float acc[kPerThread];
  for (int k = 0; k < kPerThread; ++k) acc[k] = 0.0f;
  for (int64_t c0 = 0; c0 < in; c0 += kLoraCols) {
    for (int i = tid; i < rows * kLoraCols; i += kLoraThreads)
      xs[i / kLoraCols][i % kLoraCols] = dropped_input(x, t0 + i / kLoraCols, c0 + i % kLoraCols, T, in, m.mask);
    for (int i = tid; i < R * kLoraCols; i += kLoraThreads) {
      const int64_t j = j0 + i / kLoraCols, c = c0 + i % kLoraCols;
      as[i / kLoraCols][i % kLoraCols] = j < r && c < in ? Am[j * in + c] : 0.0f;
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
    if (t < T && j < r) xa[t * ld + m.col + j] = acc[k];
  }
}

// grid (ceil(in / 32), Σ ceil(r_m / kDaRanks), S), block (32, kDaRowGroups); grid row y is a chunk of
// kDaRanks ranks of one member (pick_member). Layer z sums tokens [z·L, min((z + 1)·L, T))
// (L = slice_tokens). S = 1 (L = T): the sums are added into out = dA [ld, in]. S > 1: layer z writes
// its sums to out + z·ld·in, its partial (overwritten, every element).
__global__ void lora_dropout_dA_kernel(const float* dxa, const float* x, float* out, int64_t T, int64_t in,
                                       int64_t slice_tokens, bool partials, LoraDropoutList list) {
  __shared__ float partial[kDaRowGroups][kDaRanks][kLoraCols + 1];
  const LoraMemberChunk m = pick_member(list, blockIdx.y, kDaRanks);
  const int c = static_cast<int>(threadIdx.x), g = static_cast<int>(threadIdx.y);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kLoraCols + c, j0 = m.j0, ld = list.ld;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * slice_tokens,
                t1 = T - t0 < slice_tokens ? T : t0 + slice_tokens;
  const int nj = static_cast<int>(m.r - j0 < kDaRanks ? m.r - j0 : kDaRanks);
  float acc[kDaRanks];
  for (int jj = 0; jj < kDaRanks; ++jj) acc[jj] = 0.0f;
  if (col < in)
    for (int64_t t = t0 + g; t < t1; t += kDaRowGroups) {
      const float v = dropped_input(x, t, col, T, in, m.mask);
      const float* d = dxa + t * ld + m.col + j0;
      for (int jj = 0; jj < nj; ++jj) acc[jj] = __fadd_rn(acc[jj], __fmul_rn(d[jj], v));
    }
  for (int jj = 0; jj < kDaRanks; ++jj) partial[g][jj][c] = acc[jj];
  __syncthreads();
  if (col >= in) return;
  // Thread row g adds up ranks g, g + 16, ... (at most one with kDaRanks <= kDaRowGroups): the
  // row groups' partials in order 0..15, then into dA or the slice's partial.
  float* dst = partials ? out + static_cast<int64_t>(blockIdx.z) * ld * in : out;
  for (int jj = g; jj < nj; jj += kDaRowGroups) {
    float s = partial[0][jj][c];
    for (int q = 1; q < kDaRowGroups; ++q) s = __fadd_rn(s, partial[q][jj][c]);
    float* o = dst + (m.col + j0 + jj) * in + col;
    *o = partials ? s : __fadd_rn(*o, s);
  }
}

// grid ceil(n / kDaReduceThreads), kDaReduceThreads threads: dA[i] += Σ_{z = 0..S−1} partials[z·n + i],
// summed in slice order, then added to dA[i] (n = ld·in; one thread per element).
__global__ void lora_dropout_dA_reduce_kernel(const float* partials, float* dA, int64_t n, int64_t slices) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kDaReduceThreads + threadIdx.x;
  if (i >= n) return;
  float s = partials[i];
  for (int64_t z = 1; z < slices; ++z) s = __fadd_rn(s, partials[z * n + i]);
  dA[i] = __fadd_rn(dA[i], s);
}

// grid (ceil(in / 32), ceil(T / kDxRows)), block (32, kDxThreadRows). Each dx element is read once,
// gets every member's term in member order (the bits of one launch per member in that order), and
// is written once. kMembers: 1 for a projection alone (its one-iteration member loop known to
// ptxas: 66 registers a thread on sm_90, against 72 for a group's), else kMaxLoraDropoutMembers.
template <int kMembers>
__global__ void lora_dropout_dx_kernel(const float* dxa, const float* A, float* dx, int64_t T, int64_t in,
                                       LoraDropoutList list) {
  __shared__ float as[kDxRanks][kLoraCols + 1];
  __shared__ float ds[kDxRows][kDxRanks + 1];
  constexpr int kPerThread = kDxRows / kDxThreadRows;
  const int c = static_cast<int>(threadIdx.x), g = static_cast<int>(threadIdx.y);
  const int tid = g * kLoraCols + c, n_threads = kLoraCols * kDxThreadRows;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kLoraCols + c, t0 = static_cast<int64_t>(blockIdx.y) * kDxRows;
  const int64_t ld = list.ld;
  float sum[kPerThread];
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t t = t0 + g + k * kDxThreadRows;
    sum[k] = t < T && col < in ? dx[t * in + col] : 0.0f;
  }
  const int n_members = kMembers == 1 ? 1 : list.n;
  for (int mi = 0; mi < n_members; ++mi) {
    const LoraMemberChunk m = member_at(list, mi);
    const int64_t r = m.r;
    const float* Am = A + m.col * in;
    float acc[kPerThread];
    for (int k = 0; k < kPerThread; ++k) acc[k] = 0.0f;
    for (int64_t j0 = 0; j0 < r; j0 += kDxRanks) {
      const int nj = static_cast<int>(r - j0 < kDxRanks ? r - j0 : kDxRanks);
      for (int i = tid; i < kDxRanks * kLoraCols; i += n_threads) {
        const int64_t j = j0 + i / kLoraCols, cc = static_cast<int64_t>(blockIdx.x) * kLoraCols + i % kLoraCols;
        as[i / kLoraCols][i % kLoraCols] = j < r && cc < in ? Am[j * in + cc] : 0.0f;
      }
      for (int i = tid; i < kDxRows * kDxRanks; i += n_threads) {
        const int64_t t = t0 + i / kDxRanks, j = j0 + i % kDxRanks;
        ds[i / kDxRanks][i % kDxRanks] = t < T && j < r ? dxa[t * ld + m.col + j] : 0.0f;
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
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t t = t0 + g + k * kDxThreadRows;
      if (t < T && col < in && m.mask.keep(static_cast<uint64_t>(t * in + col)))
        sum[k] = __fadd_rn(sum[k], __fmul_rn(acc[k], m.mask.inv_keep));
    }
  }
  if (col >= in) return;
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t t = t0 + g + k * kDxThreadRows;
    if (t < T) dx[t * in + col] = sum[k];
  }
}

// The launch's member list from the host's; false (launch nothing) for no members or no ranks.
inline bool lora_dropout_list(const cpu::LoraDropoutMember* members, int n_members, float p, LoraDropoutList& list) {
  if (!members || n_members <= 0 || n_members > kMaxLoraDropoutMembers) return false;
  list = LoraDropoutList{};
  list.n = n_members;
  list.ld = 0;
  for (int k = 0; k < n_members; ++k) {
    if (members[k].r <= 0) return false;
    list.r[k] = members[k].r;
    list.mask[k] = dropout_mask(p, members[k].seed);
    list.ld += members[k].r;
  }
  return true;
}
// Grid rows of a kernel taking `chunk` ranks of one member per row.
inline unsigned lora_member_blocks(const LoraDropoutList& list, int chunk) {
  int64_t rows = 0;
  for (int k = 0; k < list.n; ++k) rows += (list.r[k] + chunk - 1) / chunk;
  return static_cast<unsigned>(rows);
}

// Launchers. A is the members' A matrices as rows of one [Σr, in] matrix, xa and dxa [T, Σr] their
// columns, dA [Σr, in] like A; members in that order (1 to kMaxLoraDropoutMembers; a member list the
// front-end checked: none, too many or a rank of 0 launch nothing).
// xa[T, Σr] = dropout_m(x)·A_mᵀ per member (overwritten).
BP_HOST_FN void lora_dropout_xa(const float* x, const float* A, float* xa, int64_t T, int64_t in,
                                const cpu::LoraDropoutMember* members, int n_members, float p,
                                cudaStream_t stream = nullptr) {
  LoraDropoutList list;
  if (T <= 0 || !lora_dropout_list(members, n_members, p, list)) return;
  int64_t r_max = 0;
  for (int k = 0; k < list.n; ++k) r_max = list.r[k] > r_max ? list.r[k] : r_max;
  const int R = lora_xa_rank_chunk(r_max), rows = kXaOutputs / R;
  BP_LAUNCH(dim3(blocks_for(T, rows), lora_member_blocks(list, R)), kLoraThreads, 0, stream, lora_dropout_xa_kernel)
  (x, A, xa, T, in, R, list);
}
// dA[Σr, in] += dxa_mᵀ·dropout_m(x) per member. `workspace`: cuda_workspace::lora_dropout_dA_bytes(T, in,
// Σr) bytes of device memory (none, and may be null, when lora_dA_split gives one slice), for this
// call only.
BP_HOST_FN void lora_dropout_dA_accumulate(const float* dxa, const float* x, float* dA, int64_t T, int64_t in,
                                           const cpu::LoraDropoutMember* members, int n_members, float p,
                                           float* workspace, cudaStream_t stream = nullptr) {
  LoraDropoutList list;
  if (T <= 0 || in <= 0 || !lora_dropout_list(members, n_members, p, list)) return;
  const cuda_workspace::LoraDaSplit split = cuda_workspace::lora_dA_split(T, in, list.ld);
  const bool partials = split.slices > 1;
  BP_LAUNCH(dim3(blocks_for(in, kLoraCols), lora_member_blocks(list, kDaRanks), static_cast<unsigned>(split.slices)),
            dim3(kLoraCols, kDaRowGroups), 0, stream, lora_dropout_dA_kernel)
  (dxa, x, partials ? workspace : dA, T, in, split.slice_tokens, partials, list);
  if (!partials) return;
  BP_LAUNCH(blocks_for(list.ld * in, kDaReduceThreads), kDaReduceThreads, 0, stream, lora_dropout_dA_reduce_kernel)
  (workspace, dA, list.ld * in, split.slices);
}
// dx[T, in] += Σ_m dropout_m'(dxa_m·A_m), members in order: kept elements get (dxa_m·A_m)/(1−p),
// dropped ones nothing.
BP_HOST_FN void lora_dropout_dx_accumulate(const float* dxa, const float* A, float* dx, int64_t T, int64_t in,
                                           const cpu::LoraDropoutMember* members, int n_members, float p,
                                           cudaStream_t stream = nullptr) {
  LoraDropoutList list;
  if (T <= 0 || in <= 0 || !lora_dropout_list(members, n_members, p, list)) return;
  const dim3 grid(blocks_for(in, kLoraCols), blocks_for(T, kDxRows)), block(kLoraCols, kDxThreadRows);
  if (list.n == 1)
    BP_LAUNCH(grid, block, 0, stream, lora_dropout_dx_kernel<1>)(dxa, A, dx, T, in, list);
  else
    BP_LAUNCH(grid, block, 0, stream, lora_dropout_dx_kernel<kMaxLoraDropoutMembers>)(dxa, A, dx, T, in, list);
}

}  // namespace bp::BP_CUDA_NS
