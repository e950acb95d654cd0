// The CUDA caching allocator (src/backend/cuda/caching_allocator.h) on the simulated runtime's
// memory budget, and the mapping of CUDA/cuBLAS/cuDNN failures to error codes
// (src/backend/cuda/cuda_errors.h), including what the trainer's OOM recovery makes of them.
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

TEST(CudaCachingAllocator, CountsBytesAndReusesFreedBlocks) {
  SimulatedCard card(64 * kMiB);
  CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, simulated_api());
  EXPECT_EQ(a.stats().bytes_total, 64 * kMiB);
  EXPECT_EQ(a.stats().bytes_limit, 64 * kMiB);  // the free memory at start
  void* p = a.allocate(1000);
  void* q = a.allocate(3 * kMiB);
  EXPECT_EQ(a.stats().bytes_in_use, 1000 + 3 * kMiB);
  EXPECT_EQ(sim::memory_in_use(), 1024 + 3 * kMiB);  // rounded to 512 bytes on the device
  a.deallocate(p, 1000);
  EXPECT_EQ(a.stats().bytes_in_use, 3 * kMiB);
  EXPECT_EQ(a.stats().bytes_cached, 1024u);
  void* p2 = a.allocate(700);  // same rounded size: the cached block, no new device memory
  EXPECT_EQ(p2, p);
  EXPECT_EQ(a.stats().bytes_cached, 0u);
  EXPECT_EQ(sim::memory_in_use(), 1024 + 3 * kMiB);
  a.deallocate(p2, 700);
  a.deallocate(q, 3 * kMiB);
  a.empty_cache();
  EXPECT_EQ(sim::memory_in_use(), 0u);
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

TEST(CudaCachingAllocator, MaxMemoryLimitIsEnforcedBeforeTheDevice) {
  SimulatedCard card(64 * kMiB);
  CachingDeviceAllocator a(Device{DeviceType::CUDA, 0}, simulated_api());
  a.set_limit(4 * kMiB);  // --max-memory 4MiB
  void* p = a.allocate(3 * kMiB);
  EXPECT_THROW(a.allocate(2 * kMiB), OutOfMemoryError);
  EXPECT_EQ(sim::memory_in_use(), 3 * kMiB);  // the device was never asked
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
