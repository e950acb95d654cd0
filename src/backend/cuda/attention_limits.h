// The head dimensions the CUDA attention kernels (attention.cuh) take, in a plain header so that
// the kernel source and the host declarations (cuda_kernels.h) share one number: above it the
// dK/dV block's shared tiles outgrow what every supported architecture gives one block (99 KiB on
// sm_86/sm_89). The caller (the dispatch) refuses larger heads with a catalog error.
#pragma once

namespace bp {

constexpr int kCudaAttentionMaxHeadDim = 256;

}  // namespace bp
