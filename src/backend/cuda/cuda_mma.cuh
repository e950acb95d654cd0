// One warp-level tensor-core product with a DOCUMENTED register layout: PTX
// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`, D[16×8] = A[16×16]·B[16×8] + C, bf16
// inputs, f32 accumulators. wmma (cuda_wmma.cuh) leaves which lane holds which element unspecified,
// so its accumulators cannot be touched element by element in registers; this instruction's layout
// is fixed by the PTX ISA ("Matrix fragments for mma.m16n8k16 with floating point type"), which is
// what lets attention_fa2.cuh keep scores, softmax and O in registers. For lane l, g = l / 4 (the
// group) and t = l % 4 (its thread in the group):
//   A (4 × .b32, two bf16 each): a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
//                                a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]
//   B (2 × .b32):                b[0] = B[2t, 2t+1][g],   b[1] = B[2t+8, 2t+9][g]
//   C, D (4 floats):             c[0..1] = C[g][2t, 2t+1], c[2..3] = C[g+8][2t, 2t+1]
// The lower-indexed element of a pair sits in the low 16 bits (pack_bf16x2).
// Under nvcc: inline PTX, compiled for compute capability >= 8.0 only (the sm_75 pass gets __trap;
// the launchers never pick a kernel using it on such a card). In the simulation: sim/sim_mma.h.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/cuda/cuda_wmma.cuh"  // BP_CUDA_ARCH_HAS_BF16_MMA

#ifndef __CUDACC__
#include "backend/cuda/sim/sim_mma.h"
#endif

namespace bp::BP_CUDA_NS {

#ifdef __CUDACC__
__device__ __forceinline__ void mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                  const float c[4]) {
#if BP_CUDA_ARCH_HAS_BF16_MMA
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
  __trap();  // bf16 mma needs compute capability 8.0
#endif
}
#endif

// Two bf16 in one register: `lo` in bits 0..15 (the lower-indexed element of an operand pair).
__device__ __forceinline__ uint32_t pack_bf16x2(bf16 lo, bf16 hi) {
  return (uint32_t{__bfloat16_as_ushort(hi)} << 16) | __bfloat16_as_ushort(lo);
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return pack_bf16x2(__float2bfloat16(lo), __float2bfloat16(hi));
}

// The two consecutive bf16 at p (4-byte aligned: an even element of an even-strided row) as one
// register, p[0] low.
__device__ __forceinline__ uint32_t load_bf16x2(const bf16* p) {
#ifdef __CUDACC__
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t r;
  std::memcpy(&r, p, sizeof r);
  return r;
#endif
}

}  // namespace bp::BP_CUDA_NS
