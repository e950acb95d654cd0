// See device_compute.h.
#include "ops/device_compute.h"

#include "backend/cuda/compute_precision.h"

namespace bp::ops {

std::string cuda_compute_description(bool frozen_bf16) {
  return cuda_compute::describe_run(frozen_bf16);
}

}  // namespace bp::ops
