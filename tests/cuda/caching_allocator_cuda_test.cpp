// The CUDA caching allocator (src/backend/cuda/caching_allocator.h, device_block_pool.h) on the
// simulated runtime's memory budget: counting, segments, best fit with splitting, coalescing, the
// small and large pools, the cap on oversize blocks, the steady state of steps at varying token
// counts, the cache emptied once before an OutOfMemoryError worded like PyTorch's; and the mapping of CUDA/cuBLAS/cuDNN
// failures to error codes (src/backend/cuda/cuda_errors.h), including what the trainer's OOM recovery makes of them.
#include <gtest/gtest.h>

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/cuda_errors.h"
#include "backend/cuda/sim/cuda_sim.h"
#include "sim_device.h"
#include "train/oom_recovery.h"

namespace bp {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

DeviceMemoryApi simulated_api() {
  return test::SimulatedCudaDevice::memory_api();
}

// A simulated card of `total` bytes for one test.
struct SimulatedCard {
  explicit SimulatedCard(size_t total) { sim::set_memory_budget(total); }
  ~SimulatedCard() { sim::set_memory_budget(size_t{16} << 30); }
};

// Requests are counted as asked; the device is asked for segments (2 MiB for requests up to 1 MiB,
// 20 MiB for those under 10 MiB); freed blocks are reused for other sizes of their pool.
TEST(CudaCachingAllocator, CountsBytesAndReusesFreedBlocks) {
  SimulatedCard card(64 * kMiB);
  CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, simulated_api());
  EXPECT_EQ(a.stats().bytes_total, 64 * kMiB);
  EXPECT_EQ(a.stats().bytes_limit, 64 * kMiB);  // the free memory at start
  const uint64_t mallocs = sim::cuda_malloc_calls();
  void* p = a.allocate(1000);
  void* q = a.allocate(3 * kMiB);
  EXPECT_EQ(a.stats().bytes_in_use, 1000 + 3 * kMiB);
  EXPECT_EQ(sim::memory_in_use(), 22 * kMiB) << "a small and a large segment";
  EXPECT_EQ(a.reserved_bytes(), 22 * kMiB);
  EXPECT_EQ(a.stats().bytes_cached, 22 * kMiB - 1024 - 3 * kMiB) << "the segments' free rest";
  a.deallocate(p, 1000);
  EXPECT_EQ(a.stats().bytes_in_use, 3 * kMiB);
  EXPECT_EQ(a.stats().bytes_cached, 19 * kMiB);
  void* p2 = a.allocate(700);  // the same place in the small segment, no new device memory
  EXPECT_EQ(p2, p);
  void* r = a.allocate(5 * kMiB);  // the rest of the large segment
  EXPECT_EQ(static_cast<char*>(r), static_cast<char*>(q) + 3 * kMiB);
  EXPECT_EQ(sim::cuda_malloc_calls(), mallocs + 2);
  EXPECT_EQ(sim::memory_in_use(), 22 * kMiB);
  for (auto [ptr, bytes] : {std::pair{p2, size_t{700}}, {q, 3 * kMiB}, {r, 5 * kMiB}}) a.deallocate(ptr, bytes);
  EXPECT_EQ(a.stats().bytes_cached, 22 * kMiB);
  a.empty_cache();
  EXPECT_EQ(a.stats().bytes_cached, 0u);
  EXPECT_EQ(sim::memory_in_use(), 0u);
}

