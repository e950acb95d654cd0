// Small elementwise ops the model needs between the big ones (f32, same shapes).
#pragma once

#include "core/tensor.h"

namespace bp {

void add_inplace(Tensor& y, const Tensor& x);            // y += x
void axpy_inplace(Tensor& y, float a, const Tensor& x);  // y += a·x
void scale_inplace(Tensor& y, float a);                  // y *= a
void add_bias_inplace(Tensor& y /* [T, N] */, const Tensor& b /* [N] */);
void bias_grad_accumulate(const Tensor& dy /* [T, N] */, Tensor& db /* [N] */);  // db += Σ_t dy[t]
// dst (bf16) = src (f32) rounded to nearest even, same shape and device: the bf16 GEMM copy of a
// trainable matrix (model/transformer.h, training.matmul_dtype).
void round_to_bf16(const Tensor& src, Tensor& dst);

}  // namespace bp
