// SwiGLU: h = silu(gate) · up,  silu(g) = g·sigmoid(g).  gate, up, h: [T, F].
// Saved: gate and up (kept by the caller). Gradients: dgate (=), dup (=).
#pragma once

#include "core/tensor.h"

namespace bp {

Tensor swiglu_forward(const Tensor& gate, const Tensor& up);
void swiglu_backward(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup);

}  // namespace bp
