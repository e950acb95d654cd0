// The kernels of ops/kernels.inc the CUDA backend does not have yet, one null member each: the
// one list the CUDA dispatch table (kernel_wrappers.h, whose KernelWrappers derives from it) and
// the docs' ops x backends table (ops/dispatch.cpp, in every build, with or without CUDA) read.
// Plain C++: no CUDA header.
#pragma once

#include <cstddef>

namespace bp::cuda_gaps {

struct KernelGaps {
  // Empty: every kernel of ops/kernels.inc has a CUDA wrapper. A kernel added to kernels.inc
  // before its CUDA version exists gets a line here:
  //   static constexpr std::nullptr_t <kernel name> = nullptr;
};

}  // namespace bp::cuda_gaps
