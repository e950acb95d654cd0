// How the CUDA LoRA-dropout dA kernel (lora_dropout.cuh) splits its reduction over the tokens, and
// the device workspace that split takes: plain C++ (no CUDA header), so the kernel's launcher, the
// wrapper that allocates the workspace (kernel_wrappers.h) and the device memory plan
// (device_workspace.h lora_dropout_dA_bytes, train/memory_plan.cpp) share one function.
//
// dA[r, in] += dxaᵀ·(keep⊙x)/(1−p) is a reduction over the T tokens. Its base grid is
// ceil(in / 32) × ceil(r / 8) blocks of 512 threads: for Qwen2.5-0.5B's in = 896 and r = 16 that is
// 56 blocks on a 132-SM card, a tenth of the threads it can hold, each walking all T tokens:
// latency-bound. So when the base grid is small the tokens are cut into S consecutive slices of L
// tokens (the last one shorter), one grid layer per slice, as many as bring the grid up to
// kLoraDaTargetBlocks blocks, none shorter than kLoraDaMinSliceTokens tokens. Each slice's sums go
// to their own [r, in] partial in workspace, and a second pass adds the S partials into dA in slice
// order 0..S−1. S = 1 (a large grid, or few tokens) is the single pass without workspace. The split
// depends on (T, in, r) alone, so every sum's order does too: the same bits under any schedule.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bp::cuda_workspace {

// The dA kernel's block: 32 input columns × kLoraDaRanks ranks (its thread rows split the tokens).
inline constexpr int64_t kLoraDaCols = 32;
inline constexpr int64_t kLoraDaRanks = 8;
// The grid the split aims at, at most: 512 blocks of 512 threads. The dA kernel holds 3 blocks per
// SM (40 registers a thread on sm_90), so an H100's 132 SMs run ~400 at once; 512 leaves the
// waves' tail short while the partials stay small (S·r·in floats: 9 × 16 × 896 × 4 B = 504 KiB).
inline constexpr int64_t kLoraDaTargetBlocks = 512;
// A slice has at least this many tokens (8 per thread row of the block): shorter slices would add
// more partial traffic and block overhead than parallelism.
inline constexpr int64_t kLoraDaMinSliceTokens = 128;
// At most this many slices (a tiny base grid, in <= 32 and r <= 8, would otherwise ask for 512):
// bounds the second pass's sums and, being at most kLoraDaMinSliceTokens, keeps every slice
// non-empty (below).
inline constexpr int64_t kLoraDaMaxSlices = 64;
static_assert(kLoraDaMaxSlices <= kLoraDaMinSliceTokens, "lora_dA_split's slices would not all hold tokens");

struct LoraDaSplit {
  int64_t slices = 1;        // S: grid layers, partials in workspace when > 1
  int64_t slice_tokens = 0;  // L: tokens per slice (the last one holds T − (S−1)·L, at least 1)
};

// S = floor(target / base blocks), at most kLoraDaMaxSlices and T / kLoraDaMinSliceTokens, at least
// 1; L = ceil(T / S). Every slice holds tokens: with T = q·S + e (0 <= e < S), q >= 128 >= S, so
// (S−1)·L <= (S−1)·(q+1) = T − e − (q − S + 1) < T when e > 0 (and (S−1)·q < T when e = 0). S never
// falls as T grows, so a plan made for the longest micro-batch covers the shorter ones.
constexpr LoraDaSplit lora_dA_split(int64_t T, int64_t in, int64_t r) {
  if (T <= 0 || in <= 0 || r <= 0) return {1, T > 0 ? T : 0};
  const int64_t base = ((in + kLoraDaCols - 1) / kLoraDaCols) * ((r + kLoraDaRanks - 1) / kLoraDaRanks);
  int64_t s = kLoraDaTargetBlocks / base;
  if (s > kLoraDaMaxSlices) s = kLoraDaMaxSlices;
  if (s > T / kLoraDaMinSliceTokens) s = T / kLoraDaMinSliceTokens;
  if (s < 1) s = 1;
  return {s, (T + s - 1) / s};
}

// The dA kernel's device workspace, in bytes: the S partials [S, r, in] f32 when S > 1, else none.
constexpr size_t lora_dropout_dA_bytes(int64_t T, int64_t in, int64_t r) {
  const LoraDaSplit split = lora_dA_split(T, in, r);
  return split.slices > 1 ? static_cast<size_t>(split.slices * r * in) * sizeof(float) : 0;
}

}  // namespace bp::cuda_workspace
