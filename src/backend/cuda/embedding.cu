// The real CUDA build of embedding.cuh: f32 and bf16 tables/activations.
#include "backend/cuda/embedding.cuh"

namespace bp::cuda {
template void embedding_forward<float>(const int32_t*, const float*, float*, int64_t, int64_t, cudaStream_t);
template void embedding_forward<bf16>(const int32_t*, const bf16*, bf16*, int64_t, int64_t, cudaStream_t);
template void embedding_backward<float>(const float*, const int32_t*, float*, int64_t, int64_t, cudaStream_t);
template void embedding_backward<bf16>(const bf16*, const int32_t*, float*, int64_t, int64_t, cudaStream_t);
}  // namespace bp::cuda
