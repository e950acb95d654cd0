// The real CUDA build of rope.cuh: f32 and bf16 activations.
#include "backend/cuda/rope.cuh"

namespace bp::cuda {
template void rope_apply<float>(float*, int64_t, bf16*, const float*, float*, int64_t, bf16*, const float*,
                                const int32_t*, const float*, int64_t, int64_t, int64_t, float, bool, cudaStream_t);
template void rope_apply<bf16>(bf16*, int64_t, bf16*, const float*, bf16*, int64_t, bf16*, const float*, const int32_t*,
                               const float*, int64_t, int64_t, int64_t, float, bool, cudaStream_t);
}  // namespace bp::cuda
