// The CUDA caching allocator, written against a small device-memory interface so the same code
// runs on the real runtime (cuda_allocator.cpp) and on the simulated one with its memory budget
// (tests/cuda/caching_allocator_cuda_test.cpp). Host C++20 only (never seen by nvcc).
//
// Counting: every allocation is counted by Allocator::reserve (bytes requested, against the limit:
// the device's free memory when the allocator starts, or --max-memory when the trainer sets it).
// Reuse (device_block_pool.h, PyTorch's documented scheme): the device memory is held in segments
// (one cudaMalloc each: 2 MiB for requests up to 1 MiB, 20 MiB for requests under 10 MiB, the
// request rounded to 2 MiB beyond); a request takes the best-fitting free block of its pool (small
// or large), split when the rest is worth keeping; freed blocks merge with free neighbours. So
// activations whose sizes change from step to step (packed batches of varying token counts) reuse
// what earlier steps freed, and a training step in steady state calls cudaMalloc not at all
// (tests/cuda/allocator_steady_state_cuda_test.cpp). bytes_cached is the free part of the segments
// ("reserved but unallocated", as PyTorch says); reserved = in use + cached, give or take the
// 512-byte rounding and the unsplit rests (< 1 MiB) of live blocks.
// A segment that would take the memory held past the limit is the request alone.
// Failure: when the device refuses a segment (cudaMalloc fails: the card's real free memory, which
// other processes share, is the other bound), the request alone (rounded to 512 bytes) is asked
// instead — the segment's headroom never causes an OOM that the request would not; if that fails
// too, the cache (every segment whose memory is all free) is emptied once and both retried; then
// OutOfMemoryError says what was requested, allocated, reserved, free and the total, worded like
// PyTorch's message (core/error.cpp), with the device's free memory as it is now, and counted in
// stats().num_ooms like an OOM of our own limit.
// Held workspace: the one block cuBLASLt's GEMMs use (gemm_workspace below; kernel_wrappers.h): in
// use from the first GEMM until it is released (a run's end) or the allocator ends, counted in
// bytes_in_use like any allocation.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>

#include "backend/cuda/device_block_pool.h"
#include "core/allocator.h"
#include "core/error.h"

namespace bp {

struct DeviceMemoryApi {
  // false when the device is out of memory (last error cleared); throws on any other failure
  std::function<bool(void** ptr, size_t bytes)> malloc;
  std::function<void(void* ptr)> free;
  std::function<void(size_t* free_bytes, size_t* total_bytes)> mem_info;
  // Optional: told of every block handed out (in_use) and given back, with its size (the simulated
  // card's write check watches blocks, not whole segments; none on a real card).
  std::function<void(void* ptr, size_t bytes, bool in_use)> on_block;
};

class CachingDeviceAllocator final : public Allocator {
 public:
  // max_split_bytes: blocks this large or larger are never split (device_block_pool.h); no limit
  // unless a test sets one.
  CachingDeviceAllocator(Device device, DeviceMemoryApi api, size_t max_split_bytes = SIZE_MAX)
      : device_(device), api_(std::move(api)), pool_(max_split_bytes) {
    size_t free_b = 0, total_b = 0;
    api_.mem_info(&free_b, &total_b);
    set_total(total_b);
    set_limit(free_b);
  }
  ~CachingDeviceAllocator() override {
    release_gemm_workspace();
    empty_cache();
  }

  static size_t round_size(size_t bytes) { return DeviceBlockPool::round_size(bytes); }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t r = round_size(bytes);
    reserve(bytes);  // counts the bytes; throws OutOfMemoryError past the limit
    try {
      std::lock_guard<std::mutex> g(cache_mu_);
      void* p = pool_.take(r);
      if (!p) p = new_segment(r);
      if (!p) {
        empty_cache_locked();  // once: free segments of the other pool, or too small, may be what is missing
        p = new_segment(r);
      }
      set_cached(pool_.free_bytes());
      if (p && api_.on_block) api_.on_block(p, pool_.block_bytes(p), true);
      if (p) return p;
    } catch (...) {  // a sticky error at cudaMalloc (cuda_malloc_failure): the request is not counted
      {
        std::lock_guard<std::mutex> g(cache_mu_);
        set_cached(pool_.free_bytes());  // the cache may have been emptied before the error
      }
      release(bytes);
      throw;
    }
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
    {
      std::lock_guard<std::mutex> g(cache_mu_);
      if (api_.on_block) api_.on_block(ptr, pool_.block_bytes(ptr), false);
      pool_.give_back(ptr);  // false (not ours) cannot happen through Tensor; nothing to give back then
      set_cached(pool_.free_bytes());
    }
    release(bytes);
  }
  void empty_cache() override {
    workspace_refused_by_device_ = false;  // the device may have room for the GEMM workspace again
    std::lock_guard<std::mutex> g(cache_mu_);
    empty_cache_locked();
    set_cached(pool_.free_bytes());
  }
  // Device memory held in segments (in use or cached): what the card sees this allocator hold.
  size_t reserved_bytes() const {
    std::lock_guard<std::mutex> g(cache_mu_);
    return pool_.reserved_bytes();
  }
  Device device() const override { return device_; }

