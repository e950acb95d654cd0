// CUDA optimizer kernels (contract: ops/optim.h; CPU sibling: backend/cpu/optim.cpp). All f32:
// trainable weights keep f32 masters and AdamW keeps m and v in f32 (the issue's choice; bf16
// state loses small updates).
//   adamw_step:   PyTorch's order, the same float operations as the CPU kernel
//                 (kernel_variants_impl.h adamw), host-side constants computed as optim.cpp does;
//   sum_squares:  Σ x² in double, deterministic: each block sums a fixed slice into a partial
//                 (threads stride, then a fixed shuffle/shared-memory tree), and one block adds
//                 the partials in order; the result is copied to the host;
//   sum_squares_total: the same over a list of tensors, their sums added in order on the device:
//                 one copy back for the global gradient norm however many tensors it covers;
//   all_finite:   any thread that sees a non-finite value sets a flag (atomicOr); the host reads it.
// Device scratch (partials, flag) is the caller's: optim_scratch_bytes(n) of device memory.
#pragma once

#include <cmath>

#include "backend/cuda/cuda_compat.cuh"

namespace bp::BP_CUDA_NS {

constexpr int kReduceThreads = 256;
constexpr int kReduceMaxBlocks = 1024;

BP_HOST_FN int reduce_blocks(int64_t n) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((n + kReduceThreads - 1) / kReduceThreads, kReduceMaxBlocks)));
}
// Device bytes sum_squares / all_finite need as scratch for n values.
BP_HOST_FN size_t optim_scratch_bytes(int64_t n) {
  return sizeof(double) * (reduce_blocks(n) + 1) + sizeof(unsigned);
}

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n, float decay, float beta1,
                             float beta2, float one_minus_b1, float one_minus_b2, float step_size, float bc2_sqrt,
                             float eps) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = grad[i];
    float p = __fmul_rn(param[i], decay);
    // __fmul_rn/__fadd_rn: no FMA contraction, so the rounding is the CPU kernel's.
    const float mi = __fadd_rn(__fmul_rn(m[i], beta1), __fmul_rn(one_minus_b1, g));
    const float vi = __fadd_rn(__fmul_rn(v[i], beta2), __fmul_rn(one_minus_b2, __fmul_rn(g, g)));
    const float denom = __fadd_rn(sqrtf(vi) / bc2_sqrt, eps);
    p = __fsub_rn(p, __fmul_rn(step_size, mi / denom));
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
  }
}

BP_HOST_FN void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                           float beta2, float eps, float weight_decay, int64_t step, cudaStream_t stream = nullptr) {
  if (n <= 0) return;
  const double lr_d = lr, b1 = beta1, b2 = beta2;
  const float decay = static_cast<float>(1.0 - lr_d * static_cast<double>(weight_decay));
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535));
  BP_LAUNCH(blocks, 256, 0, stream, adamw_kernel)
  (param, grad, m, v, n, decay, beta1, beta2, static_cast<float>(1.0 - b1), static_cast<float>(1.0 - b2),
   static_cast<float>(lr_d / bc1), static_cast<float>(std::sqrt(bc2)), eps);
}

__device__ __forceinline__ double warp_sum_f64(double v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Block b sums elements b, b + B, b + 2B, ... of each thread's stride into partial[b].
template <class T>
__global__ void sum_squares_kernel(const T* x, int64_t n, double* partial) {
  __shared__ double scratch[32];
  double s = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = load_f32(x[i]);
    s += v * v;
  }
  s = warp_sum_f64(s);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    double t = threadIdx.x < blockDim.x / 32 ? scratch[threadIdx.x] : 0.0;
    t = warp_sum_f64(t);
    if (threadIdx.x == 0) partial[blockIdx.x] = t;
  }
}

// *total = Σ values in order, in double, by one thread (a reduction's partials, or one sum per tensor).
__global__ void sum_partials_kernel(const double* partial, int64_t n_partial, double* total) {
  double s = 0.0;
  for (int64_t i = 0; i < n_partial; ++i) s += partial[i];
  *total = s;
}

