// What every kernel source (backend/cuda/*.cuh) includes first: the real CUDA headers under nvcc,
// the CPU simulation (sim/cuda_sim.h) otherwise. The same kernel text compiles both ways:
// - BP_CUDA_NS is the namespace the kernels live in: bp::cuda for the real backend, bp::sim for
//   the simulated one (so a test binary can hold both without symbol clashes);
// - BP_LAUNCH(grid, block, shared_bytes, stream, kernel)(args...) is <<<...>>> or the simulated
//   launch;
// - BP_DYNAMIC_SHARED(type, name) declares the block's dynamic shared memory;
// - BP_UNROLL fully unrolls the loop that follows under nvcc, so that register arrays (or a by-value
//   argument's arrays) indexed by its counter stay in registers (indexed at run time they live in
//   local memory); nothing on the host;
// - BP_HOST_FN marks a launcher that is not a template (inline in the simulation, where several
//   test files include the same .cuh; an ordinary function in its one .cu under nvcc);
// - Storage types: kernels are templates over the element type their activations are stored in
//   (float, or bf16) and always accumulate in f32 (load_f32 / store_from_f32); f16 (__half) is the
//   16-bit GEMM operand type of Turing cards (dequantized panels, scaled activations).
#pragma once

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define BP_CUDA_NS cuda
#define BP_LAUNCH(grid, block, shared_bytes, stream, ...) __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#define BP_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define BP_HOST_FN
#define BP_UNROLL _Pragma("unroll")
#else
#include "backend/cuda/sim/cuda_sim.h"
#define BP_CUDA_NS sim
#define BP_LAUNCH(grid, block, shared_bytes, stream, ...) \
  ::bp::sim::make_launch(grid, block, shared_bytes, stream, __VA_ARGS__)
#define BP_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::bp::sim::sim_dynamic_shared())
#define BP_HOST_FN inline  // a non-template launcher: defined once by its .cu, in every test file here
#define BP_UNROLL
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace bp::BP_CUDA_NS {

using bf16 = __nv_bfloat16;
using f16 = __half;

__device__ __forceinline__ float load_f32(float v) {
  return v;
}
__device__ __forceinline__ float load_f32(bf16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float load_f32(f16 v) {
  return __half2float(v);
}
template <class T>
__device__ __forceinline__ T store_from_f32(float v);
template <>
__device__ __forceinline__ float store_from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 store_from_f32<bf16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ f16 store_from_f32<f16>(float v) {
  return __float2half(v);  // round to nearest even
}

// v stored as T at out[i], and (out16 non-null) as nearest-even bf16 at out16[i] too: an
// output's copy for the bf16 GEMMs that read it (ops/linear.h x_bf16).
template <class T>
__device__ __forceinline__ void store_with_bf16(T* out, bf16* out16, int64_t i, float v) {
  const T t = store_from_f32<T>(v);
  out[i] = t;
  if (out16) out16[i] = store_from_f32<bf16>(load_f32(t));
}

// Sum over the 32 lanes of a warp; every lane gets the total.
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
// |v|'s bit pattern as a non-negative int: non-negative f32 bit patterns order as the values do
// (NaN above Inf), so an int max (atomicMax) finds the largest magnitude.
__device__ __forceinline__ int abs_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return static_cast<int>(u & 0x7fffffffu);
}
// *result = max(*result, the warp's largest m): a shuffle tree, then one atomicMax per warp.
__device__ __forceinline__ void warp_atomic_max(int m, int* result) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const int other = __shfl_xor_sync(0xffffffffu, m, offset);
    m = other > m ? other : m;
  }
  if (threadIdx.x % 32 == 0 && m > 0) atomicMax(result, m);
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
// `scratch` holds 32 floats of shared memory; the leading barrier lets callers reuse it in a loop.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = (blockDim.x + 31) / 32;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = (blockDim.x + 31) / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < n_warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}
// Blocks of 256 threads for a grid-stride loop over n elements (at most 65535 blocks).
inline unsigned elementwise_blocks(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535));
}

}  // namespace bp::BP_CUDA_NS
