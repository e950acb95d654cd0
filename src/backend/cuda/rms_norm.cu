// The real CUDA build of rms_norm.cuh: f32 and bf16 activations.
#include "backend/cuda/rms_norm.cuh"

namespace bp::cuda {
template void rms_norm_forward<float>(const float*, const float*, float, float*, bf16*, float*, int64_t, int64_t,
                                      cudaStream_t);
template void rms_norm_forward<bf16>(const bf16*, const float*, float, bf16*, bf16*, float*, int64_t, int64_t,
                                     cudaStream_t);
template void rms_norm_backward<float>(const float*, const float*, const float*, const float*, float*, bf16*, float*,
                                       int64_t, int64_t, bool, cudaStream_t);
template void rms_norm_backward<bf16>(const bf16*, const bf16*, const float*, const float*, bf16*, bf16*, float*,
                                      int64_t, int64_t, bool, cudaStream_t);
}  // namespace bp::cuda