// Best fit: of the free blocks that hold a request, the smallest; a large block is split (the rest
// stays free, reusable), and freed neighbours merge again so the segment can go back to the device.
TEST(CudaCachingAllocator, BestFitSplitsLargeBlocksAndCoalescesFreedNeighbours) {
  SimulatedCard card(256 * kMiB);
  CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, simulated_api());
  // Three segments of 12, 16 and 14 MiB (requests of 10 MiB or more get their size rounded to 2 MiB).
  void* s12 = a.allocate(12 * kMiB);
  void* s16 = a.allocate(16 * kMiB);
  void* s14 = a.allocate(14 * kMiB);
  EXPECT_EQ(a.reserved_bytes(), 42 * kMiB);
  for (auto [ptr, bytes] : {std::pair{s12, 12 * kMiB}, {s16, 16 * kMiB}, {s14, 14 * kMiB}}) a.deallocate(ptr, bytes);
  const uint64_t mallocs = sim::cuda_malloc_calls();
  void* x = a.allocate(13 * kMiB);
  EXPECT_EQ(x, s14) << "the smallest free block that holds 13 MiB";
  void* y = a.allocate(3 * kMiB);
  EXPECT_EQ(y, s12) << "best fit: the 12 MiB block (the 14 MiB one's 1 MiB rest is too small), split";
  void* z = a.allocate(4 * kMiB);
  EXPECT_EQ(static_cast<char*>(z), static_cast<char*>(s12) + 3 * kMiB) << "the split's rest";
  EXPECT_EQ(sim::cuda_malloc_calls(), mallocs) << "every request reused a cached block";
  EXPECT_EQ(a.stats().bytes_cached, 42 * kMiB - 14 * kMiB - 3 * kMiB - 4 * kMiB);
  // Freed in any order, the 12 MiB segment's three pieces merge into one block again.
  a.deallocate(y, 3 * kMiB);
  a.empty_cache();
  EXPECT_EQ(a.reserved_bytes(), 26 * kMiB) << "the 16 MiB segment went back; the 12 MiB one is still used";
  a.deallocate(z, 4 * kMiB);
  void* whole = a.allocate(12 * kMiB);
  EXPECT_EQ(whole, s12) << "coalesced: the whole segment is one free block again";
  a.deallocate(whole, 12 * kMiB);
  a.deallocate(x, 13 * kMiB);
  a.empty_cache();
  EXPECT_EQ(a.reserved_bytes(), 0u);
  EXPECT_EQ(sim::memory_in_use(), 0u);
}

// Small requests (up to 1 MiB) never take a large block, nor large ones a small block: a small
// tensor kept alive does not pin a large segment.
TEST(CudaCachingAllocator, SmallAndLargeRequestsComeFromSeparatePools) {
  SimulatedCard card(256 * kMiB);
  CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, simulated_api());
  void* big = a.allocate(12 * kMiB);
  a.deallocate(big, 12 * kMiB);
  const uint64_t mallocs = sim::cuda_malloc_calls();
  void* small = a.allocate(4096);
  EXPECT_EQ(sim::cuda_malloc_calls(), mallocs + 1) << "a 2 MiB small segment, not a piece of the cached 12 MiB";
  EXPECT_EQ(sim::memory_in_use(), 14 * kMiB);
  void* large = a.allocate(1536 * 1024);  // 1.5 MiB: large pool, the cached block
  EXPECT_EQ(large, big);
  EXPECT_EQ(sim::cuda_malloc_calls(), mallocs + 1);
  a.deallocate(small, 4096);
  a.deallocate(large, 1536 * 1024);
  a.empty_cache();
  EXPECT_EQ(sim::memory_in_use(), 0u);
}

// max_split_bytes: blocks that large are never split and serve only requests of at least that size
// within 20 MiB of the block; smaller requests get other memory.
TEST(CudaCachingAllocator, OversizeBlocksAreNotSplitAndServeOnlyRequestsClose) {
  SimulatedCard card(512 * kMiB);
  CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, simulated_api(), 64 * kMiB);
  void* huge = a.allocate(100 * kMiB);
  a.deallocate(huge, 100 * kMiB);
  void* mid = a.allocate(30 * kMiB);
  EXPECT_NE(mid, huge) << "below max_split_bytes: not a piece of the 100 MiB block";
  void* far = a.allocate(70 * kMiB);
  EXPECT_NE(far, huge) << "30 MiB smaller than the block: past the 20 MiB cap";
  void* close = a.allocate(85 * kMiB);
  EXPECT_EQ(close, huge) << "within 20 MiB: the whole block, unsplit";
  EXPECT_EQ(a.stats().bytes_cached, 0u) << "the 15 MiB rest is not a free block";
  for (auto [ptr, bytes] : {std::pair{mid, 30 * kMiB}, {far, 70 * kMiB}, {close, 85 * kMiB}}) a.deallocate(ptr, bytes);
  a.empty_cache();
  EXPECT_EQ(sim::memory_in_use(), 0u);
}

