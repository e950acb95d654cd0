// The kernels of ops/kernels.inc the CUDA backend does not have yet, one null member each: the
// one list the CUDA dispatch table (kernel_wrappers.h, whose KernelWrappers derives from it) and
// the docs' ops x backends table (ops/dispatch.cpp, in every build, with or without CUDA) read.
// Plain C++: no CUDA header.
#pragma once

#include <cstddef>

namespace bp::cuda_gaps {

struct KernelGaps {
  // Attention forward/backward over packed samples: being written on branch cudaattn.
  static constexpr std::nullptr_t attention_forward = nullptr;
  static constexpr std::nullptr_t attention_backward = nullptr;
  static constexpr std::nullptr_t attention_forward_scratch_floats = nullptr;
  static constexpr std::nullptr_t attention_backward_scratch_floats = nullptr;
};

}  // namespace bp::cuda_gaps
