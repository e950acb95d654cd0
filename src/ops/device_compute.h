// What the CUDA kernels compute in, as the training start event words it for a run: the ops layer
// is where train/ reaches the backends (DESIGN.md layers), and the wording lives beside the CUDA
// wrappers that do it (backend/cuda/compute_precision.h). `backprop info` gets the general line
// from cuda_status().compute.
#pragma once

#include <string>

namespace bp::ops {

// The bf16 GEMMs are named only when some frozen weight is held in bf16.
std::string cuda_compute_description(bool frozen_bf16);

}  // namespace bp::ops
