// See device_compute.h.
#include "ops/device_compute.h"

#include "backend/cuda/compute_precision.h"
#include "backend/cuda/dequant_types.h"

namespace bp::ops {

std::string cuda_compute_description(bool frozen_bf16) {
  return cuda_compute::describe_run(frozen_bf16);
}

bool cuda_reads_held_type(DType t) {
  return cuda_dequant::dequantize_supported(t);
}

}  // namespace bp::ops
