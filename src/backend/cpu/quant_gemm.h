// CPU kernels that read a frozen weight held in its stored type (bf16, f16 or one of ggml's block
// formats, core/quant_blocks.h) without ever making a full f32 copy of it (DESIGN.md "Frozen
// weights in any stored type"): each task dequantizes one tile of the weight into a thread-local
// buffer of at most kHeldTileFloats floats (plus one block row) and multiplies it with sgemm.
//
// Tiles and tasks (quant_gemm.cpp says how many):
//   held_gemm_xwt  C[M, N] = X[M, K]·Wᵀ + beta·C, W [N, K]: a task owns a panel of whole rows of W
//                  (rows n0..n1) and a chunk of X's rows; it dequantizes the panel in column
//                  slices that fit the tile budget and accumulates each slice's sgemm into C.
//   held_gemm_xw   C[M, K] = X[M, N]·W + beta·C, W [N, K]: a task owns a block of C's columns (whole blocks
//                  of the weight's format) and a chunk of X's rows, and walks W's rows in tiles of
//                  [rows, column block], accumulating into C.
// The vector dequantizers of the CPU kernel variant in use (kernel_variants.h) fill the tiles for
// q8_0, q4_0, q5_0 and q4_K; other types use core's scalar ones.
// The split depends on the shapes only and tasks write disjoint parts of C, so results do not
// depend on the thread count; every task's sgemm runs inside an OpenMP region, single-threaded
// on the calling thread (the OpenMP build of OpenBLAS does that, see backend/cpu/attention.cpp).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace bp::cpu {

// A held weight [rows, cols] in dtype `type`, row-major, each row whole blocks.
struct HeldMatrix {
  const void* data = nullptr;
  DType type = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  // Some value lies outside the range of the device's 16-bit GEMM type (ops/held_range.h): the
  // CUDA GEMMs read it through f32 panels instead of f16 ones. The CPU's f16 paths do not exist (gemm_engine.h).
  bool f32_panels = false;
};

// Tile budget per task, in floats (512 KiB: the tile stays in L2 while sgemm packs it).
inline constexpr int64_t kHeldTileFloats = int64_t{1} << 17;

// How a product is split into tasks (exposed for tests): `piece` = rows of W per panel (x·Wᵀ) or
// columns of C per block (dy·W), `chunk` = rows of X per task, `step` = columns of W per
// dequantized slice (x·Wᵀ) or rows of W per tile (dy·W).
struct HeldSplit {
  int64_t piece = 0, chunk = 0, step = 0;
};
HeldSplit held_xwt_split(int64_t M, int64_t N, int64_t K, DType type);
HeldSplit held_xw_split(int64_t M, int64_t N, int64_t K, DType type);

// C[M, W.rows] = X[M, W.cols]·Wᵀ + beta·C (ldc = W.rows).
void held_gemm_xwt(const float* X, const HeldMatrix& W, float beta, float* C, int64_t M);
// C[M, W.cols] = X[M, W.rows]·W + beta·C (ldc = W.cols; beta 0: C is not read).
void held_gemm_xw(const float* X, const HeldMatrix& W, float beta, float* C, int64_t M);
// max |w| over the dequantized values of W (Inf or NaN when it holds one): the reference of the
// CUDA reduction that decides whether W fits f16 (ops/held_range.h).
float held_abs_max(const HeldMatrix& W);
// y[t, :] = row ids[t] of `table` as f32 (ids already range-checked).
void embedding_forward_held(const int32_t* ids, const HeldMatrix& table, float* y, int64_t T);

}  // namespace bp::cpu
