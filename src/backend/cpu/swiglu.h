// CPU kernels for SwiGLU (contract: ops/swiglu.h). All arrays have n elements.
#pragma once

#include <cstdint>

namespace bp::cpu {

// h = silu(g)·u; h_bf16 (may be null): h rounded to nearest-even bf16 as well (ops/swiglu.h)
void swiglu_forward(const float* gate, const float* up, float* h, uint16_t* h_bf16, int64_t n);
// dgate = dh·u·σ(g)·(1 + g·(1 − σ(g))),  dup = dh·silu(g)   (both =); dgate_bf16, dup_bf16 (may
// be null): the same rounded to nearest-even bf16
void swiglu_backward(const float* dh, const float* gate, const float* up, float* dgate, float* dup,
                     uint16_t* dgate_bf16, uint16_t* dup_bf16, int64_t n);

// GeGLU (Gemma's MLP, hidden_activation gelu_pytorch_tanh): h = gelu_tanh(g)·u with
// gelu_tanh(g) = g/2·(1 + tanh(k·(g + 0.044715·g³))), k = sqrt(2/π) (torch's approximate="tanh").
// dgate = dh·u·gelu_tanh'(g),  gelu_tanh'(g) = (1 + t)/2 + g/2·(1 − t²)·k·(1 + 3·0.044715·g²), t the tanh;
// dup = dh·gelu_tanh(g)   (both =). The bf16 copies as for SwiGLU.
void geglu_forward(const float* gate, const float* up, float* h, uint16_t* h_bf16, int64_t n);
void geglu_backward(const float* dh, const float* gate, const float* up, float* dgate, float* dup, uint16_t* dgate_bf16,
                    uint16_t* dup_bf16, int64_t n);

}  // namespace bp::cpu
