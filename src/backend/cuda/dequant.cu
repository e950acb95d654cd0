// The real CUDA build of dequant.cuh: held weights into f32, bf16 or f16 panels, and their
// largest magnitude (the f16 range check).
#include "backend/cuda/dequant.cuh"

namespace bp::cuda {
template bool dequantize_rows<float>(DType, const void*, int64_t, int64_t, int64_t, float*, cudaStream_t);
template bool dequantize_rows<bf16>(DType, const void*, int64_t, int64_t, int64_t, bf16*, cudaStream_t);
template bool dequantize_rows<f16>(DType, const void*, int64_t, int64_t, int64_t, f16*, cudaStream_t);
template bool dequantize_gather_rows<float>(DType, const void*, int64_t, const int32_t*, int64_t, float*, cudaStream_t);
template bool dequantize_gather_rows<bf16>(DType, const void*, int64_t, const int32_t*, int64_t, bf16*, cudaStream_t);
template bool held_abs_max_bits<int>(DType, const void*, int64_t, int64_t, int*, cudaStream_t);
}  // namespace bp::cuda
