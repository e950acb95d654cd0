// The CUDA caching allocator, written against a small device-memory interface so the same code
// runs on the real runtime (cuda_allocator.cpp) and on the simulated one with its memory budget
// (tests/cuda/caching_allocator_cuda_test.cpp). Host C++20 only (never seen by nvcc).
//
// Counting: every allocation is counted by Allocator::reserve (bytes requested, against the limit:
// the device's free memory when the allocator starts, or --max-memory when the trainer sets it);
// freed blocks go to a cache keyed by their rounded size (512-byte multiples) and are counted as
// cached ("reserved but unallocated", as PyTorch says) until reused or returned.
// Failure: when the device refuses (cudaMalloc fails: the card's real free memory, which other
// processes share, is the other bound), the cache is emptied once and the request retried; if it
// fails again OutOfMemoryError says what was requested, allocated, reserved, free and the total,
// worded like PyTorch's message (core/error.cpp), with the device's free memory as it is now, and
// counted in stats().num_ooms like an OOM of our own limit.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "core/allocator.h"
#include "core/error.h"

namespace bp {

struct DeviceMemoryApi {
  // false when the device is out of memory (last error cleared); throws on any other failure
  std::function<bool(void** ptr, size_t bytes)> malloc;
  std::function<void(void* ptr)> free;
  std::function<void(size_t* free_bytes, size_t* total_bytes)> mem_info;
};

class CachingDeviceAllocator final : public Allocator {
 public:
  CachingDeviceAllocator(Device device, DeviceMemoryApi api) : device_(device), api_(std::move(api)) {
    size_t free_b = 0, total_b = 0;
    api_.mem_info(&free_b, &total_b);
    set_total(total_b);
    set_limit(free_b);
  }
  ~CachingDeviceAllocator() override { empty_cache(); }

  static size_t round_size(size_t bytes) { return (bytes + 511) / 512 * 512; }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t r = round_size(bytes);
    reserve(bytes);  // counts the bytes; throws OutOfMemoryError past the limit
    if (void* p = take_cached(r)) return p;
    void* p = nullptr;
    if (api_.malloc(&p, r)) return p;
    empty_cache();  // once: cached blocks of other sizes may be what the device is missing
    if (api_.malloc(&p, r)) return p;
    release(bytes);
    count_oom();  // the device's refusal is an OOM of this allocator as much as our limit's
    size_t free_b = 0, total_b = 0;
    api_.mem_info(&free_b, &total_b);
    const auto s = stats();
    const size_t reserved = s.bytes_in_use + s.bytes_cached;
    throw OutOfMemoryError(device_.name(), bytes, s.bytes_in_use, s.bytes_cached,
                           std::min(s.bytes_limit, reserved + free_b), total_b);
  }
  void deallocate(void* ptr, size_t bytes) override {
    if (!ptr) return;
    const size_t r = round_size(bytes);
    {
      std::lock_guard<std::mutex> g(cache_mu_);
      cache_.emplace(r, ptr);
      cached_bytes_ += r;
      set_cached(cached_bytes_);
    }
    release(bytes);
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> g(cache_mu_);
    for (auto& [size, p] : cache_) api_.free(p);
    cache_.clear();
    cached_bytes_ = 0;
    set_cached(0);
  }
  Device device() const override { return device_; }
  size_t device_free_bytes() const override {
    size_t free_b = 0, total_b = 0;
    api_.mem_info(&free_b, &total_b);
    return free_b;
  }

 private:
  void* take_cached(size_t rounded) {
    std::lock_guard<std::mutex> g(cache_mu_);
    auto it = cache_.find(rounded);
    if (it == cache_.end()) return nullptr;
    void* p = it->second;
    cached_bytes_ -= rounded;
    cache_.erase(it);
    set_cached(cached_bytes_);
    return p;
  }

  Device device_;
  DeviceMemoryApi api_;
  std::mutex cache_mu_;
  std::multimap<size_t, void*> cache_;
  size_t cached_bytes_ = 0;
};

}  // namespace bp
