// The real CUDA build of cross_entropy.cuh: f32 and bf16 activations/weights, and (its non-template
// launchers) the held head with f32 activations.
#include "backend/cuda/cross_entropy.cuh"

namespace bp::cuda {
template size_t cross_entropy_workspace_bytes<float>(int64_t, int64_t);
template size_t cross_entropy_workspace_bytes<bf16>(int64_t, int64_t);
template CrossEntropyResult linear_cross_entropy<float>(const float*, const float*, const int32_t*, const int32_t*,
                                                        int64_t, int64_t, int64_t, int64_t, void*, float, float*,
                                                        float*, gemm::Workspace, cudaStream_t, float);
template CrossEntropyResult linear_cross_entropy<bf16>(const bf16*, const bf16*, const int32_t*, const int32_t*,
                                                       int64_t, int64_t, int64_t, int64_t, void*, float, bf16*, float*,
                                                       gemm::Workspace, cudaStream_t, float);
}  // namespace bp::cuda
