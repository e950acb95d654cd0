// Tile-wise dequantize-then-sgemm over held weights (see quant_gemm.h for the tiling).
#include "backend/cpu/quant_gemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernel_variants.h"
#include "core/quant_blocks.h"

namespace bp::cpu {

namespace {

// How a product splits into tasks. The split is a function of the shapes only, never of the
// thread count, so every task computes the same thing however many threads run them (OpenBLAS
// picks different kernels for different sub-shapes, so a thread-dependent split would change the
// last bits). About kHeldTasks tasks per product: enough for 2-8 threads to share a projection
// evenly, few enough that X is packed by sgemm only that many times (each task packs the rows of
// X it multiplies: kHeldTasks·M·K floats against 2·M·N·K FLOPs). A tile is dequantized once per
// chunk of X rows, and there is one chunk whenever the panels alone make kHeldTasks tasks.
constexpr int64_t kHeldTasks = 8;
constexpr int64_t kMinPanelRows = 32;    // of W (x·Wᵀ), unless W has fewer
constexpr int64_t kMaxPanelRows = 256;   // of W (x·Wᵀ): a vocabulary-sized W still makes big tiles
constexpr int64_t kMinChunkRows = 128;   // of X, when the rows of X are split
constexpr int64_t kMinColumnBlock = 64;  // of C (dy·W), rounded up to whole blocks of the type

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

size_t row_bytes(const HeldMatrix& W) {
  return dtype_bytes(W.type, W.cols);
}

const uint8_t* row_ptr(const HeldMatrix& W, int64_t r) {
  return static_cast<const uint8_t*>(W.data) + static_cast<size_t>(r) * row_bytes(W);
}

// n elements of a held row span into f32: the CPU variant's vector dequantizer for the formats
// that have one (kernel_variants.h), else core's scalar dequantize_span.
void dequantize_held(const KernelTable& k, DType t, const uint8_t* src, float* dst, int64_t n) {
  switch (t) {
    case DType::Q8_0: return k.dequantize_q8_0(src, dst, n / 32);
    case DType::Q4_0: return k.dequantize_q4_0(src, dst, n / 32);
    case DType::Q5_0: return k.dequantize_q5_0(src, dst, n / 32);
    case DType::Q4_K: return k.dequantize_q4_k(src, dst, n / 256);
    default: return dequantize_span(t, src, dst, n);
  }
}

// The calling thread's tile buffer, grown to `floats` (never past the tile budget plus one block
// row: callers size their tiles from kHeldTileFloats).
float* tile_buffer(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

}  // namespace

namespace {

// `parts` pieces of `n` items, each a whole number of `unit`s (a block of the held type) and at
// least `min_items` long where n allows: returns the piece length.
int64_t piece_length(int64_t n, int64_t unit, int64_t parts, int64_t min_items) {
  const int64_t units = ceil_div(n, unit);
  const int64_t per = std::max(ceil_div(units, std::max<int64_t>(parts, 1)), ceil_div(min_items, unit));
  return std::min(units, per) * unit;
}

// Chunks of X rows when `pieces` (panels or column blocks) alone make fewer than kHeldTasks tasks.
int64_t chunk_rows(int64_t M, int64_t pieces) {
  if (pieces >= kHeldTasks) return std::max<int64_t>(M, 1);
  return piece_length(std::max<int64_t>(M, 1), 1, ceil_div(kHeldTasks, pieces), kMinChunkRows);
}

}  // namespace

HeldSplit held_xwt_split(int64_t M, int64_t N, int64_t K, DType type) {
  // Panels of W rows: about kHeldTasks of them, of kMinPanelRows..kMaxPanelRows rows; then chunks
  // of X rows when the panels alone are fewer; a panel is dequantized in column slices of at most
  // the tile budget, accumulated into C (beta = 1 after the first slice).
  const int64_t bs = dtype_block_size(type);
  HeldSplit s;
  s.piece = std::min(piece_length(N, 1, kHeldTasks, kMinPanelRows), kMaxPanelRows);
  s.chunk = chunk_rows(M, ceil_div(N, s.piece));
  s.step = std::min(K, std::max(bs, kHeldTileFloats / s.piece / bs * bs));
  return s;
}

HeldSplit held_xw_split(int64_t M, int64_t N, int64_t K, DType type) {
  // Blocks of C's columns (whole blocks of the held type): about kHeldTasks of them, then chunks
  // of X rows when they are fewer; each task walks W's rows in tiles of the budget.
  HeldSplit s;
  s.piece = piece_length(K, dtype_block_size(type), kHeldTasks, kMinColumnBlock);
  s.chunk = chunk_rows(M, ceil_div(K, s.piece));
  s.step = std::max<int64_t>(1, kHeldTileFloats / s.piece);
  return s;
}

void held_gemm_xwt(const float* X, const HeldMatrix& W, float beta, float* C, int64_t M) {
  const int64_t N = W.rows, K = W.cols;
  if (M == 0 || N == 0) return;
  const HeldSplit sp = held_xwt_split(M, N, K, W.type);
  const int64_t panel = sp.piece, chunk = sp.chunk, slice = sp.step;
  const int64_t panels = ceil_div(N, panel), chunks = ceil_div(M, chunk);
  const KernelTable& k = cpu_kernels();
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < panels * chunks; ++task) {
    const int64_t n0 = (task % panels) * panel, n1 = std::min(N, n0 + panel);
    const int64_t m0 = (task / panels) * chunk, m1 = std::min(M, m0 + chunk);
    float* tile = tile_buffer((n1 - n0) * slice);
    for (int64_t k0 = 0; k0 < K; k0 += slice) {
      const int64_t kw = std::min(slice, K - k0);
      if (kw == K)
        dequantize_held(k, W.type, row_ptr(W, n0), tile, (n1 - n0) * K);
      else
        for (int64_t r = n0; r < n1; ++r)
          dequantize_held(k, W.type, row_ptr(W, r) + dtype_bytes(W.type, k0), tile + (r - n0) * kw, kw);
      sgemm(false, true, m1 - m0, n1 - n0, kw, 1.0f, X + m0 * K + k0, K, tile, kw, k0 == 0 ? beta : 1.0f,
            C + m0 * N + n0, N);
    }
  }
}

void held_gemm_xw(const float* X, const HeldMatrix& W, float beta, float* C, int64_t M) {
  const int64_t N = W.rows, K = W.cols;
  if (M == 0 || K == 0) return;
  if (N == 0) {
    if (beta == 0.0f) std::fill_n(C, M * K, 0.0f);
    return;
  }
  const HeldSplit sp = held_xw_split(M, N, K, W.type);
  const int64_t width = sp.piece, chunk = sp.chunk, tile_rows = sp.step;
  const int64_t col_blocks = ceil_div(K, width), chunks = ceil_div(M, chunk);
  const KernelTable& k = cpu_kernels();
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t task = 0; task < col_blocks * chunks; ++task) {
    const int64_t k0 = (task % col_blocks) * width, kw = std::min(K - k0, width);
    const int64_t m0 = (task / col_blocks) * chunk, m1 = std::min(M, m0 + chunk);
    const size_t col_offset = dtype_bytes(W.type, k0);
    float* tile = tile_buffer(std::min(N, tile_rows) * kw);
    for (int64_t n0 = 0; n0 < N; n0 += tile_rows) {
      const int64_t n1 = std::min(N, n0 + tile_rows);
      if (kw == K)
        dequantize_held(k, W.type, row_ptr(W, n0), tile, (n1 - n0) * K);
      else
        for (int64_t r = n0; r < n1; ++r)
          dequantize_held(k, W.type, row_ptr(W, r) + col_offset, tile + (r - n0) * kw, kw);
      sgemm(false, false, m1 - m0, kw, n1 - n0, 1.0f, X + m0 * N + n0, N, tile, kw, n0 == 0 ? beta : 1.0f,
            C + m0 * K + k0, K);
    }
  }
}

float held_abs_max(const HeldMatrix& W) {
  std::vector<float> row(static_cast<size_t>(W.cols));
  uint32_t max_bits = 0;  // of |w|: non-negative f32 bit patterns order as the values (NaN above Inf)
  for (int64_t r = 0; r < W.rows; ++r) {
    dequantize_span(W.type, row_ptr(W, r), row.data(), W.cols);
    for (float v : row) {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      max_bits = std::max(max_bits, u & 0x7fffffffu);
    }
  }
  float m;
  std::memcpy(&m, &max_bits, 4);
  return m;
}

void embedding_forward_held(const int32_t* ids, const HeldMatrix& table, float* y, int64_t T) {
  const int64_t D = table.cols;
  const KernelTable& k = cpu_kernels();
#pragma omp parallel for schedule(static) if (T * D >= (int64_t{1} << 16))
  for (int64_t t = 0; t < T; ++t) dequantize_held(k, table.type, row_ptr(table, ids[t]), y + t * D, D);
}

}  // namespace bp::cpu
