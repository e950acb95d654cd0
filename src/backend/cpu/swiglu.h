// CPU kernels for SwiGLU (contract: ops/swiglu.h). All arrays have n elements.
#pragma once

#include <cstdint>

namespace bp::cpu {

// h = silu(g)·u
void swiglu_forward(const float* gate, const float* up, float* h, int64_t n);
// dgate = dh·u·σ(g)·(1 + g·(1 − σ(g))),  dup = dh·silu(g)   (both =)
void swiglu_backward(const float* dh, const float* gate, const float* up, float* dgate, float* dup, int64_t n);

}  // namespace bp::cpu
