// CPU kernels of the optimizer ops (contract: ops/optim.h). Plain f32 loops with OpenMP.
#pragma once

#include <cstdint>

namespace bp::cpu {

// One AdamW update of n values in PyTorch's order (see ops/optim.h). step counts from 1.
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                float eps, float weight_decay, int64_t step);
// One AdamW update of n values, then copy[i] = bf16(param[i]) (nearest even) when copy is not null,
// chunk by chunk while the chunk is in cache.
void adamw_step(float* param, const float* grad, float* m, float* v, uint16_t* copy, int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, int64_t step);
// adamw_step on each of `count` tensors (params[i], grads[i], ms[i], vs[i]: ns[i] values; copies[i]
// the bf16 GEMM copy of params[i] or null), in order.
void adamw_step_all(float* const* params, const float* const* grads, float* const* ms, float* const* vs,
                    uint16_t* const* copies, const int64_t* ns, int64_t count, float lr, float beta1, float beta2,
                    float eps, float weight_decay, int64_t step);
// ys[i] *= a for each of `count` tensors (ns[i] values): gradient clipping's scaling.
void scale_all(float* const* ys, const int64_t* ns, int64_t count, float a);
// Σ x² in double; bit-identical for any thread count (fixed blocks summed in order).
double sum_squares(const float* x, int64_t n);
// Σ over `count` tensors (xs[i] of ns[i] values) of sum_squares, added in order in double: the
// global gradient norm's sum in one call (one wait for a card instead of one per tensor).
double sum_squares_total(const float* const* xs, const int64_t* ns, int64_t count);
bool all_finite_f32(const float* x, int64_t n);
// bf16 / f16 bit patterns: non-finite when the exponent bits are all ones.
bool all_finite_16(const uint16_t* x, int64_t n, bool is_bf16);

}  // namespace bp::cpu
