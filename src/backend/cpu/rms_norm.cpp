// CPU RMSNorm. Rows are independent: forward and dx run in parallel over rows; the row
// reductions accumulate in double (D up to 8192 f32 terms). dw sums over rows, so it is split
// by column blocks instead, each summed in row order: no races and results independent of the
// thread count.
//
// Math, per row with r = rstd, g = w⊙dy:
//   y_j = x_j·r·w_j,   r = (Σx²/D + eps)^(-1/2),   ∂r/∂x_k = −r³·x_k/D
//   dx_k = r·g_k − x_k·r³/D·Σ_j g_j·x_j
//   dw_j = Σ_rows dy_j·x_j·r
#include "backend/cpu/rms_norm.h"

#include <cmath>

#include "backend/cpu/elementwise.h"  // round_to_bf16_serial

namespace bp::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 14;
}

void rms_norm_forward(const float* x, const float* w, float eps, float* y, uint16_t* y_bf16, float* rstd, int64_t N,
                      int64_t D) {
#pragma omp parallel for schedule(static) if (N * D >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * D;
    float* yr = y + n * D;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < D; ++j) ss += static_cast<double>(xr[j]) * xr[j];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
    if (rstd) rstd[n] = r;
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) yr[j] = xr[j] * r * w[j];
    if (y_bf16) round_to_bf16_serial(yr, y_bf16 + n * D, D);
  }
}

void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, uint16_t* dx_bf16,
                       float* dw, int64_t N, int64_t D, bool accumulate) {
#pragma omp parallel for schedule(static) if (N * D >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * D;
    const float* gr = dy + n * D;
    float* dxr = dx + n * D;
    const float r = rstd[n];
    double dot = 0.0;  // Σ w_j·dy_j·x_j
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < D; ++j) dot += static_cast<double>(w[j]) * gr[j] * xr[j];
    const float c = static_cast<float>(dot * r * r * r / static_cast<double>(D));
    if (accumulate) {
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) dxr[j] += r * w[j] * gr[j] - xr[j] * c;
    } else {
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) dxr[j] = r * w[j] * gr[j] - xr[j] * c;
    }
    if (dx_bf16) round_to_bf16_serial(dxr, dx_bf16 + n * D, D);
  }
  if (!dw) return;
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (D + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (N * D >= kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = j0 + kBlock < D ? j0 + kBlock : D;
    double acc[kBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * D;
      const float* gr = dy + n * D;
      const double r = rstd[n];
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) acc[j - j0] += static_cast<double>(gr[j]) * xr[j] * r;
    }
    for (int64_t j = j0; j < j1; ++j) dw[j] += static_cast<float>(acc[j - j0]);
  }
}

}  // namespace bp::cpu
