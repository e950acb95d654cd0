// CPU kernels for the small elementwise ops (contract: ops/elementwise.h). OpenMP loops.
#pragma once

#include <cstdint>

namespace bp::cpu {

void add_inplace(float* y, const float* x, int64_t n);            // y += x
void axpy_inplace(float* y, float a, const float* x, int64_t n);  // y += a·x
void scale_inplace(float* y, float a, int64_t n);                 // y *= a
void add_bias_inplace(float* y, const float* b, int64_t T, int64_t N);
// db[N] += Σ_t dy[t, :]. Parallel over columns, each column summed in token order: deterministic.
void bias_grad_accumulate(const float* dy, float* db, int64_t T, int64_t N);
// DoRA (ops/linear.h): y[t, j] += c[j]·z[t, j] (the magnitude over the norm times the combined
// output); acc[j] += w[j]·Σ_t a[t, j]·b[t, j] (w null: 1), each column summed in token order;
// inv_n[j] = 1/sqrt(nsq[j]) and c[j] = m[j]·inv_n[j].
void column_scale_add(float* y, const float* c, const float* z, int64_t T, int64_t N);
void column_dot_accumulate(const float* a, const float* b, const float* w, float* acc, int64_t T, int64_t N);
void dora_column_scale(const float* m, const float* nsq, float* c, float* inv_n, int64_t N);
// dst[i] = src[i] rounded to nearest-even bf16 (core/dtype.h f32_to_bf16: NaN stays NaN).
void round_to_bf16(const float* src, uint16_t* dst, int64_t n);
// The same on the calling thread: for loops that already own the threads and round a chunk of
// their output while it is in cache (AdamW's GEMM copies, the RMSNorm and SwiGLU bf16 outputs).
void round_to_bf16_serial(const float* src, uint16_t* dst, int64_t n);

}  // namespace bp::cpu
