// CUDA device facts and the CUDA allocator entry point. In builds without CUDA every function
// here is provided by cuda_stub.cpp: queries report "not built", allocation throws
// RUNTIME_NOT_BUILT_WITH_CUDA. Nothing aborts.
#pragma once

#include <string>
#include <vector>

namespace bp {

class Allocator;

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  size_t bytes_total = 0;
  size_t bytes_free = 0;
  int cc_major = 0, cc_minor = 0;
};

struct CudaStatus {
  bool compiled = false;        // the CUDA backend is built in
  int runtime_version = 0;      // e.g. 13000
  int driver_version = 0;       // 0 when no driver is loaded
  std::string why_unavailable;  // empty when at least one device is usable
  std::vector<CudaDeviceInfo> devices;
};

CudaStatus cuda_status();
Allocator* cuda_allocator(int index);

}  // namespace bp

namespace bp {
// Thrown by an op front-end given CUDA tensors: "not built with CUDA" in CPU-only builds, and
// "no CUDA kernel for <op> yet" in CUDA builds until that kernel exists.
[[noreturn]] void cuda_op_unavailable(const char* op);
}  // namespace bp