// A card without room for a whole segment still serves the request alone: the segment's headroom
// never causes an OOM the request itself would not.
TEST(CudaCachingAllocator, CardWithoutRoomForASegmentGetsTheRequestAlone) {
  SimulatedCard card(6 * kMiB);
  CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, simulated_api());
  void* p = a.allocate(5 * kMiB);  // a 20 MiB segment would not fit
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(sim::memory_in_use(), 5 * kMiB);
  EXPECT_EQ(a.stats().num_ooms, 0u);
  a.deallocate(p, 5 * kMiB);
}

// The allocation pattern of training steps at varying token counts T (packed batches), with
// activations of MiBs: per layer a kept activation [T, 1024] f32, a transient [T, 2816] one and a
// small [T, 2] one; backward frees them in reverse while gradients come and go. After a warm-up
// (one step at the longest T, then 30 at random T, during which the blocks' layout settles with a
// few more segments: a non-moving allocator cannot promise none), 300 steps at random token counts
// reuse the cache: no cudaMalloc, the reserved memory within 1.5x of the peak in use. (With reuse
// of blocks of the same rounded size only, every step whose T had not been seen called cudaMalloc.)
TEST(CudaCachingAllocator, StepsOfVaryingTokenCountsReuseTheCacheAfterAWarmUp) {
  SimulatedCard card(size_t{4} << 30);
  CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, simulated_api());
  auto step = [&](size_t T) {
    std::vector<std::pair<void*, size_t>> kept;
    for (int layer = 0; layer < 8; ++layer) {
      kept.emplace_back(a.allocate(T * 1024 * 4), T * 1024 * 4);
      kept.emplace_back(a.allocate(T * 2 * 4), T * 2 * 4);
      void* transient = a.allocate(T * 2816 * 4);
      a.deallocate(transient, T * 2816 * 4);
    }
    void* grad = a.allocate(T * 1024 * 4);
    for (auto it = kept.rbegin(); it != kept.rend(); ++it) {
      void* next_grad = a.allocate(T * 1024 * 4);
      void* scratch = a.allocate(T * 2816 * 4);
      a.deallocate(scratch, T * 2816 * 4);
      a.deallocate(grad, T * 1024 * 4);
      grad = next_grad;
      a.deallocate(it->first, it->second);
    }
    a.deallocate(grad, T * 1024 * 4);
  };
  uint32_t x = 99;
  auto random_tokens = [&x] {
    x = x * 1103515245u + 12345u;
    return 1 + (x >> 8) % 2048;
  };
  step(2048);
  const size_t peak_in_use = a.stats().bytes_peak;
  const uint64_t before_warm_up = sim::cuda_malloc_calls();
  for (int i = 0; i < 30; ++i) step(random_tokens());
  const uint64_t mallocs = sim::cuda_malloc_calls();
  EXPECT_LE(mallocs - before_warm_up, 8u) << "a few segments more while the layout settles (measured: 4)";
  const size_t reserved = a.reserved_bytes();
  for (int i = 0; i < 300; ++i) step(random_tokens());
  EXPECT_EQ(sim::cuda_malloc_calls(), mallocs) << "steady state: no cudaMalloc";
  EXPECT_EQ(a.reserved_bytes(), reserved);
  EXPECT_LT(reserved, peak_in_use * 3 / 2) << "reserved " << reserved << " for a peak of " << peak_in_use;
  EXPECT_EQ(a.stats().bytes_in_use, 0u);
  a.empty_cache();
  EXPECT_EQ(sim::memory_in_use(), 0u) << "every segment whole again: all went back";
}

TEST(CudaCachingAllocator, EmptiesItsCacheOnceBeforeGivingUp) {
  SimulatedCard card(10 * kMiB);
  CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, simulated_api());
  void* small = a.allocate(6 * kMiB);
  a.deallocate(small, 6 * kMiB);  // cached: the device still holds 6 MiB
  EXPECT_EQ(sim::memory_in_use(), 6 * kMiB);
  void* big = a.allocate(8 * kMiB);  // does not fit next to the cached block: cache emptied, retried
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(a.stats().bytes_cached, 0u);
  EXPECT_EQ(sim::memory_in_use(), 8 * kMiB);
  a.deallocate(big, 8 * kMiB);
}

