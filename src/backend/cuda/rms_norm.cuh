// CUDA RMSNorm (contract: ops/rms_norm.h; CPU sibling: backend/cpu/rms_norm.cpp). x, y, dy, dx:
// [N, D] stored as T (float, or bf16 for activations); w, dw: [D] f32 (trainable weights keep f32
// masters); rstd: [N] f32, saved by the forward for the backward. Every sum is in f32.
//   forward:  one block per row: Σx² (block_sum), rstd = 1/sqrt(Σx²/D + eps), y = x·rstd·w, and
//             when y16 is given y rounded to nearest-even bf16 too (the bf16 GEMMs' operand)
//   backward: one block per row: s = Σ w⊙dy⊙x, dx = rstd·(w⊙dy) − x·rstd³·s/D   (=, or +=), and
//             dx's bf16 copy when dx16 is given
//             dw += Σ_n dy⊙x·rstd: the rows split over a block's thread rows, summed in a
//             fixed order (column_sum.cuh; deterministic: no atomics)   (+=)
// Compiled by nvcc through rms_norm.cu, and as host C++ on the CPU simulation in tests/cuda.
#pragma once

#include "backend/cuda/column_sum.cuh"
#include "backend/cuda/cuda_compat.cuh"

namespace bp::BP_CUDA_NS {

constexpr int kRmsNormThreads = 256;

template <class T>
__global__ void rms_norm_forward_kernel(const T* x, const float* w, float eps, T* y, bf16* y16, float* rstd,
                                        int64_t D) {
  __shared__ float scratch[32];
  const T* xr = x + blockIdx.x * D;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = load_f32(xr[i]);
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float r = rsqrtf(ss / static_cast<float>(D) + eps);
  if (rstd && threadIdx.x == 0) rstd[blockIdx.x] = r;
  T* yr = y + blockIdx.x * D;
  bf16* hr = y16 ? y16 + blockIdx.x * D : nullptr;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) store_with_bf16(yr, hr, i, load_f32(xr[i]) * r * w[i]);
}

template <class T>
__global__ void rms_norm_backward_dx_kernel(const T* dy, const T* x, const float* w, const float* rstd, T* dx,
                                            bf16* dx16, int64_t D, bool accumulate) {
  __shared__ float scratch[32];
  const T* dyr = dy + blockIdx.x * D;
  const T* xr = x + blockIdx.x * D;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s += w[i] * load_f32(dyr[i]) * load_f32(xr[i]);
  s = block_sum(s, scratch);
  const float r = rstd[blockIdx.x];
  const float c = r * r * r * s / static_cast<float>(D);
  T* dxr = dx + blockIdx.x * D;
  bf16* hr = dx16 ? dx16 + blockIdx.x * D : nullptr;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = r * w[i] * load_f32(dyr[i]) - load_f32(xr[i]) * c;
    store_with_bf16(dxr, hr, i, accumulate ? load_f32(dxr[i]) + v : v);
  }
}

// dw[i] += Σ_n dy[n, i]·x[n, i]·rstd[n] (column_sum.cuh: rows split over a block's thread rows, fixed order)
template <class T>
struct RmsNormDwTerm {
  const T* dy;
  const T* x;
  const float* rstd;
  int64_t D;
  __device__ float operator()(int64_t n, int64_t i) const {
    return load_f32(dy[n * D + i]) * load_f32(x[n * D + i]) * rstd[n];
  }
};

template <class T>
void rms_norm_forward(const T* x, const float* w, float eps, T* y, bf16* y16, float* rstd, int64_t N, int64_t D,
                      cudaStream_t stream = nullptr) {
  if (N == 0) return;
  BP_LAUNCH(static_cast<unsigned>(N), kRmsNormThreads, 0, stream, rms_norm_forward_kernel<T>)
  (x, w, eps, y, y16, rstd, D);
}

template <class T>
void rms_norm_backward(const T* dy, const T* x, const float* w, const float* rstd, T* dx, bf16* dx16, float* dw,
                       int64_t N, int64_t D, bool accumulate, cudaStream_t stream = nullptr) {
  if (N == 0) return;
  BP_LAUNCH(static_cast<unsigned>(N), kRmsNormThreads, 0, stream, rms_norm_backward_dx_kernel<T>)
  (dy, x, w, rstd, dx, dx16, D, accumulate);
  if (dw) column_sum_accumulate(RmsNormDwTerm<T>{dy, x, rstd, D}, dw, N, D, stream);
}

}  // namespace bp::BP_CUDA_NS
