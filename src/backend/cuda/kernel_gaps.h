// The kernels of ops/kernels.inc the CUDA backend does not have yet, one null member each: the
// one list the CUDA dispatch table (kernel_wrappers.h, whose KernelWrappers derives from it) and
// the docs' ops x backends table (ops/dispatch.cpp, in every build, with or without CUDA) read.
// Plain C++: no CUDA header.
#pragma once

#include <cstddef>

namespace bp::cuda_gaps {

struct KernelGaps {
  // A kernel added to kernels.inc before its CUDA version exists gets a line here:
  //   static constexpr std::nullptr_t <kernel name> = nullptr;
  // The Mixture-of-Experts ops (ops/moe.h): CPU only so far.
  static constexpr std::nullptr_t moe_route_forward = nullptr;
  static constexpr std::nullptr_t moe_route_backward = nullptr;
  static constexpr std::nullptr_t moe_sort = nullptr;
  static constexpr std::nullptr_t moe_gather_forward = nullptr;
  static constexpr std::nullptr_t moe_gather_backward = nullptr;
  static constexpr std::nullptr_t moe_scatter_forward = nullptr;
  static constexpr std::nullptr_t moe_scatter_backward = nullptr;
  static constexpr std::nullptr_t moe_aux_accumulate = nullptr;
};

}  // namespace bp::cuda_gaps
