// The real CUDA build of attention.cuh: f32 and bf16 activations.
#include "backend/cuda/attention.cuh"

namespace bp::cuda {
template void attention_forward<float>(const float*, const float*, const float*, const int32_t*, const AttentionDims&,
                                       float*, bf16*, float*, cudaStream_t);
template void attention_forward<bf16>(const bf16*, const bf16*, const bf16*, const int32_t*, const AttentionDims&,
                                      bf16*, bf16*, float*, cudaStream_t);
template void attention_backward<float>(const float*, const float*, const float*, const float*, const float*,
                                        const float*, const int32_t*, const AttentionDims&, float*, float*, float*,
                                        float*, bf16*, cudaStream_t);
template void attention_backward<bf16>(const bf16*, const bf16*, const bf16*, const bf16*, const bf16*, const float*,
                                       const int32_t*, const AttentionDims&, float*, bf16*, bf16*, bf16*, bf16*,
                                       cudaStream_t);
}  // namespace bp::cuda
