// The real CUDA build of optim.cuh: adamw_step, and sum_squares / all_finite for f32 and bf16.
#include "backend/cuda/optim.cuh"

namespace bp::cuda {
template double sum_squares<float>(const float*, int64_t, void*, cudaStream_t);
template double sum_squares<bf16>(const bf16*, int64_t, void*, cudaStream_t);
template double sum_squares_total<float>(const float* const*, const int64_t*, int64_t, void*, cudaStream_t);
template bool all_finite<float>(const float*, int64_t, void*, cudaStream_t);
template bool all_finite<bf16>(const bf16*, int64_t, void*, cudaStream_t);
}  // namespace bp::cuda
