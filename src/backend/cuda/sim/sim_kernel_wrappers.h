// The simulated CUDA backend's kernels behind the CPU signatures: kernel_wrappers.h over the kernel
// sources compiled as host C++ (cuda_compat.cuh's BP_CUDA_NS = sim), as bp::sim::KernelWrappers.
// test_cuda installs them as the CUDA dispatch table (ops::install_kernels) with the simulated
// card's memory (tests/cuda/sim_device.h); never part of the library.
#pragma once

#include "backend/cuda/attention.cuh"
#include "backend/cuda/cross_entropy.cuh"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/lora_dropout.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/optim.cuh"
#include "backend/cuda/rms_norm.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/swiglu.cuh"

#define BP_WRAP_NS sim
#include "backend/cuda/kernel_wrappers.h"
#undef BP_WRAP_NS
