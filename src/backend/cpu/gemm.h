// The f32 GEMM entry point of the CPU backend: row-major C = alpha * op(A) * op(B) + beta * C
// through OpenBLAS (the bf16 products against bf16-held weights: gemm_engine.h). Never call it inside an OpenMP
// parallel region (BLAS has its own threads); the one exception is backend/cpu/attention.cpp, whose per-task GEMMs rely
// on the OpenMP build of OpenBLAS running a call made inside a parallel region on the calling thread (see there).
#pragma once

#include <cstddef>
#include <cstdint>

namespace bp::cpu {

// op(A) is [M, K], op(B) is [K, N], C is [M, N]; lda/ldb/ldc are row strides of the stored
// (untransposed) matrices.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Device memory the backend's GEMMs hold from the allocator across calls: none here (OpenBLAS keeps
// its own buffers); the CUDA backend holds cuBLASLt's workspace (backend/cuda/device_workspace.h).
inline size_t gemm_workspace_bytes() {
  return 0;
}
// Whether the backend's GEMMs against frozen weights take f16 rather than bf16 inputs: never here
// (bf16 or f32 inputs: gemm_engine.h); the CUDA backend does on a compute capability 7.5 card.
inline bool frozen_gemms_in_f16() {
  return false;
}

}  // namespace bp::cpu