TEST(CudaCachingAllocator, DeviceRefusalThrowsAPyTorchWordedOutOfMemoryError) {
  SimulatedCard card(32 * kMiB);
  CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, simulated_api());
  void* held = a.allocate(20 * kMiB);
  void* cached = a.allocate(2 * kMiB);
  a.deallocate(cached, 2 * kMiB);
  void* other = nullptr;  // another process takes 8 MiB of the card behind our back
  ASSERT_EQ(sim::cudaMalloc(&other, 8 * kMiB), sim::cudaSuccess);
  const uint64_t ooms_before = a.stats().num_ooms;
  try {
    a.allocate(6 * kMiB);
    ADD_FAILURE() << "no OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_GPU_OOM);
    EXPECT_EQ(e.bytes_requested(), 6 * kMiB);
    EXPECT_EQ(e.bytes_in_use(), 20 * kMiB);
    EXPECT_EQ(e.bytes_cached(), 0u);  // the cache was emptied before giving up
    EXPECT_EQ(e.bytes_total(), 32 * kMiB);
    EXPECT_NE(m.find("Tried to allocate 6.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("total capacity of 32.00 MiB of which 4.00 MiB is free"), std::string::npos) << m;
    EXPECT_NE(m.find("20.00 MiB is allocated"), std::string::npos) << m;
    EXPECT_EQ(classify_oom(e), OomKind::OutOfMemory);
  }
  EXPECT_EQ(a.stats().bytes_in_use, 20 * kMiB);  // the failed request is not counted
  EXPECT_EQ(a.stats().num_ooms, ooms_before + 1) << "the card's refusal counts as an OOM, like our limit's";
  EXPECT_EQ(a.stats().bytes_limit, 32 * kMiB) << "our own limit was not what failed";
  sim::cudaFree(other);
  a.deallocate(held, 20 * kMiB);
}

// On the device's refusal the cache is emptied once: the free segments go back (a segment with a
// live block stays), the segment and then the request alone are asked again, and then the
// OutOfMemoryError; the device is asked four times in all, never in a loop.
TEST(CudaCachingAllocator, RefusalEmptiesTheCacheOnceThenThrows) {
  SimulatedCard card(40 * kMiB);
  int mallocs = 0, frees = 0;
  DeviceMemoryApi api = simulated_api();
  api.malloc = [&, inner = api.malloc](void** p, size_t bytes) {
    ++mallocs;
    return inner(p, bytes);
  };
  api.free = [&, inner = api.free](void* p) {
    ++frees;
    inner(p);
  };
  CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, api);
  a.set_limit(kNoLimit);               // the device refuses, not our limit
  void* live = a.allocate(12 * kMiB);  // a 12 MiB segment, kept
  void* cached_small = a.allocate(4096);
  void* cached_large = a.allocate(14 * kMiB);
  a.deallocate(cached_small, 4096);
  a.deallocate(cached_large, 14 * kMiB);
  EXPECT_EQ(sim::memory_in_use(), 28 * kMiB);
  mallocs = frees = 0;
  EXPECT_THROW(a.allocate(30 * kMiB), OutOfMemoryError);
  EXPECT_EQ(frees, 2) << "both free segments went back, once";
  EXPECT_EQ(mallocs, 2) << "30 MiB is its own segment size: asked before and after emptying the cache";
  EXPECT_EQ(sim::memory_in_use(), 12 * kMiB);
  EXPECT_EQ(a.stats().bytes_cached, 0u);
  void* other = nullptr;  // another process takes 20 MiB of the card
  ASSERT_EQ(sim::cudaMalloc(&other, 20 * kMiB), sim::cudaSuccess);
  mallocs = frees = 0;
  EXPECT_THROW(a.allocate(9 * kMiB), OutOfMemoryError);  // a 20 MiB segment, then 9 MiB alone: twice each
  EXPECT_EQ(mallocs, 4);
  EXPECT_EQ(frees, 0) << "nothing left to empty";
  sim::cudaFree(other);
  a.deallocate(live, 12 * kMiB);
}

TEST(CudaCachingAllocator, MaxMemoryLimitIsEnforcedBeforeTheDevice) {
  SimulatedCard card(64 * kMiB);
  CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, simulated_api());
  a.set_limit(4 * kMiB);  // --max-memory 4MiB
  void* p = a.allocate(3 * kMiB);
  EXPECT_THROW(a.allocate(2 * kMiB), OutOfMemoryError);
  EXPECT_EQ(sim::memory_in_use(), 3 * kMiB);  // the device was never asked; no segment past the limit either
  a.deallocate(p, 3 * kMiB);
}

