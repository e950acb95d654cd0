// CUDA SwiGLU (contract: ops/swiglu.h; CPU sibling: backend/cpu/swiglu.cpp). Elementwise over n
// values stored as T (float or bf16), computed in f32; the outputs optionally also as nearest-even
// bf16 (h16, dgate16, dup16 non-null: the operands of the bf16 GEMMs that read them, ops/swiglu.h):
//   forward:  h = silu(g)·u = g·σ(g)·u
//   backward: dgate = dh·u·σ(g)·(1 + g·(1 − σ(g))),  dup = dh·silu(g)   (both =)
// GeGLU (Gemma's MLP), the same layout with gelu_tanh(g) = g/2·(1 + tanh(k·(g + 0.044715·g³))),
// k = sqrt(2/π), in place of silu (CPU sibling: backend/cpu/swiglu.h geglu_*).
// Grid-stride loops, so any n fits one launch.
#pragma once

#include "backend/cuda/cuda_compat.cuh"

namespace bp::BP_CUDA_NS {

__device__ __forceinline__ float sigmoid_f32(float g) {
  return 1.0f / (1.0f + expf(-g));
}

// The two gates, as functors of one pair of kernels: act(g) the activation, grad() both
// derivatives, each written in the order of the CPU sibling's arithmetic.
struct SiluGate {
  __device__ static float act(float g) { return g * sigmoid_f32(g); }
  __device__ static void grad(float d, float g, float u, float* dgate, float* dup) {
    const float s = sigmoid_f32(g);
    *dgate = d * u * s * (1.0f + g * (1.0f - s));
    *dup = d * g * s;
  }
};

constexpr float kGeluK = 0.7978845608028654f, kGeluA = 0.044715f;

struct GeluTanhGate {
  __device__ static float act(float g) { return 0.5f * g * (1.0f + tanhf(kGeluK * (g + kGeluA * g * g * g))); }
  __device__ static void grad(float d, float g, float u, float* dgate, float* dup) {
    const float t = tanhf(kGeluK * (g + kGeluA * g * g * g));
    const float dact = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluA * g * g);
    *dgate = d * u * dact;
    *dup = d * 0.5f * g * (1.0f + t);
  }
};

template <class Gate, class T>
__global__ void gated_forward_kernel(const T* gate, const T* up, T* h, bf16* h16, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_with_bf16(h, h16, i, Gate::act(load_f32(gate[i])) * load_f32(up[i]));
}

template <class Gate, class T>
__global__ void gated_backward_kernel(const T* dh, const T* gate, const T* up, T* dgate, T* dup, bf16* dgate16,
                                      bf16* dup16, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float dg, du;
    Gate::grad(load_f32(dh[i]), load_f32(gate[i]), load_f32(up[i]), &dg, &du);
    store_with_bf16(dgate, dgate16, i, dg);
    store_with_bf16(dup, dup16, i, du);
  }
}

template <class Gate, class T>
void gated_forward(const T* gate, const T* up, T* h, bf16* h16, int64_t n, cudaStream_t stream = nullptr) {
  if (n > 0) BP_LAUNCH(elementwise_blocks(n), 256, 0, stream, gated_forward_kernel<Gate, T>)(gate, up, h, h16, n);
}

template <class Gate, class T>
void gated_backward(const T* dh, const T* gate, const T* up, T* dgate, T* dup, bf16* dgate16, bf16* dup16, int64_t n,
                    cudaStream_t stream = nullptr) {
  if (n > 0) BP_LAUNCH(elementwise_blocks(n), 256, 0, stream, gated_backward_kernel<Gate, T>)
  (dh, gate, up, dgate, dup, dgate16, dup16, n);
}

template <class T>
void swiglu_forward(const T* gate, const T* up, T* h, bf16* h16, int64_t n, cudaStream_t stream = nullptr) {
  gated_forward<SiluGate, T>(gate, up, h, h16, n, stream);
}
template <class T>
void swiglu_backward(const T* dh, const T* gate, const T* up, T* dgate, T* dup, bf16* dgate16, bf16* dup16, int64_t n,
                     cudaStream_t stream = nullptr) {
  gated_backward<SiluGate, T>(dh, gate, up, dgate, dup, dgate16, dup16, n, stream);
}
template <class T>
void geglu_forward(const T* gate, const T* up, T* h, bf16* h16, int64_t n, cudaStream_t stream = nullptr) {
  gated_forward<GeluTanhGate, T>(gate, up, h, h16, n, stream);
}
template <class T>
void geglu_backward(const T* dh, const T* gate, const T* up, T* dgate, T* dup, bf16* dgate16, bf16* dup16, int64_t n,
                    cudaStream_t stream = nullptr) {
  gated_backward<GeluTanhGate, T>(dh, gate, up, dgate, dup, dgate16, dup16, n, stream);
}

}  // namespace bp::BP_CUDA_NS
