// What CUDA devices this machine has, as every layer may ask it (`info`, the trainer's --device
// check, estimate-vram's memory limit). Declared here in core, defined by the CUDA backend
// (backend/cuda/cuda_allocator.cpp, or cuda_stub.cpp in builds without CUDA): core stays below the
// backends, as core/allocator.cpp does with cuda_allocator(). Never throws: a machine without a
// usable GPU says why in why_unavailable.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace bp {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  size_t bytes_total = 0;
  size_t bytes_free = 0;
  int cc_major = 0, cc_minor = 0;
  // cudaMemGetInfo needs a context on the device: cuda_status() measures free memory on device 0
  // (the one training uses) only, so other devices get no context just for `info`.
  bool free_measured = false;
};

struct CudaStatus {
  bool compiled = false;        // the CUDA backend is built in
  int runtime_version = 0;      // e.g. 13000
  int driver_version = 0;       // 0 when no driver is loaded
  std::string why_unavailable;  // empty when at least one device is usable
  std::string compute;          // what the CUDA kernels compute in (backend/cuda/compute_precision.h)
  std::vector<CudaDeviceInfo> devices;
  // A CUDA build, a visible device, and device 0 usable: where `--device auto` trains on the GPU.
  bool usable() const { return compiled && !devices.empty() && why_unavailable.empty(); }
};

CudaStatus cuda_status();

}  // namespace bp
