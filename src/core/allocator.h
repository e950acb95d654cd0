// Device allocators with memory accounting and a limit (DESIGN.md "Allocators").
//
// Every byte of model state, activations and workspace comes from an allocator that counts
// bytes in use, the peak and bytes cached. Going past the limit throws OutOfMemoryError with
// PyTorch-style wording; the allocator's counters are unchanged by a failed allocation.
// The CPU allocator caches nothing (cached is always 0); the CUDA allocator (backend/cuda)
// caches freed blocks and empties its cache before it gives up.
//
// Fault injection (tests, --fault-inject settings): `fail_after_allocations(n)` makes the n-th
// allocation from now throw OutOfMemoryError as if the limit had been hit, once.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace bp {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string name() const;  // "CPU", "CUDA device 0"
};

struct MemoryStats {
  size_t bytes_in_use = 0;  // live allocations
  size_t bytes_peak = 0;    // max of bytes_in_use since the last reset_peak()
  size_t bytes_cached = 0;  // freed but kept by the allocator
  size_t bytes_limit = 0;   // allocations beyond this throw; SIZE_MAX = no limit
  size_t bytes_total = 0;   // device capacity (physical RAM on the CPU)
  uint64_t num_allocs = 0;  // successful allocations since start
  uint64_t num_ooms = 0;    // OutOfMemoryErrors thrown
};

constexpr size_t kNoLimit = SIZE_MAX;

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory aligned to 64 bytes; zero bytes returns nullptr. Throws OutOfMemoryError.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  virtual void empty_cache() {}
  virtual Device device() const = 0;
  // Memory the device could still hand this allocator beyond what it holds (a card's free memory
  // as the driver reports it now); kNoLimit where the allocator does not know (the CPU's).
  virtual size_t device_free_bytes() const { return kNoLimit; }

  MemoryStats stats() const;
  void set_limit(size_t bytes_limit);
  size_t limit() const;
  void reset_peak();
  // Next n-th allocation (1 = the next one) throws OutOfMemoryError once; 0 disarms.
  void fail_after_allocations(uint64_t n);

 protected:
  // Accounting shared by every backend. reserve() throws on limit or injected fault.
  void reserve(size_t bytes);
  void release(size_t bytes);
  void set_cached(size_t bytes);
  void set_total(size_t bytes);
  // An OutOfMemoryError the backend raises itself (the device refused memory within our limit).
  void count_oom();

  mutable std::mutex mu_;
  MemoryStats stats_{0, 0, 0, kNoLimit, 0, 0, 0};
  uint64_t fail_countdown_ = 0;
};

// How bytes move between host memory and a device's memory (cudaMemcpy's kinds).
enum class CopyKind : uint8_t { HostToDevice, DeviceToHost, DeviceToDevice };

// A device's memory as core sees it: its allocator and the copies Tensor needs to reach it from
// the host (host code never dereferences device memory: core/tensor.h). The CUDA backend provides
// the built-in one (cuda_allocator.cpp over cudaMalloc/cudaMemcpy; cuda_stub.cpp throws
// RUNTIME_NOT_BUILT_WITH_CUDA); a test installs the simulated card instead (tests/cuda).
struct DeviceMemory {
  Allocator* allocator = nullptr;
  void (*copy)(void* dst, const void* src, size_t bytes, CopyKind kind) = nullptr;
  void (*zero)(void* dst, size_t bytes) = nullptr;
};
// Replaces the CUDA device memory (every index) until called again; a default-constructed
// DeviceMemory restores the built-in one. Only DeviceType::CUDA can be replaced.
void install_device_memory(DeviceType type, const DeviceMemory& memory);
// True while an installed DeviceMemory (a simulated card) replaces the built-in one of `type`: the
// trainer then treats the device as present although cuda_status() finds no real card.
bool device_memory_installed(DeviceType type);
// Copies `bytes` between host memory and the memory of a device of `type` (or within it).
void device_copy(DeviceType type, void* dst, const void* src, size_t bytes, CopyKind kind);
// Sets `bytes` of a device's memory to zero.
void device_zero(DeviceType type, void* dst, size_t bytes);

// The process-wide CPU allocator.
Allocator& cpu_allocator();
// The allocator for a device; CUDA throws RUNTIME_NOT_BUILT_WITH_CUDA when not compiled in.
Allocator& allocator_for(Device device);

// Physical memory of this machine in bytes.
size_t physical_memory_bytes();

}  // namespace bp
