// The simulated CUDA device for whole-op and whole-model tests: while a SimulatedCudaDevice lives,
// Device{CUDA, 0} is the CPU simulation of a card of `bytes_total` bytes:
//   memory:  the backend's CachingDeviceAllocator over the simulated runtime (cudaMalloc with a
//            budget, so OOM happens where a test wants it), with the simulated cudaMemcpy/cudaMemset
//            as the explicit copies Tensor makes (core/allocator.h install_device_memory);
//   kernels: the CUDA dispatch table of the simulated kernels (sim::KernelWrappers, the same
//            wrappers the real build installs over bp::cuda).
// Destruction restores the built-in CUDA memory and table. Tensors on the device must be gone by then.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/cuda_errors.h"
#include "backend/cuda/sim/sim_kernel_wrappers.h"
#include "ops/dispatch.h"

namespace bp::test {

class SimulatedCudaDevice {
 public:
  explicit SimulatedCudaDevice(size_t bytes_total = size_t{1} << 30) {
    sim::set_memory_budget(bytes_total);
    allocator_ = std::make_unique<CachingDeviceAllocator>(Device{DeviceType::CUDA, 0}, memory_api());
    install_device_memory(DeviceType::CUDA, DeviceMemory{allocator_.get(), &copy, &zero});
    ops::install_kernels(DeviceType::CUDA, kernels());
  }
  ~SimulatedCudaDevice() {
    ops::install_kernels(DeviceType::CUDA, ops::builtin_cuda_kernels());
    install_device_memory(DeviceType::CUDA, DeviceMemory{});
    allocator_.reset();
    sim::set_memory_budget(size_t{16} << 30);
    sim::set_compute_capability(8, 0);  // a test may have simulated another card
  }
  SimulatedCudaDevice(const SimulatedCudaDevice&) = delete;
  SimulatedCudaDevice& operator=(const SimulatedCudaDevice&) = delete;

  static Device device() { return Device{DeviceType::CUDA, 0}; }
  CachingDeviceAllocator& allocator() { return *allocator_; }
  // The table the device runs: the simulated CUDA kernels (tests may replace single entries).
  static ops::Kernels kernels() { return ops::kernels_from<sim::KernelWrappers>(DeviceType::CUDA); }

  // The simulated runtime's cudaMalloc/cudaFree/cudaMemGetInfo as the allocator's device interface.
  static DeviceMemoryApi memory_api() {
    DeviceMemoryApi api;
    api.malloc = [](void** p, size_t bytes) {
      const sim::cudaError_t e = sim::cudaMalloc(p, bytes);
      if (e == sim::cudaSuccess) return true;
      sim::cudaGetLastError();
      if (auto error = cuda_malloc_failure(sim::cudaGetErrorName(e), sim::cudaGetErrorString(e))) throw *error;
      return false;
    };
    api.free = [](void* p) { sim::cudaFree(p); };
    api.mem_info = [](size_t* f, size_t* t) { sim::cudaMemGetInfo(f, t); };
    api.on_block = [](void* p, size_t bytes, bool in_use) { sim::note_allocator_block(p, bytes, in_use); };
    return api;
  }

 private:
  static void copy(void* dst, const void* src, size_t bytes, CopyKind kind) {
    const sim::cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? sim::cudaMemcpyHostToDevice
                                  : kind == CopyKind::DeviceToHost ? sim::cudaMemcpyDeviceToHost
                                                                   : sim::cudaMemcpyDeviceToDevice;
    sim::check_cuda(sim::cudaMemcpy(dst, src, bytes, k), "cudaMemcpy");
  }
  static void zero(void* dst, size_t bytes) { sim::check_cuda(sim::cudaMemset(dst, 0, bytes), "cudaMemset"); }

  std::unique_ptr<CachingDeviceAllocator> allocator_;
};

// While it lives, the simulated card reports compute capability major.minor (sim::set_compute_capability);
// 8.0, the simulation's default, again afterwards. 7.5 is a Turing card (T4): GEMMs against
// frozen weights in f16.
class SimulatedComputeCapability {
 public:
  SimulatedComputeCapability(int major, int minor) { sim::set_compute_capability(major, minor); }
  ~SimulatedComputeCapability() { sim::set_compute_capability(8, 0); }
  SimulatedComputeCapability(const SimulatedComputeCapability&) = delete;
  SimulatedComputeCapability& operator=(const SimulatedComputeCapability&) = delete;
};

// The device memory one call takes beyond its inputs and outputs (bytes_in_use counts the bytes
// asked for, unrounded): the peak during `call` above the bytes in use before it and after it.
// cuBLASLt's workspace is held from the first GEMM on (a fixed term of the plan, not scratch of a
// call: gemm_workspace_cuda_test.cpp), so it is in use before the call.
template <class Fn>
size_t scratch_of(SimulatedCudaDevice& card, Fn&& call) {
  const size_t gemm_workspace = SimulatedCudaDevice::kernels().gemm_workspace_bytes();
  EXPECT_EQ(card.allocator().gemm_workspace(gemm_workspace).bytes, gemm_workspace);
  const size_t before = card.allocator().stats().bytes_in_use;
  card.allocator().reset_peak();
  call();
  const MemoryStats after = card.allocator().stats();
  EXPECT_EQ(after.bytes_in_use, before) << "the call kept device memory";
  return after.bytes_peak - before;
}

}  // namespace bp::test
