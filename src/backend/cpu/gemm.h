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

// C = alpha·A·Bᵀ + beta·C where B [N, K] is a weight (row stride ldb) and A [M, K] holds the rows
// of a linear layer's input. With few rows (kFewRowsMax or fewer, at least kFewRowsMin, and a weight
// of kFewRowsMinWeight elements or more) B is streamed in place by the kernel variant's
// gemm_nt_few_rows (kernel_variants.h), the rows split over the OpenMP threads (one thread when
// called inside a parallel region): OpenBLAS would repack all of B for those few rows, which costs
// as much as the product (a Mixture-of-Experts expert's 32 routed rows against its [768, 2048]
// projection; docs/benchmarks.md). Otherwise sgemm(false, true, ...).
inline constexpr int64_t kFewRowsMin = 4, kFewRowsMax = 96, kFewRowsMinWeight = int64_t{1} << 16;
void sgemm_weight_nt(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                     int64_t ldb, float beta, float* C, int64_t ldc);
// Whether sgemm_weight_nt takes the few-rows kernel for this shape.
bool few_rows_path(int64_t M, int64_t N, int64_t K);

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
