// What the CUDA kernels compute in, as the training start event words it for a run, and the device
// memory they take for themselves per call (cuda_workspace::, for a memory plan of the device): the
// ops layer is where train/ reaches the backends (DESIGN.md layers); the wording and the byte counts
// live beside the CUDA wrappers that do it (backend/cuda/compute_precision.h, device_workspace.h).
// `backprop info` gets the general line from cuda_status().compute.
#pragma once

#include <string>

#include "backend/cuda/device_workspace.h"  // cuda_workspace::
#include "core/dtype.h"

namespace bp::ops {

// The 16-bit GEMMs are named only when some frozen weight is held narrower than f32; bf16, or f16
// on a card whose GEMMs take f16 (cuda_frozen_gemms_in_f16).
std::string cuda_compute_description(bool frozen_narrow);

// Whether the installed CUDA table's GEMMs against frozen weights take f16 (a compute capability
// 7.5 card: backend/cuda/kernel_wrappers.h); false without CUDA or a card.
bool cuda_frozen_gemms_in_f16();

// Whether the CUDA kernels read a frozen weight held as `t` (backend/cuda/dequant_types.h).
bool cuda_reads_held_type(DType t);

}  // namespace bp::ops
