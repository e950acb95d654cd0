// The CUDA allocator entry point and the op-level "not available" error (device facts:
// core/device_info.h). In builds without CUDA every function
// here is provided by cuda_stub.cpp: queries report "not built", allocation throws
// RUNTIME_NOT_BUILT_WITH_CUDA. Nothing aborts.
#pragma once

#include "core/allocator.h"
#include "core/device_info.h"  // CudaStatus, cuda_status()

namespace bp {

Allocator* cuda_allocator(int index);
// The built-in CUDA device memory functions behind core's device_copy / device_zero.
void cuda_copy(void* dst, const void* src, size_t bytes, CopyKind kind);
void cuda_zero(void* dst, size_t bytes);

}  // namespace bp

namespace bp {
// Thrown by an op front-end given CUDA tensors: "not built with CUDA" in CPU-only builds, and
// "no CUDA kernel for <op> yet" in CUDA builds until that kernel exists.
[[noreturn]] void cuda_op_unavailable(const char* op);
}  // namespace bp
