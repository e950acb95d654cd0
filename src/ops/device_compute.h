// What the CUDA kernels compute in, as the training start event words it for a run, and the device
// memory they take for themselves per call (cuda_workspace::, for a memory plan of the device) or
// hold across calls (cuBLASLt's workspace: device_gemm_workspace_bytes): the ops layer is where
// train/ reaches the backends (DESIGN.md layers); the wording and the byte counts live beside the
// CUDA wrappers that do it (backend/cuda/compute_precision.h, device_workspace.h).
// `backprop info` gets the general line from cuda_status().compute.
#pragma once

#include <cstddef>
#include <string>

#include "backend/cuda/device_workspace.h"  // cuda_workspace::
#include "core/allocator.h"                 // DeviceType
#include "core/dtype.h"

namespace bp::ops {

// The 16-bit GEMMs are named only when some frozen weight is held narrower than f32; bf16, or f16
// on a card whose GEMMs take f16 (cuda_frozen_gemms_in_f16); and the trained matrices' bf16 GEMM
// copies when the run makes them (training.matmul_dtype).
std::string cuda_compute_description(bool frozen_narrow, bool trained_bf16 = false);

// Whether the installed CUDA table's GEMMs against frozen weights take f16 (a compute capability
// 7.5 card: backend/cuda/kernel_wrappers.h); false without CUDA or a card.
bool cuda_frozen_gemms_in_f16();

// Whether the CUDA kernels read a frozen weight held as `t` (backend/cuda/dequant_types.h).
bool cuda_reads_held_type(DType t);

// The device memory the GEMMs of `device` hold across calls, as its kernel table (the installed
// one: a simulated card in tests) says: cuBLASLt's workspace at the size recommended for the card's
// compute capability on CUDA (cuda_workspace::gemm_workspace_bytes), 0 on the CPU.
size_t device_gemm_workspace_bytes(DeviceType device);
// Gives back the GEMM workspace `allocator` holds (a CUDA allocator; nothing for another), as the
// trainer does when a run ends. The next GEMM allocates it again.
void release_device_gemm_workspace(Allocator& allocator);

}  // namespace bp::ops
