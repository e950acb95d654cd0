// The tensor-core fragment API (nvcuda::wmma) for kernel sources: CUDA's <mma.h> under nvcc, the
// simulation's subset (sim/sim_wmma.h: 16×16×16 bf16/f16 fragments, f32 accumulators) otherwise.
// Kernels name it `nvcuda::wmma` inside BP_CUDA_NS: ::nvcuda on a GPU, bp::sim::nvcuda in the
// simulation. bf16 fragments exist from compute capability 8.0 on: device code using them is
// compiled under BP_CUDA_ARCH_HAS_BF16_MMA only (the sm_75 pass of nvcc leaves it out).
#pragma once

#include "backend/cuda/cuda_compat.cuh"

#ifdef __CUDACC__
#include <mma.h>
#else
#include "backend/cuda/sim/sim_wmma.h"
#endif

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define BP_CUDA_ARCH_HAS_BF16_MMA 1
#else
#define BP_CUDA_ARCH_HAS_BF16_MMA 0
#endif
