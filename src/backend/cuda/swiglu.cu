// The real CUDA build of swiglu.cuh: f32 and bf16 activations.
#include "backend/cuda/swiglu.cuh"

namespace bp::cuda {
template void swiglu_forward<float>(const float*, const float*, float*, bf16*, int64_t, cudaStream_t);
template void swiglu_forward<bf16>(const bf16*, const bf16*, bf16*, bf16*, int64_t, cudaStream_t);
template void swiglu_backward<float>(const float*, const float*, const float*, float*, float*, bf16*, bf16*, int64_t,
                                     cudaStream_t);
template void swiglu_backward<bf16>(const bf16*, const bf16*, const bf16*, bf16*, bf16*, bf16*, bf16*, int64_t,
                                    cudaStream_t);
template void geglu_forward<float>(const float*, const float*, float*, bf16*, int64_t, cudaStream_t);
template void geglu_backward<float>(const float*, const float*, const float*, float*, float*, bf16*, bf16*, int64_t,
                                    cudaStream_t);
}  // namespace bp::cuda
