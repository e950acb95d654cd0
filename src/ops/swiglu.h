// SwiGLU: h = silu(gate) · up,  silu(g) = g·sigmoid(g).  gate, up, h: [T, F].
// GeGLU (Gemma): h = gelu_tanh(gate) · up, gelu_tanh torch's gelu(approximate="tanh"); the same contract.
// Saved: gate and up (kept by the caller). Gradients: dgate (=), dup (=).
// h_bf16, dgate_bf16, dup_bf16 (outputs, may be null; allocated when undefined): the same values
// also rounded to nearest-even bf16 by the same kernel: the operands of the bf16 GEMMs that read
// them (ops/linear.h x_bf16, dy_bf16).
#pragma once

#include "core/tensor.h"

namespace bp {

Tensor swiglu_forward(const Tensor& gate, const Tensor& up, Tensor* h_bf16 = nullptr);
void swiglu_backward(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup,
                     Tensor* dgate_bf16 = nullptr, Tensor* dup_bf16 = nullptr);

Tensor geglu_forward(const Tensor& gate, const Tensor& up, Tensor* h_bf16 = nullptr);
void geglu_backward(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup,
                    Tensor* dgate_bf16 = nullptr, Tensor* dup_bf16 = nullptr);

}  // namespace bp
