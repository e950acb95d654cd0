#include "core/allocator.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"

namespace bp {

std::string Device::name() const {
  return type == DeviceType::CPU ? std::string("CPU") : fmt::format("CUDA device {}", index);
}

MemoryStats Allocator::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

void Allocator::set_limit(size_t bytes_limit) {
  std::lock_guard<std::mutex> g(mu_);
  stats_.bytes_limit = bytes_limit;
}

size_t Allocator::limit() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_.bytes_limit;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> g(mu_);
  stats_.bytes_peak = stats_.bytes_in_use;
}

void Allocator::fail_after_allocations(uint64_t n) {
  std::lock_guard<std::mutex> g(mu_);
  fail_countdown_ = n;
}

void Allocator::reserve(size_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  bool injected = false;
  if (fail_countdown_ > 0 && --fail_countdown_ == 0) injected = true;
  bool over = stats_.bytes_limit != kNoLimit &&
              (bytes > stats_.bytes_limit || stats_.bytes_in_use > stats_.bytes_limit - bytes);
  if (injected || over) {
    ++stats_.num_ooms;
    throw OutOfMemoryError(device().name(), bytes, stats_.bytes_in_use, stats_.bytes_cached,
                           stats_.bytes_limit == kNoLimit ? stats_.bytes_total : stats_.bytes_limit,
                           stats_.bytes_total);
  }
  stats_.bytes_in_use += bytes;
  ++stats_.num_allocs;
  if (stats_.bytes_in_use > stats_.bytes_peak) stats_.bytes_peak = stats_.bytes_in_use;
}

void Allocator::release(size_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  stats_.bytes_in_use -= bytes;
}

void Allocator::set_cached(size_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  stats_.bytes_cached = bytes;
}

void Allocator::count_oom() {
  std::lock_guard<std::mutex> g(mu_);
  ++stats_.num_ooms;
}

void Allocator::set_total(size_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  stats_.bytes_total = bytes;
}

size_t physical_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

namespace {

// glibc serves blocks above a threshold (128 KiB at first, raised up to 32 MiB as such blocks are
// freed) with mmap and unmaps them on free, and gives the top of the heap back once more than
// twice that is free. A training step allocates the same activation and workspace blocks (MiBs
// each) every step, so each step page-faulted them in again: ~136 k minor faults (0.53 GB) per
// SmolLM-135M step, 5 % of a step's CPU time at one thread and ~11 % at two, where the faults
// serialise on the process's memory lock (docs/benchmarks.md, issue 14 section). Blocks up to
// 32 MiB (glibc's maximum threshold) now come from the heap and freed memory stays for the next
// step; RSS stays at the step's peak, which the memory plan counts anyway.
void keep_freed_blocks_for_reuse() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

class CpuAllocator final : public Allocator {
  static constexpr size_t kAlign = 64;

 public:
  CpuAllocator() {
    set_total(physical_memory_bytes());
    keep_freed_blocks_for_reuse();
  }
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    reserve(bytes);
    // malloc + manual 64-byte alignment, not aligned_alloc: glibc 2.36's aligned_alloc never reuses
    // a freed multi-MiB block (it asks for alignment slack the freed block lacks) and grows the
    // heap by the block's size at each repeat. The pointer malloc gave sits just before the block.
    void* raw = std::malloc(bytes + kAlign);
    if (!raw) {
      release(bytes);
      throw std::bad_alloc();  // OOM-adjacent: the trainer maps it to RUNTIME_OOM_ADJACENT
    }
    const uintptr_t aligned = (reinterpret_cast<uintptr_t>(raw) + kAlign) & ~uintptr_t(kAlign - 1);
    void* p = reinterpret_cast<void*>(aligned);
    static_cast<void**>(p)[-1] = raw;  // malloc aligns to 16, so there are at least 16 bytes before p
    return p;
  }
  void deallocate(void* ptr, size_t bytes) override {
    if (!ptr) return;
    std::free(static_cast<void**>(ptr)[-1]);
    release(bytes);
  }
  Device device() const override { return Device{DeviceType::CPU, 0}; }
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

// backend/cuda (cuda_allocator.cpp, or cuda_stub.cpp in builds without CUDA)
Allocator* cuda_allocator(int index);
void cuda_copy(void* dst, const void* src, size_t bytes, CopyKind kind);
void cuda_zero(void* dst, size_t bytes);

namespace {

std::mutex installed_mu;
DeviceMemory installed_cuda;  // allocator == nullptr: the built-in one

DeviceMemory cuda_memory() {
  std::lock_guard<std::mutex> g(installed_mu);
  return installed_cuda;
}

}  // namespace

void install_device_memory(DeviceType type, const DeviceMemory& memory) {
  BP_CHECK(type == DeviceType::CUDA, "[allocator] only CUDA device memory can be installed");
  BP_CHECK(
      (memory.allocator == nullptr) == (memory.copy == nullptr) && (memory.copy == nullptr) == (memory.zero == nullptr),
      "[allocator] a device memory needs its allocator, copy and zero together");
  std::lock_guard<std::mutex> g(installed_mu);
  installed_cuda = memory;
}

bool device_memory_installed(DeviceType type) {
  return type == DeviceType::CUDA && cuda_memory().allocator != nullptr;
}

Allocator& allocator_for(Device device) {
  if (device.type == DeviceType::CPU) return cpu_allocator();
  if (Allocator* a = cuda_memory().allocator) return *a;
  return *cuda_allocator(device.index);
}

void device_copy(DeviceType type, void* dst, const void* src, size_t bytes, CopyKind kind) {
  if (bytes == 0) return;
  if (type == DeviceType::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const DeviceMemory m = cuda_memory();
  if (m.copy)
    m.copy(dst, src, bytes, kind);
  else
    cuda_copy(dst, src, bytes, kind);
}

void device_zero(DeviceType type, void* dst, size_t bytes) {
  if (bytes == 0) return;
  if (type == DeviceType::CPU) {
    std::memset(dst, 0, bytes);
    return;
  }
  const DeviceMemory m = cuda_memory();
  if (m.zero)
    m.zero(dst, bytes);
  else
    cuda_zero(dst, bytes);
}

}  // namespace bp