// `scratch` is device memory of optim_scratch_bytes(n). Returns Σ x² (synchronises the stream).
template <class T>
double sum_squares(const T* x, int64_t n, void* scratch, cudaStream_t stream = nullptr) {
  if (n <= 0) return 0.0;
  const int blocks = reduce_blocks(n);
  double* partial = static_cast<double*>(scratch);
  BP_LAUNCH(static_cast<unsigned>(blocks), kReduceThreads, 0, stream, sum_squares_kernel<T>)(x, n, partial);
  BP_LAUNCH(1, 1, 0, stream, sum_partials_kernel)(partial, blocks, partial + blocks);
  double total = 0.0;
  cudaMemcpyAsync(&total, partial + blocks, sizeof(double), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  return total;
}

// Device scratch sum_squares_total needs: the partials of the largest tensor (max_n values), one
// sum per tensor and the total.
BP_HOST_FN size_t sum_squares_total_scratch_bytes(int64_t max_n, int64_t count) {
  return sizeof(double) * (static_cast<size_t>(reduce_blocks(max_n)) + static_cast<size_t>(count) + 1);
}

// Σ over `count` tensors (xs[i]: ns[i] device values) of Σ x²: each tensor reduced on the device
// exactly as sum_squares does, into its own slot, and the slots added in order in double by one
// thread (what a host loop adding sum_squares results does); one copy back, one synchronisation.
// `xs` and `ns` are host arrays; `scratch`: sum_squares_total_scratch_bytes(max ns, count).
template <class T>
double sum_squares_total(const T* const* xs, const int64_t* ns, int64_t count, void* scratch,
                         cudaStream_t stream = nullptr) {
  if (count <= 0) return 0.0;
  int64_t max_n = 0;
  for (int64_t i = 0; i < count; ++i) max_n = std::max(max_n, ns[i]);
  double* partial = static_cast<double*>(scratch);
  double* per_tensor = partial + reduce_blocks(max_n);
  double* total = per_tensor + count;
  cudaMemsetAsync(per_tensor, 0, static_cast<size_t>(count) * sizeof(double), stream);  // empty tensors: 0
  for (int64_t i = 0; i < count; ++i) {
    if (ns[i] <= 0) continue;
    const int blocks = reduce_blocks(ns[i]);
    BP_LAUNCH(static_cast<unsigned>(blocks), kReduceThreads, 0, stream, sum_squares_kernel<T>)(xs[i], ns[i], partial);
    BP_LAUNCH(1, 1, 0, stream, sum_partials_kernel)(partial, blocks, per_tensor + i);
  }
  BP_LAUNCH(1, 1, 0, stream, sum_partials_kernel)(per_tensor, count, total);
  double host_total = 0.0;
  cudaMemcpyAsync(&host_total, total, sizeof(double), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  return host_total;
}

__device__ __forceinline__ bool is_finite_value(float v) {
  return isfinite(v);
}
__device__ __forceinline__ bool is_finite_value(bf16 v) {
  return isfinite(__bfloat162float(v));
}

template <class T>
__global__ void all_finite_kernel(const T* x, int64_t n, unsigned* flag) {
  bool bad = false;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    bad |= !is_finite_value(x[i]);
  if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(flag, 1u);
}

// True when no value of x is Inf or NaN (synchronises the stream).
template <class T>
bool all_finite(const T* x, int64_t n, void* scratch, cudaStream_t stream = nullptr) {
  if (n <= 0) return true;
  unsigned* flag = reinterpret_cast<unsigned*>(static_cast<char*>(scratch) + optim_scratch_bytes(n) - sizeof(unsigned));
  cudaMemsetAsync(flag, 0, sizeof(unsigned), stream);
  BP_LAUNCH(static_cast<unsigned>(reduce_blocks(n)), kReduceThreads, 0, stream, all_finite_kernel<T>)(x, n, flag);
  unsigned host_flag = 1;
  cudaMemcpyAsync(&host_flag, flag, sizeof(unsigned), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  return host_flag == 0;
}

}  // namespace bp::BP_CUDA_NS
