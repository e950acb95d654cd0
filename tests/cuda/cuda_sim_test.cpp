// The CUDA simulation itself (src/backend/cuda/sim/): barriers, shared memory, warp shuffles and
// votes, atomics, launch configuration errors and the memory budget. The kernels below are plain
// CUDA; each test is built so that it fails if the modelled feature were missing (a __syncthreads
// that did not wait, a shuffle that returned the caller's own value, ...).
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_compat.cuh"

namespace bp::sim {
namespace {

// Tree reduction in shared memory: each level reads values other threads wrote before the barrier.
__global__ void block_reduce_kernel(const float* x, float* out, int n) {
  __shared__ float s[256];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  s[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

// Reads the neighbour's value written before the barrier: thread 0 runs first in the simulation,
// so without a real barrier it would read what the previous block left there.
__global__ void neighbour_kernel(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = static_cast<int>(blockIdx.x * 1000 + threadIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

// Fills n floats of dynamic shared memory and sums them (thread 0).
__global__ void dynamic_shared_sum_kernel(float* out, int n) {
  BP_DYNAMIC_SHARED(float, buf);
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) buf[i] = 1.0f;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += buf[i];
    out[0] = sum;
  }
}

// Warp shuffle reduction (shfl_down) and broadcast (shfl), then one atomicAdd per warp.
__global__ void shuffle_sum_kernel(const float* x, float* total, float* warp_firsts, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? x[i] : 0.0f;
  float first = __shfl_sync(0xffffffffu, v, 0);
  for (unsigned offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) {
    atomicAdd(total, v);
    warp_firsts[i / 32] = first;
  }
}

// Inclusive block-wide scan (Hillis-Steele with a double-buffered read/write barrier pair).
__global__ void block_scan_kernel(const int* x, int* y, int n) {
  BP_DYNAMIC_SHARED(int, s);
  const int t = threadIdx.x;
  s[t] = t < n ? x[t] : 0;
  __syncthreads();
  for (int offset = 1; offset < static_cast<int>(blockDim.x); offset *= 2) {
    int add = t >= offset ? s[t - offset] : 0;
    __syncthreads();
    s[t] += add;
    __syncthreads();
  }
  if (t < n) y[t] = s[t];
}

__global__ void vote_kernel(const int* flags, unsigned* ballots, int* all_any) {
  const int p = flags[threadIdx.x];
  unsigned b = __ballot_sync(0xffffffffu, p);
  int all = __all_sync(0xffffffffu, p), any = __any_sync(0xffffffffu, p);
  if (threadIdx.x % 32 == 0) {
    ballots[threadIdx.x / 32] = b;
    all_any[2 * (threadIdx.x / 32)] = all;
    all_any[2 * (threadIdx.x / 32) + 1] = any;
  }
}

__global__ void xor_sum_kernel(float* x) {
  x[threadIdx.x] = warp_sum(x[threadIdx.x]);
}

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 16) __syncthreads();  // a bug: half the block never arrives
  out[threadIdx.x] = 1;
}

__global__ void early_exit_shuffle_kernel(float* out) {
  if (threadIdx.x == 3) return;  // a bug: lane 3 leaves before the full-mask shuffle
  out[threadIdx.x] = warp_sum(1.0f);
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& e : v) e = d(rng);
  return v;
}

TEST(CudaSim, SharedMemoryTreeReductionWaitsAtEveryBarrier) {
  const int n = 1000, threads = 256, blocks = (n + threads - 1) / threads;
  auto x = random_floats(n, 1);
  std::vector<float> partial(blocks, -7.0f);
  BP_LAUNCH(blocks, threads, 0, nullptr, block_reduce_kernel)(x.data(), partial.data(), n);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (int b = 0; b < blocks; ++b) {
    double ref = 0;
    for (int i = b * threads; i < std::min(n, (b + 1) * threads); ++i) ref += x[i];
    EXPECT_NEAR(partial[b], ref, 1e-4) << "block " << b;
  }
}

TEST(CudaSim, BarrierMakesOtherThreadsWritesVisible) {
  const int blocks = 3, threads = 64;
  std::vector<int> out(blocks * threads, -1);
  BP_LAUNCH(blocks, threads, 0, nullptr, neighbour_kernel)(out.data());
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < threads; ++t) EXPECT_EQ(out[b * threads + t], b * 1000 + (t + 1) % threads);
}

