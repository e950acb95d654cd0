// CUDA allocator entry point and device facts (built only with the CUDA backend).
//
// The allocator is CachingDeviceAllocator (caching_allocator.h: counting, cache, empty-once-then-
// OutOfMemoryError) over cudaMalloc/cudaFree/cudaMemGetInfo; the same class is tested on the
// simulated runtime's memory budget. Before the first device is used, the driver is checked
// against the runtime this build links (cuda_errors.h). Linked against cudart only (no -lcuda):
// cudart loads the driver at run time.
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/compute_precision.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_errors.h"
#include "backend/cuda/gemm_desc.h"
#include "core/allocator.h"
#include "core/error.h"

namespace bp {

namespace {

DeviceMemoryApi cuda_memory_api(int index) {
  DeviceMemoryApi api;
  api.malloc = [index](void** p, size_t bytes) {
    cudaSetDevice(index);
    const cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaSuccess) return true;
    cudaGetLastError();  // cudaErrorMemoryAllocation is not sticky: clear it
    if (auto error = cuda_malloc_failure(cudaGetErrorName(e), cudaGetErrorString(e))) throw *error;
    return false;
  };
  api.free = [index](void* p) {
    cudaSetDevice(index);
    cudaFree(p);
  };
  api.mem_info = [index](size_t* free_b, size_t* total_b) {
    cudaSetDevice(index);
    if (cudaMemGetInfo(free_b, total_b) != cudaSuccess) {
      cudaError_t e = cudaGetLastError();
      throw cuda_failure("cudaMemGetInfo", cudaGetErrorName(e), cudaGetErrorString(e));
    }
  };
  return api;
}

std::unique_ptr<Allocator> make_cuda_allocator(int index) {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  check_driver_supports_runtime(driver, runtime);
  if (cudaError_t e = cudaSetDevice(index); e != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::DEP_GPU_NOT_AVAILABLE,
                fmt::format("[cuda] cannot select device {}: {}", index, cudaGetErrorString(e)));
  }
  return std::make_unique<CachingDeviceAllocator>(Device{DeviceType::CUDA, index}, cuda_memory_api(index));
}

}  // namespace

CudaStatus cuda_status() {
  CudaStatus s;
  s.compiled = true;
  s.compute = cuda_compute::describe_run(true, false, true);
  cudaRuntimeGetVersion(&s.runtime_version);
  cudaDriverGetVersion(&s.driver_version);
  try {
    check_driver_supports_runtime(s.driver_version, s.runtime_version);
  } catch (const Error& e) {
    s.why_unavailable = e.what();
    return s;
  }
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    s.why_unavailable = fmt::format("no usable CUDA device: {}", cudaGetErrorString(e));
    cudaGetLastError();
    return s;
  }
  // Properties need no context; free memory does (cudaMemGetInfo on the current device): measured
  // on device 0 only, the one training uses, and the caller's current device is restored (this
  // runs at the start of every training run).
  int previous = 0;
  const bool had_current = cudaGetDevice(&previous) == cudaSuccess;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    CudaDeviceInfo d;
    d.index = i;
    d.name = p.name;
    d.bytes_total = p.totalGlobalMem;
    d.cc_major = p.major;
    d.cc_minor = p.minor;
    size_t f = 0, t = 0;
    if (i == 0 && cudaSetDevice(0) == cudaSuccess && cudaMemGetInfo(&f, &t) == cudaSuccess) {
      d.bytes_free = f;
      d.free_measured = true;
    } else {
      cudaGetLastError();
    }
    s.devices.push_back(d);
  }
  if (had_current) cudaSetDevice(previous);
  if (s.devices.empty()) s.why_unavailable = "the CUDA runtime reports no devices";
  // Training uses device 0 only (train/trainer.cpp): an old card there makes CUDA unusable.
  else
    s.why_unavailable = unsupported_device_reason(s.devices[0].name, s.devices[0].cc_major, s.devices[0].cc_minor);
  if (!s.devices.empty())  // what device 0's GEMMs take: f16 below compute capability 8.0
    s.compute = cuda_compute::describe_run(true, gemm::narrow_type(s.devices[0].cc_major) == gemm::DType::F16, true);
  return s;
}

Allocator* cuda_allocator(int index) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<Allocator>> allocators;
  std::lock_guard<std::mutex> g(mu);
  auto& a = allocators[index];
  if (!a) a = make_cuda_allocator(index);
  return a.get();
}

// Host <-> device copies for Tensor (core/allocator.h): synchronous, on the default stream, so a
// host buffer may be reused as soon as the call returns.
void cuda_copy(void* dst, const void* src, size_t bytes, CopyKind kind) {
  const cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                            : cudaMemcpyDeviceToDevice;
  if (cudaMemcpy(dst, src, bytes, k) != cudaSuccess) {
    cudaError_t e = cudaGetLastError();
    throw cuda_failure("cudaMemcpy", cudaGetErrorName(e), cudaGetErrorString(e));
  }
}

void cuda_zero(void* dst, size_t bytes) {
  if (cudaMemset(dst, 0, bytes) != cudaSuccess) {
    cudaError_t e = cudaGetLastError();
    throw cuda_failure("cudaMemset", cudaGetErrorName(e), cudaGetErrorString(e));
  }
}

}  // namespace bp

namespace bp {
void cuda_op_unavailable(const char* op) {
  throw Error(ErrorCode::RUNTIME_NOT_BUILT_WITH_CUDA,
              fmt::format("[{}] this op has no CUDA kernel yet; train on the CPU (--device cpu)", op));
}
}  // namespace bp