TEST(CudaErrors, LibraryAllocationFailuresTakeTheOomAdjacentPath) {
  for (const char* name : {"CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED", "CUDNN_STATUS_NOT_INITIALIZED",
                           "CUBLAS_STATUS_NOT_INITIALIZED", "cudaErrorMemoryAllocation"}) {
    Error e = cuda_failure("cublasLtMatmul", name, "resource allocation failed");
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_OOM_ADJACENT) << name;
    EXPECT_EQ(classify_oom(e), OomKind::Adjacent) << name;
  }
}

TEST(CudaErrors, StickyErrorsStopWithTheLaunchBlockingAdvice) {
  for (sim::cudaError_t code : {sim::cudaErrorIllegalAddress, sim::cudaErrorLaunchFailure}) {
    Error e = cuda_failure("rms_norm_forward_kernel", sim::cudaGetErrorName(code), sim::cudaGetErrorString(code));
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_GPU_KERNEL_FAULT) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA_LAUNCH_BLOCKING=1"), std::string::npos) << e.what();
    EXPECT_EQ(classify_oom(e), OomKind::None) << "a dead context is not recoverable by a smaller batch";
  }
  EXPECT_EQ(cuda_failure_code("CUBLAS_STATUS_EXECUTION_FAILED"), ErrorCode::RUNTIME_GPU_KERNEL_FAULT);
  EXPECT_EQ(cuda_failure_code("cudaErrorInvalidValue"), ErrorCode::RUNTIME_INTERNAL);
  EXPECT_EQ(cuda_failure_code("cudaErrorInsufficientDriver"), ErrorCode::DEP_GPU_NOT_AVAILABLE);
}

// A failed cudaMalloc is out of memory only when it says so: a sticky error from an earlier kernel
// surfacing there is a dead context, which the OOM recovery (halve the batch, retry) cannot fix.
TEST(CudaErrors, OnlyMemoryAllocationFailuresOfCudaMallocAreOutOfMemory) {
  EXPECT_FALSE(cuda_malloc_failure("cudaErrorMemoryAllocation", "out of memory").has_value());
  for (sim::cudaError_t code : {sim::cudaErrorIllegalAddress, sim::cudaErrorLaunchFailure}) {
    const std::optional<Error> e = cuda_malloc_failure(sim::cudaGetErrorName(code), sim::cudaGetErrorString(code));
    ASSERT_TRUE(e.has_value()) << sim::cudaGetErrorName(code);
    EXPECT_EQ(e->code(), ErrorCode::RUNTIME_GPU_KERNEL_FAULT) << e->what();
    EXPECT_NE(std::string(e->what()).find("cudaMalloc"), std::string::npos) << e->what();
    EXPECT_EQ(classify_oom(*e), OomKind::None) << e->what();
  }
  const std::optional<Error> invalid = cuda_malloc_failure("cudaErrorInvalidValue", "invalid argument");
  ASSERT_TRUE(invalid.has_value());
  EXPECT_EQ(invalid->code(), ErrorCode::RUNTIME_INTERNAL);
  const std::optional<Error> no_driver = cuda_malloc_failure("cudaErrorInsufficientDriver", "driver too old");
  ASSERT_TRUE(no_driver.has_value());
  EXPECT_EQ(no_driver->code(), ErrorCode::DEP_GPU_NOT_AVAILABLE);
}

// The same through the caching allocator and the trainer's OOM recovery: a cudaMalloc that fails
// with a sticky error (as the real allocator's cudaMalloc lambda classifies it) stops the step at
// once; one that fails for lack of memory empties the cache, then halves the micro-batch.
TEST(CudaErrors, StickyErrorAtCudaMallocIsNotRecoveredAsOutOfMemory) {
  for (const char* status : {"cudaErrorIllegalAddress", "cudaErrorMemoryAllocation"}) {
    SCOPED_TRACE(status);
    int device_calls = 0;
    DeviceMemoryApi api = simulated_api();
    api.malloc = [&](void**, size_t) {
      ++device_calls;
      if (auto error = cuda_malloc_failure(status, "refused")) throw *error;
      return false;
    };
    CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, api);
    OomRecovery recovery(4, 4, true, a);
    std::vector<int64_t> micro_sizes;
    auto run = [&] {
      recovery.run_step(
          4,
          [&](int64_t b, int64_t e) {
            micro_sizes.push_back(e - b);
            if (e - b > 1) (void)a.allocate(1 << 20);
          },
          [] {}, [](const OomEvent&) {});
    };
    if (std::string(status) == "cudaErrorIllegalAddress") {
      try {
        run();
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::RUNTIME_GPU_KERNEL_FAULT) << e.what();
      }
      EXPECT_EQ(micro_sizes, (std::vector<int64_t>{4})) << "no smaller batch was tried";
      EXPECT_EQ(device_calls, 1) << "no cache-emptying retry either";
    } else {
      run();
      EXPECT_EQ(micro_sizes.front(), 4);
      EXPECT_EQ(micro_sizes.back(), 1) << "out of memory: the micro-batch was halved";
      EXPECT_EQ(recovery.micro_seqs(), 1);
    }
  }
}

