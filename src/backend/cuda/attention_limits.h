// The head dimensions the CUDA attention kernels (attention.cuh) take, in a plain header so that
// the kernel source and the host declarations (cuda_kernels.h) share one number: above it the
// dK/dV block's shared tiles outgrow what every supported architecture gives one block (99 KiB on
// sm_86/sm_89). The caller (the dispatch) refuses larger heads with a catalog error.
#pragma once

namespace bp {

constexpr int kCudaAttentionMaxHeadDim = 256;
// The rotary kernel (rope.cuh) gets its inv_freq table (head_dim/2 floats) in its launch
// arguments, sized for the widest head the attention kernels take.
constexpr int kCudaRopeMaxHeadDim = kCudaAttentionMaxHeadDim;

}  // namespace bp
