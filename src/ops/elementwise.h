// Small elementwise ops the model needs between the big ones (f32, same shapes).
#pragma once

#include "core/tensor.h"

namespace bp {

void add_inplace(Tensor& y, const Tensor& x);            // y += x
void axpy_inplace(Tensor& y, float a, const Tensor& x);  // y += a·x
void scale_inplace(Tensor& y, float a);                  // y *= a
void add_bias_inplace(Tensor& y /* [T, N] */, const Tensor& b /* [N] */);
void bias_grad_accumulate(const Tensor& dy /* [T, N] */, Tensor& db /* [N] */);  // db += Σ_t dy[t]
// DoRA's per-column ops (ops/linear.h): y[t, j] += c[j]·z[t, j]; acc[j] += w[j]·Σ_t a[t, j]·b[t, j]
// (w may be null: 1; each column summed in a fixed order); inv_n = 1/sqrt(nsq), c = m·inv_n.
void column_scale_add(Tensor& y /* [T, N] */, const Tensor& c /* [N] */, const Tensor& z /* [T, N] */);
void column_dot_accumulate(const Tensor& a /* [T, N] */, const Tensor& b /* [T, N] */, const Tensor* w /* [N] */,
                           Tensor& acc /* [N] */);
void dora_column_scale(const Tensor& m, const Tensor& nsq, Tensor& c, Tensor& inv_n);  // all [N]
// dst (bf16) = src (f32) rounded to nearest even, same shape and device: the bf16 GEMM copy of a
// trainable matrix (model/transformer.h, training.matmul_dtype).
void round_to_bf16(const Tensor& src, Tensor& dst);

}  // namespace bp
