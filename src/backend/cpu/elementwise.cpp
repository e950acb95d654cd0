// CPU elementwise kernels: plain loops, OpenMP over elements (rows for the bias ops). The
// reductions (bias_grad_accumulate) split work by column so every sum runs in a fixed order
// and results do not depend on the thread count.
#include "backend/cpu/elementwise.h"

#include <cmath>

#include "core/dtype.h"

namespace bp::cpu {

namespace {
// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 14;
}  // namespace

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void axpy_inplace(float* y, float a, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scale_inplace(float* y, float a, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

void round_to_bf16(const float* src, uint16_t* dst, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void round_to_bf16_serial(const float* src, uint16_t* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void add_bias_inplace(float* y, const float* b, int64_t T, int64_t N) {
#pragma omp parallel for schedule(static) if (T * N >= kParallelMin)
  for (int64_t t = 0; t < T; ++t) {
    float* row = y + t * N;
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) row[j] += b[j];
  }
}

namespace {
// out[j] += w[j]·Σ_t a[t, j]·b[t, j] (b null: a alone; w null: 1). Column blocks of 64 floats: each
// thread owns whole columns and walks the tokens in order (deterministic, any thread count).
void column_sums(const float* a, const float* b, const float* w, float* out, int64_t T, int64_t N) {
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (N + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (T * N >= kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t j0 = blk * kBlock, j1 = j0 + kBlock < N ? j0 + kBlock : N;
    float acc[kBlock] = {};
    for (int64_t t = 0; t < T; ++t) {
      const float* ar = a + t * N;
      if (b) {
        const float* br = b + t * N;
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] += ar[j] * br[j];
      } else {
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) acc[j - j0] += ar[j];
      }
    }
    for (int64_t j = j0; j < j1; ++j) out[j] += w ? w[j] * acc[j - j0] : acc[j - j0];
  }
}
}  // namespace

void bias_grad_accumulate(const float* dy, float* db, int64_t T, int64_t N) {
  column_sums(dy, nullptr, nullptr, db, T, N);
}

void column_scale_add(float* y, const float* c, const float* z, int64_t T, int64_t N) {
#pragma omp parallel for schedule(static) if (T * N >= kParallelMin)
  for (int64_t t = 0; t < T; ++t) {
    float* row = y + t * N;
    const float* zr = z + t * N;
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) row[j] += c[j] * zr[j];
  }
}

void column_dot_accumulate(const float* a, const float* b, const float* w, float* acc, int64_t T, int64_t N) {
  column_sums(a, b, w, acc, T, N);
}

void dora_column_scale(const float* m, const float* nsq, float* c, float* inv_n, int64_t N) {
  for (int64_t j = 0; j < N; ++j) {
    inv_n[j] = 1.0f / std::sqrt(nsq[j]);
    c[j] = m[j] * inv_n[j];
  }
}

}  // namespace bp::cpu
