// The LoRA dropout mask on the card: the CPU kernel's counter-based hash bit for bit
// (backend/cpu/linear.cpp: element `index` of the [T, in] LoRA input is kept when the top 24 bits
// of splitmix64(splitmix64(seed) ^ index) / 2^24 >= p). Shared by elementwise.cuh's dropout kernels
// and lora_dropout.cuh's fused ones (inline: included by several .cu files).
#pragma once

#include "backend/cuda/cuda_compat.cuh"

namespace bp::BP_CUDA_NS {

__host__ __device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Element `index` is kept when the top 24 bits of splitmix64(mixed_seed ^ index) / 2^24 >= p
// (mixed_seed = splitmix64(seed)).
__device__ __forceinline__ bool dropout_keep_mixed(uint64_t mixed_seed, uint64_t index, float p) {
  const uint64_t h = splitmix64(mixed_seed ^ index);
  return __fmul_rn(static_cast<float>(h >> 40), 1.0f / 16777216.0f) >= p;
}

}  // namespace bp::BP_CUDA_NS
