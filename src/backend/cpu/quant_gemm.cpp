// Tile-wise dequantize-then-sgemm over held weights (see quant_gemm.h for the tiling).
#include "backend/cpu/quant_gemm.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/gemm.h"
#include "core/quant_blocks.h"

namespace bp::cpu {

namespace {

// Rows of X per task. The split is a function of the shapes only, never of the thread count, so
// every task computes the same thing however many threads run them (OpenBLAS picks different
// kernels for different sub-shapes, so a thread-dependent split would change the last bits). A
// tile is dequantized once per chunk: at 256 rows that is 1/256 of the GEMM's multiply-adds.
constexpr int64_t kRowChunk = 256;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

size_t row_bytes(const HeldMatrix& W) {
  return dtype_bytes(W.type, W.cols);
}

const uint8_t* row_ptr(const HeldMatrix& W, int64_t r) {
  return static_cast<const uint8_t*>(W.data) + static_cast<size_t>(r) * row_bytes(W);
}

// The calling thread's tile buffer, grown to `floats` (never past the tile budget plus one block
// row: callers size their tiles from kHeldTileFloats).
float* tile_buffer(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

}  // namespace

void held_gemm_xwt(const float* X, const HeldMatrix& W, float beta, float* C, int64_t M) {
  const int64_t N = W.rows, K = W.cols;
  if (M == 0 || N == 0) return;
  const int64_t panel = std::clamp<int64_t>(kHeldTileFloats / std::max<int64_t>(K, 1), kHeldMinPanelRows, 64);
  const int64_t panels = ceil_div(N, panel);
  const int64_t chunks = ceil_div(M, kRowChunk);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < panels * chunks; ++task) {
    const int64_t n0 = (task % panels) * panel, n1 = std::min(N, n0 + panel);
    const int64_t m0 = (task / panels) * kRowChunk, m1 = std::min(M, m0 + kRowChunk);
    float* tile = tile_buffer((n1 - n0) * K);
    dequantize_span(W.type, row_ptr(W, n0), tile, (n1 - n0) * K);
    sgemm(false, true, m1 - m0, n1 - n0, K, 1.0f, X + m0 * K, K, tile, K, beta, C + m0 * N + n0, N);
  }
}

void held_gemm_xw(const float* X, const HeldMatrix& W, float* C, int64_t M) {
  const int64_t N = W.rows, K = W.cols;
  if (M == 0 || K == 0) return;
  if (N == 0) {
    std::fill_n(C, M * K, 0.0f);
    return;
  }
  const int64_t bs = dtype_block_size(W.type);
  const int64_t width = ceil_div(64, bs) * bs;  // columns per task: whole blocks, at least 64
  const int64_t col_blocks = ceil_div(K, width);
  const int64_t tile_rows = std::max<int64_t>(1, kHeldTileFloats / width);
  const int64_t chunks = ceil_div(M, kRowChunk);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < col_blocks * chunks; ++task) {
    const int64_t k0 = (task % col_blocks) * width, kw = std::min(K - k0, width);
    const int64_t m0 = (task / col_blocks) * kRowChunk, m1 = std::min(M, m0 + kRowChunk);
    const size_t col_offset = dtype_bytes(W.type, k0);
    float* tile = tile_buffer(std::min(N, tile_rows) * kw);
    for (int64_t n0 = 0; n0 < N; n0 += tile_rows) {
      const int64_t n1 = std::min(N, n0 + tile_rows);
      for (int64_t r = n0; r < n1; ++r) dequantize_span(W.type, row_ptr(W, r) + col_offset, tile + (r - n0) * kw, kw);
      sgemm(false, false, m1 - m0, kw, n1 - n0, 1.0f, X + m0 * N + n0, N, tile, kw, n0 == 0 ? 0.0f : 1.0f,
            C + m0 * K + k0, K);
    }
  }
}

void embedding_forward_held(const int32_t* ids, const HeldMatrix& table, float* y, int64_t T) {
  const int64_t D = table.cols;
#pragma omp parallel for schedule(static) if (T * D >= (int64_t{1} << 16))
  for (int64_t t = 0; t < T; ++t) dequantize_span(table.type, row_ptr(table, ids[t]), y + t * D, D);
}

}  // namespace bp::cpu
