// CPU kernels for linear (contract: ops/linear.h). Row-major raw pointers; the front-end has
// checked shapes. GEMMs go through bp::cpu::sgemm (OpenBLAS); the elementwise loops use OpenMP,
// never around a BLAS call.
#pragma once

#include <cstdint>

namespace bp::cpu {

// Deterministic dropout mask bit for element `index` of a LoRA input under `seed`: a
// counter-based hash (splitmix64 of the mixed seed and the index), so a recompute of the
// forward (or the backward) regenerates the same mask without storing it. True = kept.
bool dropout_keep(uint64_t seed, uint64_t index, float p);

// xd[i] = keep(i) ? x[i] / (1 - p) : 0 for i < n.
void dropout_forward(const float* x, float* xd, int64_t n, float p, uint64_t seed);
// dx[i] += keep(i) ? g[i] / (1 - p) : 0 (the backward of dropout_forward, accumulated into dx).
// x and xd are the forward's input and output: xd[i] != 0 means kept and x[i] != 0 == xd[i]
// means dropped (scaling by 1/(1-p) >= 1 cannot underflow), so the hash is only re-evaluated
// where x[i] == 0 exactly.
void dropout_backward_accumulate(const float* g, const float* x, const float* xd, float* dx, int64_t n, float p,
                                 uint64_t seed);

// y[T,out] = x[T,in]·W[out,in]ᵀ (+ bias[out] when non-null).
void linear_base_forward(const float* x, const float* W, const float* bias, float* y, int64_t T, int64_t in,
                         int64_t out);
// xa[T,r] = xd[T,in]·A[r,in]ᵀ ;  y[T,out] += scale · xa·B[out,r]ᵀ
void lora_forward(const float* xd, const float* A, const float* B, float scale, float* xa, float* y, int64_t T,
                  int64_t in, int64_t out, int64_t r);

// dx[T,in] = dy[T,out]·W[out,in] + beta·dx   (beta 0: overwritten, dx not read; beta 1: accumulated)
void linear_dx(const float* dy, const float* W, float beta, float* dx, int64_t T, int64_t in, int64_t out);
// dW[out,in] += dyᵀ·x
void linear_dW_accumulate(const float* dy, const float* x, float* dW, int64_t T, int64_t in, int64_t out);

}  // namespace bp::cpu
