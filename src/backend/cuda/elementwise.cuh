// CUDA elementwise kernels of the linear layer and the optimizer step (contracts: ops/elementwise.h,
// ops/linear.h; CPU siblings: backend/cpu/elementwise.cpp, backend/cpu/linear.cpp). All f32.
//   axpy_inplace:         y += a·x (add_inplace is a = 1: 1·x is exact)           grid-stride
//   scale_inplace:        y *= a                                                   grid-stride
//   add_bias_inplace:     y[t, j] += b[j]                                          grid-stride
//   bias_grad_accumulate: db[j] += Σ_t dy[t, j], the tokens split over a block's thread rows and
//                         summed in a fixed order (column_sum.cuh; deterministic, no atomics)  (+=)
//   column_scale_add:     y[t, j] += c[j]·z[t, j] (DoRA's scaled output)          grid-stride
//   column_dot_accumulate: acc[j] += w[j]·Σ_t a[t, j]·b[t, j] (DoRA's magnitude gradient; column_sum.cuh) (+=)
//   dora_column_scale:    inv_n[j] = 1/sqrt(nsq[j]), c[j] = m[j]·inv_n[j]          grid-stride
//   convert_bf16_to_f32:  bf16 rows widened to f32 (a held embedding's gathered rows, a bf16 head)
//   convert_f32_to_bf16:  an f32 activation rounded to nearest even bf16 (__float2bfloat16): the
//                         activation operand of a bf16 GEMM against a frozen weight
//   convert_f32_to_f16_scaled: the f16 activation operand of a Turing card's GEMM: max|x| on the
//                         device, then x·2^s rounded to nearest even f16 with s putting max|x| in
//                         [2^13, 2^14) (exact: a power of two); s is chosen on the device too and
//                         the caller's GEMM reads alpha = 2^-s from device memory (no wait)
// (LoRA dropout: lora_dropout.cuh, fused into the LoRA products.)
// Products use __fmul_rn/__fadd_rn: no FMA contraction, so the rounding is the CPU kernel's.
// Compiled by nvcc through elementwise.cu, and as host C++ on the CPU simulation in tests/cuda.
#pragma once

#include <cmath>
#include <cstring>

#include "backend/cuda/column_sum.cuh"
#include "backend/cuda/cuda_compat.cuh"
#include "backend/cuda/gemm_desc.h"

namespace bp::BP_CUDA_NS {

__global__ void axpy_kernel(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __fadd_rn(y[i], __fmul_rn(a, x[i]));
}

__global__ void scale_kernel(float* y, float a, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __fmul_rn(y[i], a);
}

__global__ void add_bias_kernel(float* y, const float* b, int64_t n, int64_t N) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __fadd_rn(y[i], b[i % N]);
}

// db[j] += Σ_t dy[t, j] (column_sum.cuh: rows split over a block's thread rows, fixed order)
struct BiasGradTerm {
  const float* dy;
  int64_t N;
  __device__ float operator()(int64_t t, int64_t j) const { return dy[t * N + j]; }
};

__global__ void column_scale_add_kernel(float* y, const float* c, const float* z, int64_t n, int64_t N) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = __fadd_rn(y[i], __fmul_rn(c[i % N], z[i]));
}

// a[t, j]·b[t, j], summed over t by column_sum_kernel (which applies the column's weight).
struct ColumnDotTerm {
  const float* a;
  const float* b;
  int64_t N;
  __device__ float operator()(int64_t t, int64_t j) const { return __fmul_rn(a[t * N + j], b[t * N + j]); }
};

__global__ void dora_column_scale_kernel(const float* m, const float* nsq, float* c, float* inv_n, int64_t N) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < N;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float r = __fdiv_rn(1.0f, __fsqrt_rn(nsq[j]));
    inv_n[j] = r;
    c[j] = __fmul_rn(m[j], r);
  }
}

__global__ void bf16_to_f32_kernel(const bf16* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}

__global__ void f32_to_bf16_kernel(const float* src, bf16* dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16(src[i]);
}

// *result = max over i of the bits of |x[i]| (non-negative f32 bit patterns order as the values do,
// NaN above Inf); *result starts at 0.
__global__ void abs_max_bits_kernel(const float* x, int64_t n, int* result) {
  int m = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int a = abs_bits(x[i]);
    m = a > m ? a : m;
  }
  warp_atomic_max(m, result);
}

__global__ void f32_to_f16_scaled_kernel(const float* src, f16* dst, int64_t n, const gemm::F16OperandScale* s) {
  const float scale = s->scale;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __float2half(__fmul_rn(src[i], scale));
}

