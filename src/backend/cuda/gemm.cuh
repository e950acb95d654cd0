// The GEMM entry point kernels call: executes a GemmDesc (gemm_desc.h) on a stream.
//   real CUDA build: cuBLASLt (cublaslt_gemm.cpp), workspace from the caller (our allocator);
//   simulation:      the column-major CPU reference (sim/gemm_sim.cpp), which the tests compare
//                    with the CPU backend's sgemm.
// C_in (may be null: C itself): the matrix beta scales, of C's layout, read, never written (a
// residual added by the GEMM that writes the sum into C).
#pragma once

#include "backend/cuda/cuda_compat.cuh"
#include "backend/cuda/gemm_desc.h"

namespace bp::BP_CUDA_NS {

void gemm(const gemm::GemmDesc& desc, const void* A, const void* B, void* C, void* workspace, size_t workspace_bytes,
          cudaStream_t stream, const void* C_in = nullptr);

}  // namespace bp::BP_CUDA_NS