TEST(CudaSim, WarpShuffleReductionAndBroadcast) {
  const int n = 200, threads = 96, blocks = 3;  // 9 warps; elements past n are zero
  auto x = random_floats(n, 2);
  float total = 0.0f;
  std::vector<float> firsts(blocks * threads / 32, 99.0f);
  BP_LAUNCH(blocks, threads, 0, nullptr, shuffle_sum_kernel)(x.data(), &total, firsts.data(), n);
  EXPECT_NEAR(total, std::accumulate(x.begin(), x.end(), 0.0), 1e-4);
  for (size_t w = 0; w < firsts.size(); ++w) EXPECT_EQ(firsts[w], w * 32 < size_t(n) ? x[w * 32] : 0.0f);
}

TEST(CudaSim, XorButterflyGivesEveryLaneTheSum) {
  std::vector<float> x(64);
  std::iota(x.begin(), x.end(), 0.0f);
  BP_LAUNCH(1, 64, 0, nullptr, xor_sum_kernel)(x.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(x[i], 496.0f);    // 0 + ... + 31
  for (int i = 32; i < 64; ++i) EXPECT_EQ(x[i], 1520.0f);  // 32 + ... + 63
}

TEST(CudaSim, BlockScanWithDynamicSharedMemory) {
  for (int n : {1, 31, 33, 257}) {
    int threads = 1;
    while (threads < n) threads *= 2;
    std::vector<int> x(n), y(n, 0);
    std::mt19937 rng(n);
    for (auto& e : x) e = static_cast<int>(rng() % 100) - 50;
    BP_LAUNCH(1, threads, threads * sizeof(int), nullptr, block_scan_kernel)(x.data(), y.data(), n);
    std::vector<int> ref(n);
    std::partial_sum(x.begin(), x.end(), ref.begin());
    EXPECT_EQ(y, ref) << "n=" << n;
  }
}

TEST(CudaSim, BallotAllAnyAcrossAWarp) {
  std::vector<int> flags(64, 1);
  flags[5] = 0;
  flags[40] = 0;
  for (int i = 32; i < 64; ++i) flags[i] = i == 33;  // second warp: only lane 1 set
  std::vector<unsigned> ballots(2, 0);
  std::vector<int> all_any(4, -1);
  BP_LAUNCH(1, 64, 0, nullptr, vote_kernel)(flags.data(), ballots.data(), all_any.data());
  EXPECT_EQ(ballots[0], 0xffffffffu & ~(1u << 5));
  EXPECT_EQ(ballots[1], 1u << 1);
  EXPECT_EQ(all_any, (std::vector<int>{0, 1, 0, 1}));
}

TEST(CudaSim, DivergentBarrierAndExitedLanesAreReportedAsDeadlocks) {
  std::vector<int> out(64, 0);
  EXPECT_THROW(BP_LAUNCH(1, 64, 0, nullptr, divergent_barrier_kernel)(out.data()), std::runtime_error);
  std::vector<float> f(32, 0.0f);
  EXPECT_THROW(BP_LAUNCH(1, 32, 0, nullptr, early_exit_shuffle_kernel)(f.data()), std::runtime_error);
}

TEST(CudaSim, RefusedLaunchConfigurationSetsTheLastError) {
  std::vector<int> out(2048, 0);
  const uint64_t before = launch_count();
  BP_LAUNCH(1, 2048, 0, nullptr, neighbour_kernel)(out.data());
  EXPECT_EQ(launch_count(), before + 1);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read and cleared
  EXPECT_EQ(out[0], 0);                        // nothing ran
}

// CUDA's limits: 48 KiB of dynamic shared memory unless the kernel opted in (cudaFuncSetAttribute),
// at most 99 KiB even then on sm_86/sm_89; block x, y <= 1024, z <= 64, 1024 threads; grid y, z <= 65535.
TEST(CudaSim, DynamicSharedMemoryPast48KiBNeedsTheKernelsOptIn) {
  const int n = 16 * 1024;  // 64 KiB
  const size_t bytes = n * sizeof(float);
  float out = 0.0f;
  BP_LAUNCH(1, 128, bytes, nullptr, dynamic_shared_sum_kernel)(&out, n);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(out, 0.0f) << "nothing ran";
  BP_LAUNCH(1, 128, size_t{48} * 1024, nullptr, dynamic_shared_sum_kernel)(&out, 12 * 1024);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(out, 12.0f * 1024);
  EXPECT_EQ(cudaFuncSetAttribute(dynamic_shared_sum_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(size_t{100} * 1024)),
            cudaErrorInvalidValue)
      << "past the 99 KiB of sm_86/sm_89";
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(dynamic_shared_sum_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(bytes)),
            cudaSuccess);
  BP_LAUNCH(1, 128, bytes, nullptr, dynamic_shared_sum_kernel)(&out, n);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(out, static_cast<float>(n));
  BP_LAUNCH(1, 128, bytes + 4, nullptr, dynamic_shared_sum_kernel)(&out, n);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "past the kernel's own opt-in";
  std::vector<int> other(64, 0);
  BP_LAUNCH(1, 64, bytes, nullptr, neighbour_kernel)(other.data());
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "the opt-in is per kernel";
}

