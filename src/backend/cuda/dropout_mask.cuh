// The LoRA dropout mask on the card: the CPU kernel's counter-based hash bit for bit
// (backend/cpu/linear.cpp: element `index` of the [T, in] LoRA input is kept when the top 24 bits
// of splitmix64(splitmix64(seed) ^ index) / 2^24 >= p). Used by lora_dropout.cuh's fused kernels
// (inline: header-only).
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

// One mask as a kernel argument: p, the inverted-dropout scale 1/(1 − p) and the mixed seed, made
// once on the host (dropout_mask below).
struct DropoutMask {
  float p;
  float inv_keep;
  uint64_t mixed;
  __device__ __forceinline__ bool keep(uint64_t index) const { return dropout_keep_mixed(mixed, index, p); }
};
inline DropoutMask dropout_mask(float p, uint64_t seed) {
  return {p, 1.0f / (1.0f - p), splitmix64(seed)};
}

}  // namespace bp::BP_CUDA_NS