BP_HOST_FN void axpy_inplace(float* y, float a, const float* x, int64_t n, cudaStream_t stream = nullptr) {
  if (n > 0) BP_LAUNCH(elementwise_blocks(n), 256, 0, stream, axpy_kernel)(y, a, x, n);
}
BP_HOST_FN void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream = nullptr) {
  axpy_inplace(y, 1.0f, x, n, stream);
}
BP_HOST_FN void scale_inplace(float* y, float a, int64_t n, cudaStream_t stream = nullptr) {
  if (n > 0) BP_LAUNCH(elementwise_blocks(n), 256, 0, stream, scale_kernel)(y, a, n);
}
BP_HOST_FN void add_bias_inplace(float* y, const float* b, int64_t T_tokens, int64_t N, cudaStream_t stream = nullptr) {
  if (T_tokens * N > 0)
    BP_LAUNCH(elementwise_blocks(T_tokens * N), 256, 0, stream, add_bias_kernel)(y, b, T_tokens * N, N);
}
BP_HOST_FN void bias_grad_accumulate(const float* dy, float* db, int64_t T_tokens, int64_t N,
                                     cudaStream_t stream = nullptr) {
  column_sum_accumulate(BiasGradTerm{dy, N}, db, T_tokens, N, stream);
}
BP_HOST_FN void column_scale_add(float* y, const float* c, const float* z, int64_t T_tokens, int64_t N,
                                 cudaStream_t stream = nullptr) {
  if (T_tokens * N > 0)
    BP_LAUNCH(elementwise_blocks(T_tokens * N), 256, 0, stream, column_scale_add_kernel)(y, c, z, T_tokens * N, N);
}
BP_HOST_FN void column_dot_accumulate(const float* a, const float* b, const float* w, float* acc, int64_t T_tokens,
                                      int64_t N, cudaStream_t stream = nullptr) {
  column_sum_accumulate(ColumnDotTerm{a, b, N}, acc, T_tokens, N, stream, w);
}
BP_HOST_FN void dora_column_scale(const float* m, const float* nsq, float* c, float* inv_n, int64_t N,
                                  cudaStream_t stream = nullptr) {
  if (N > 0) BP_LAUNCH(elementwise_blocks(N), 256, 0, stream, dora_column_scale_kernel)(m, nsq, c, inv_n, N);
}
BP_HOST_FN void convert_bf16_to_f32(const bf16* src, float* dst, int64_t n, cudaStream_t stream = nullptr) {
  if (n > 0) BP_LAUNCH(elementwise_blocks(n), 256, 0, stream, bf16_to_f32_kernel)(src, dst, n);
}
BP_HOST_FN void convert_f32_to_bf16(const float* src, bf16* dst, int64_t n, cudaStream_t stream = nullptr) {
  if (n > 0) BP_LAUNCH(elementwise_blocks(n), 256, 0, stream, f32_to_bf16_kernel)(src, dst, n);
}
// The exponent s with max|x|·2^s in [2^13, 2^14): f16's largest value 65504 is two doublings
// above (f32 sums of such products stay far from overflow), and values down to 2^-38 of the max
// keep at least one bit (f16's subnormals reach 2^-24). 0 for a zero, Inf or NaN maximum (those
// reach the GEMM as they are, and the run's non-finite check); clamped so that 2^s and 2^-s are
// normal f32. From the bits of max|x| (integer arithmetic: the same on the host and the device;
// e is frexp's exponent, max|x| = f·2^e with f in [0.5, 1)).
constexpr int kMaxF16ScaleExponent = 120;
__host__ __device__ __forceinline__ int f16_scale_exponent_of_bits(uint32_t abs_bits) {
  if (abs_bits == 0u || abs_bits >= 0x7f800000u) return 0;  // zero, Inf, NaN
  int e = 0;
  if (abs_bits >= 0x00800000u) {
    e = static_cast<int>(abs_bits >> 23) - 126;  // normal: 1.m·2^(E−127) = 0.1m·2^(E−126)
  } else {
    int bit_length = 0;  // subnormal: m·2^−149 with m of bit_length bits
    for (uint32_t m = abs_bits; m != 0u; m >>= 1) ++bit_length;
    e = bit_length - 149;
  }
  const int s = 14 - e;
  return s < -kMaxF16ScaleExponent ? -kMaxF16ScaleExponent : s > kMaxF16ScaleExponent ? kMaxF16ScaleExponent : s;
}
BP_HOST_FN int f16_scale_exponent(float abs_max) {
  if (!(abs_max > 0.0f)) return 0;
  uint32_t bits;
  memcpy(&bits, &abs_max, 4);
  return f16_scale_exponent_of_bits(bits);
}
// 2^s as f32 bits, for |s| <= kMaxF16ScaleExponent (normal: exact).
__host__ __device__ __forceinline__ float pow2_normal(int s) {
  const uint32_t bits = static_cast<uint32_t>(s + 127) << 23;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
// One thread: the operand's scale from the reduction's max|x| (scale->abs_max_bits).
__global__ void f16_scale_kernel(gemm::F16OperandScale* scale) {
  const int s = f16_scale_exponent_of_bits(static_cast<uint32_t>(scale->abs_max_bits));
  const float down = pow2_normal(-s);
  scale->scale = pow2_normal(s);
  scale->alpha_beta_overwrite[0] = down;
  scale->alpha_beta_overwrite[1] = 0.0f;
  scale->alpha_beta_accumulate[0] = down;
  scale->alpha_beta_accumulate[1] = 1.0f;
}
// dst = src·2^s as f16 (s = f16_scale_exponent(max|src|)), all on the device: `scale` (device
// memory) receives max|src|, 2^s and the (alpha, beta) pairs, alpha = 2^-s, that the GEMMs reading
// dst take in device pointer mode (GemmDesc::alpha_beta_on_device, f16_alpha_beta_on_device).
// Nothing is read back: the host never waits for the card here.
BP_HOST_FN void convert_f32_to_f16_scaled(const float* src, f16* dst, int64_t n, gemm::F16OperandScale* scale,
                                          cudaStream_t stream = nullptr) {
  int* max_bits =
      reinterpret_cast<int*>(reinterpret_cast<char*>(scale) + offsetof(gemm::F16OperandScale, abs_max_bits));
  cudaMemsetAsync(max_bits, 0, sizeof(int), stream);
  if (n > 0) BP_LAUNCH(elementwise_blocks(n), 256, 0, stream, abs_max_bits_kernel)(src, n, max_bits);
  BP_LAUNCH(1, 1, 0, stream, f16_scale_kernel)(scale);
  if (n > 0) BP_LAUNCH(elementwise_blocks(n), 256, 0, stream, f32_to_f16_scaled_kernel)(src, dst, n, scale);
}

}  // namespace bp::BP_CUDA_NS