TEST(CudaSim, BlockAndGridDimensionLimits) {
  std::vector<int> out(1024 * 2, 0);
  auto refused = [&](dim3 grid, dim3 block) {
    BP_LAUNCH(grid, block, 0, nullptr, neighbour_kernel)(out.data());
    return cudaGetLastError() == cudaErrorInvalidConfiguration;
  };
  EXPECT_TRUE(refused(dim3(1), dim3(1, 1, 65))) << "z <= 64";
  EXPECT_FALSE(refused(dim3(1), dim3(1, 1, 64)));
  EXPECT_TRUE(refused(dim3(1), dim3(1025, 1, 1)));
  EXPECT_TRUE(refused(dim3(1), dim3(1, 1025, 1)));
  EXPECT_TRUE(refused(dim3(1), dim3(64, 32, 1))) << "2048 threads";
  EXPECT_FALSE(refused(dim3(1), dim3(1, 1024, 1)));
  EXPECT_TRUE(refused(dim3(1, 65536, 1), dim3(1)));
  EXPECT_TRUE(refused(dim3(1, 1, 65536), dim3(1)));
  EXPECT_TRUE(refused(dim3(0), dim3(32)));
}

TEST(CudaSim, MemoryBudgetMakesCudaMallocFail) {
  set_memory_budget(1 << 20);
  size_t free_b = 0, total_b = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_b, &total_b), cudaSuccess);
  EXPECT_EQ(total_b, size_t{1} << 20);
  EXPECT_EQ(free_b, total_b - memory_in_use());
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 700 * 1024), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&b, 400 * 1024), cudaErrorMemoryAllocation);
  EXPECT_EQ(b, nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  ASSERT_EQ(cudaFree(a), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&b, 400 * 1024), cudaSuccess);
  EXPECT_EQ(cudaMemset(b, 0x3f, 400 * 1024), cudaSuccess);
  EXPECT_EQ(static_cast<unsigned char*>(b)[1000], 0x3f);
  EXPECT_EQ(cudaFree(b), cudaSuccess);
  set_memory_budget(size_t{16} << 30);
}

TEST(CudaSim, Bf16ConversionRoundsToNearestEven) {
  EXPECT_EQ(__float2bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(__bfloat162float(__float2bfloat16(1.00390625f)), 1.0f);       // halfway: ties to even
  EXPECT_EQ(__bfloat162float(__float2bfloat16(1.01171875f)), 1.015625f);  // halfway: ties to even (up)
  EXPECT_TRUE(std::isnan(__bfloat162float(__float2bfloat16(NAN))));
}

}  // namespace
}  // namespace bp::sim
