// The real CUDA backend's kernels behind the CPU signatures: kernel_wrappers.h over the launchers
// the .cu files instantiate (cuda_kernels.h), as bp::cuda::KernelWrappers. Host C++ for g++ in
// CUDA builds only (ops/dispatch.cpp builds the CUDA table from it).
#pragma once

#include "backend/cuda/cuda_kernels.h"

#define BP_WRAP_NS cuda
#include "backend/cuda/kernel_wrappers.h"
#undef BP_WRAP_NS
