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

template <class T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* h, bf16* h16, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = load_f32(gate[i]);
    store_with_bf16(h, h16, i, g * sigmoid_f32(g) * load_f32(up[i]));
  }
}

template <class T>
__global__ void swiglu_backward_kernel(const T* dh, const T* gate, const T* up, T* dgate, T* dup, bf16* dgate16,
                                       bf16* dup16, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = load_f32(gate[i]), u = load_f32(up[i]), d = load_f32(dh[i]);
    const float s = sigmoid_f32(g);
    store_with_bf16(dgate, dgate16, i, d * u * s * (1.0f + g * (1.0f - s)));
    store_with_bf16(dup, dup16, i, d * g * s);
  }
}

constexpr float kGeluK = 0.7978845608028654f, kGeluA = 0.044715f;

template <class T>
__global__ void geglu_forward_kernel(const T* gate, const T* up, T* h, bf16* h16, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = load_f32(gate[i]);
    const float t = tanhf(kGeluK * (g + kGeluA * g * g * g));
    store_with_bf16(h, h16, i, 0.5f * g * (1.0f + t) * load_f32(up[i]));
  }
}

template <class T>
__global__ void geglu_backward_kernel(const T* dh, const T* gate, const T* up, T* dgate, T* dup, bf16* dgate16,
                                      bf16* dup16, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = load_f32(gate[i]), u = load_f32(up[i]), d = load_f32(dh[i]);
    const float t = tanhf(kGeluK * (g + kGeluA * g * g * g));
    const float dact = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluA * g * g);
    store_with_bf16(dgate, dgate16, i, d * u * dact);
    store_with_bf16(dup, dup16, i, d * 0.5f * g * (1.0f + t));
  }
}

template <class T>
void geglu_forward(const T* gate, const T* up, T* h, bf16* h16, int64_t n, cudaStream_t stream = nullptr) {
  if (n > 0) BP_LAUNCH(elementwise_blocks(n), 256, 0, stream, geglu_forward_kernel<T>)(gate, up, h, h16, n);
}

template <class T>
void geglu_backward(const T* dh, const T* gate, const T* up, T* dgate, T* dup, bf16* dgate16, bf16* dup16, int64_t n,
                    cudaStream_t stream = nullptr) {
  if (n > 0) BP_LAUNCH(elementwise_blocks(n), 256, 0, stream, geglu_backward_kernel<T>)
  (dh, gate, up, dgate, dup, dgate16, dup16, n);
}

template <class T>
void swiglu_forward(const T* gate, const T* up, T* h, bf16* h16, int64_t n, cudaStream_t stream = nullptr) {
  if (n > 0) BP_LAUNCH(elementwise_blocks(n), 256, 0, stream, swiglu_forward_kernel<T>)(gate, up, h, h16, n);
}

template <class T>
void swiglu_backward(const T* dh, const T* gate, const T* up, T* dgate, T* dup, bf16* dgate16, bf16* dup16, int64_t n,
                     cudaStream_t stream = nullptr) {
  if (n > 0) BP_LAUNCH(elementwise_blocks(n), 256, 0, stream, swiglu_backward_kernel<T>)
  (dh, gate, up, dgate, dup, dgate16, dup16, n);
}

}  // namespace bp::BP_CUDA_NS
