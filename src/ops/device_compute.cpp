// See device_compute.h.
#include "ops/device_compute.h"

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/compute_precision.h"
#include "backend/cuda/dequant_types.h"
#include "ops/dispatch.h"

namespace bp::ops {

std::string cuda_compute_description(bool frozen_narrow, bool trained_bf16) {
  return cuda_compute::describe_run(frozen_narrow, cuda_frozen_gemms_in_f16(), trained_bf16);
}

bool cuda_frozen_gemms_in_f16() {
  const auto& f16 = kernels(DeviceType::CUDA).frozen_gemms_in_f16;
  return f16.fn != nullptr && f16();
}

bool cuda_reads_held_type(DType t) {
  return cuda_dequant::dequantize_supported(t);
}

size_t device_gemm_workspace_bytes(DeviceType device) {
  return kernels(device).gemm_workspace_bytes();
}

void release_device_gemm_workspace(Allocator& allocator) {
  if (auto* caching = dynamic_cast<CachingDeviceAllocator*>(&allocator)) caching->release_gemm_workspace();
}

}  // namespace bp::ops
