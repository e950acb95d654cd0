// Entry points of the CUDA backend for builds without it: they explain, they never abort.
#include "backend/cuda/cuda_device.h"
#include "core/allocator.h"
#include "core/error.h"

namespace bp {

CudaStatus cuda_status() {
  CudaStatus s;
  s.compiled = false;
  s.why_unavailable = "this build has no CUDA backend (configure with -DBACKPROP_CUDA=ON where the toolkit exists)";
  return s;
}

Allocator* cuda_allocator(int index) {
  throw Error(ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA,
              fmt::format("[cuda] CUDA device {} requested, but backprop was not built with CUDA", index));
}

void cuda_copy(void*, const void*, size_t, CopyKind) {
  throw Error(ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA,
              "[cuda] copy to or from CUDA memory, but backprop was not built with CUDA");
}

void cuda_zero(void*, size_t) {
  throw Error(ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA,
              "[cuda] zeroing CUDA memory, but backprop was not built with CUDA");
}

}  // namespace bp

namespace bp {
void cuda_op_unavailable(const char* op) {
  throw Error(ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA,
              fmt::format("[{}] CUDA tensors given, but backprop was not built with CUDA", op));
}
}  // namespace bp