// A faulting kernel on the simulation: the launch reports it through cudaGetLastError, as <<<>>> does.
TEST(CudaErrors, InjectedLaunchFaultIsReportedByTheNextErrorCheck) {
  sim::inject_launch_error(sim::cudaErrorIllegalAddress);
  sim::launch_grid(sim::dim3(1), sim::dim3(32), 0, [] {});
  const sim::cudaError_t e = sim::cudaGetLastError();
  EXPECT_EQ(e, sim::cudaErrorIllegalAddress);
  EXPECT_EQ(cuda_failure_code(sim::cudaGetErrorName(e)), ErrorCode::RUNTIME_GPU_KERNEL_FAULT);
}

TEST(CudaErrors, DriverOlderThanRuntimeNamesBothVersions) {
  try {
    check_driver_supports_runtime(12040, 13000);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::DEP_GPU_NOT_AVAILABLE);
    const std::string m = e.what();
    EXPECT_NE(m.find("CUDA 12.4"), std::string::npos) << m;
    EXPECT_NE(m.find("CUDA 13.0"), std::string::npos) << m;
  }
  EXPECT_NO_THROW(check_driver_supports_runtime(13000, 13000));
  EXPECT_NO_THROW(check_driver_supports_runtime(13010, 13000));
  EXPECT_THROW(check_driver_supports_runtime(0, 13000), Error);
  EXPECT_THROW(check_driver_supports_runtime(12090, 13010), Error);
}

// CUDA's minor-version compatibility: a runtime runs on any driver of its major version.
TEST(CudaErrors, DriverOfTheSameMajorVersionRunsANewerMinorRuntime) {
  EXPECT_NO_THROW(check_driver_supports_runtime(13000, 13010));
  EXPECT_NO_THROW(check_driver_supports_runtime(12040, 12080));
  EXPECT_NO_THROW(check_driver_supports_runtime(13000, 12080));
}

// A card older than the build's kernels (sm_75+, CUDA 13's oldest target) is unusable with a
// reason naming it, its compute capability, the minimum and CUDA 13; Turing (7.5) and newer are
// usable.
TEST(CudaErrors, CardsOlderThanTuringAreReportedUnusable) {
  const std::string v100 = unsupported_device_reason("Tesla V100", 7, 0);
  EXPECT_NE(v100.find("Tesla V100"), std::string::npos) << v100;
  EXPECT_NE(v100.find("7.0"), std::string::npos) << v100;
  EXPECT_NE(v100.find("7.5 or newer"), std::string::npos) << v100;
  EXPECT_NE(v100.find("CUDA 13"), std::string::npos) << v100;
  EXPECT_FALSE(unsupported_device_reason("Tesla P100", 6, 0).empty());
  EXPECT_FALSE(unsupported_device_reason("Jetson Xavier", 7, 2).empty());
  EXPECT_TRUE(unsupported_device_reason("Tesla T4", 7, 5).empty());
  EXPECT_TRUE(unsupported_device_reason("RTX 2080 Ti", 7, 5).empty());
  EXPECT_TRUE(unsupported_device_reason("A100", 8, 0).empty());
  EXPECT_TRUE(unsupported_device_reason("RTX 4090", 8, 9).empty());
  EXPECT_TRUE(unsupported_device_reason("H100", 9, 0).empty());
  EXPECT_TRUE(unsupported_device_reason("B200", 10, 0).empty());
}

}  // namespace
}  // namespace bp