  // cuBLASLt's workspace for the GEMMs of this device: `bytes` (cuda_workspace::gemm_workspace_bytes
  // of the card) held by the allocator from the first call on and handed to every later call: one
  // per device, not per call, because every GEMM of the backend runs on the default stream (the
  // stream orders them, so none shares it with another at the same time) and because the memory plan
  // can then count it as one fixed term (memory_plan.h gemm_workspace) instead of a transient at each
  // GEMM. Allocated through allocate() (counted: in use, in OOM messages), never twice: a call for
  // another size (another compute capability, in the simulation) gives the old block back first.
  // Not emptied with the cache (it is in use; the OOM recovery's retry reuses it); freed by
  // release_gemm_workspace() (the trainer's end: train/trainer.cpp) and when the allocator ends.
  // When it cannot be had, the GEMM gets none ({nullptr, 0}: cuBLASLt then chooses among the
  // algorithms that need no workspace, slower but correct) instead of failing the run. The plan
  // counts it, so that happens when a run goes past its plan (a --micro-batch-size forced over it)
  // or other processes hold the card's memory: past our limit nothing is asked (no OOM counted) and
  // the next GEMM asks again; when the device refuses (or an injected OOM hits this allocation), the
  // OutOfMemoryError is counted once and the GEMMs go without until the cache is next emptied (the
  // OOM recovery does). tests/cuda/gemm_workspace_cuda_test.cpp makes each case happen.
  struct HeldWorkspace {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  HeldWorkspace gemm_workspace(size_t bytes) {
    std::lock_guard<std::mutex> g(workspace_mu_);
    if (workspace_.bytes == bytes) return workspace_;
    release_gemm_workspace_locked();
    if (bytes == 0 || workspace_refused_by_device_) return {};
    const MemoryStats s = stats();
    if (bytes > s.bytes_limit - std::min(s.bytes_limit, s.bytes_in_use)) return {};
    try {
      workspace_ = {allocate(bytes), bytes};
    } catch (const OutOfMemoryError&) {
      workspace_refused_by_device_ = true;
    }
    return workspace_;
  }
  void release_gemm_workspace() {
    std::lock_guard<std::mutex> g(workspace_mu_);
    release_gemm_workspace_locked();
  }
  // The bytes of the workspace held now (0 when none).
  size_t gemm_workspace_bytes() const {
    std::lock_guard<std::mutex> g(workspace_mu_);
    return workspace_.bytes;
  }
  size_t device_free_bytes() const override {
    size_t free_b = 0, total_b = 0;
    api_.mem_info(&free_b, &total_b);
    return free_b;
  }

 private:
  // A new segment for a request of `rounded` bytes: the pool's segment size, or the request alone
  // when the segment would take the memory held past our limit (--max-memory: the card holds no more
  // than asked for where it can be helped) or the device refuses it. nullptr: the device refused both.
  void* new_segment(size_t rounded) {
    size_t segment = DeviceBlockPool::segment_size(rounded);
    const size_t limit = this->limit();
    if (limit != kNoLimit && pool_.reserved_bytes() + segment > limit) segment = rounded;
    void* p = nullptr;
    if (api_.malloc(&p, segment)) return pool_.add_segment(p, segment, rounded);
    if (segment > rounded && api_.malloc(&p, rounded)) return pool_.add_segment(p, rounded, rounded);
    return nullptr;
  }
  void empty_cache_locked() {
    for (const auto& [ptr, bytes] : pool_.take_free_segments()) api_.free(ptr);
  }

  void release_gemm_workspace_locked() {
    if (workspace_.ptr) deallocate(workspace_.ptr, workspace_.bytes);
    workspace_ = {};
  }

  Device device_;
  DeviceMemoryApi api_;
  mutable std::mutex workspace_mu_;  // taken before the others (allocate, deallocate), never after
  HeldWorkspace workspace_;
  std::atomic<bool> workspace_refused_by_device_{false};
  mutable std::mutex cache_mu_;
  DeviceBlockPool pool_;
};

}  // namespace bp
