// Which held types the CUDA dequantization kernels (dequant.cuh) read: shared by the kernel
// source and the host code that calls its launchers (kernel_wrappers.h, through cuda_kernels.h or
// the simulation), so both agree without a link-time symbol.
#pragma once

#include "core/dtype.h"

namespace bp::cuda_dequant {

inline bool dequantize_supported(DType t) {
  switch (t) {
    case DType::F32:
    case DType::BF16:
    case DType::F16:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: return true;
    default: return false;
  }
}

}  // namespace bp::cuda_dequant
