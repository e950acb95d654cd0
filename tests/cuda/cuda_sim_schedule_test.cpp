// The simulation's race checks (sim_races.cpp). Schedules: kernels with a deliberate race give the
// right result under the forward schedule, so the in-order simulation alone would pass them, and a
// wrong one under reverse and/or shuffle; the same kernels with the race fixed give the right
// result under every schedule. The write check: two blocks' non-atomic += on one int, exact under
// every order (blocks never interleave here), is reported; the atomicAdd version is not. Values
// are small integers (held in floats where the kernel is float), so every sum is exact and results
// compare bit for bit. The kernel tests of tests/cuda run under reverse and shuffle with the write
// check too (ctest entries numeric_cuda_Haswell and numeric_cuda_generic, tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda/cuda_compat.cuh"

namespace bp::sim {
namespace {

// Thread 0 loads the block's scale into shared memory and every thread uses it. Without the
// barrier, threads that run before thread 0 read the previous block's scale.
__global__ void broadcast_scale_kernel(const float* scales, float* out, bool barrier) {
  __shared__ float scale;
  if (threadIdx.x == 0) scale = scales[blockIdx.x];
  if (barrier) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = scale * static_cast<float>(threadIdx.x + 1);
}

// Each value divided by its block's total (a tree reduction with the barrier at the top of each
// level). Without the final barrier, threads that run before thread 0's last addition read a
// partial total.
__global__ void normalize_by_block_total_kernel(const float* x, float* y, bool final_barrier) {
  __shared__ float s[128];
  const int t = static_cast<int>(threadIdx.x);
  const float v = x[blockIdx.x * blockDim.x + t];
  s[t] = v;
  for (int stride = static_cast<int>(blockDim.x) / 2; stride > 0; stride /= 2) {
    __syncthreads();
    if (t < stride) s[t] += s[t + stride];
  }
  if (final_barrier) __syncthreads();
  y[blockIdx.x * blockDim.x + t] = v / s[0];
}

// Lane i takes lane i-1's value through shared memory: without __syncwarp a lane that runs before
// its lower neighbour reads what the previous launch left there.
__global__ void shift_up_kernel(const int* x, int* y, bool syncwarp) {
  __shared__ int s[32];
  const int lane = static_cast<int>(threadIdx.x);
  s[lane] = x[lane];
  if (syncwarp) __syncwarp();
  y[lane] = lane > 0 ? s[lane - 1] : 0;
}

// The max and then the sum of each block's values through one 32-float scratch, as block_max and
// block_sum (cuda_compat.cuh) do. Without the barrier before the second use, a warp that runs far
// enough ahead writes its sum into a slot another warp has not read its max from yet: only a
// schedule with that much skew between warps (shuffle's warp-serial blocks) shows it.
__global__ void max_then_sum_kernel(const float* x, float* out, bool leading_barrier) {
  __shared__ float scratch[32];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int n_warps = static_cast<int>(blockDim.x / 32);
  const float v = x[blockIdx.x * blockDim.x + threadIdx.x];
  float m = warp_max(v);
  if (lane == 0) scratch[warp] = m;
  __syncthreads();
  m = warp_max(lane < n_warps ? scratch[lane] : -INFINITY);
  float s = warp_sum(v);
  if (leading_barrier) __syncthreads();
  if (lane == 0) scratch[warp] = s;
  __syncthreads();
  s = warp_sum(lane < n_warps ? scratch[lane] : 0.0f);
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = m;
    out[2 * blockIdx.x + 1] = s;
  }
}

// Every block writes its partial sum; then one block adds all partials. Racy: the block with the
// last index assumes it runs after every other one. Correct: the last block to finish (an atomic
// counter after a fence, the CUDA samples' threadFenceReduction pattern) adds them.
__global__ void sum_of_partials_kernel(const int* x, int* partial, unsigned* finished, int* total, bool counter) {
  if (threadIdx.x != 0) return;
  int s = 0;
  for (unsigned i = 0; i < 8; ++i) s += x[blockIdx.x * 8 + i];
  partial[blockIdx.x] = s;
  bool last = blockIdx.x == gridDim.x - 1;
  if (counter) {
    __threadfence();
    last = atomicAdd(finished, 1u) == gridDim.x - 1;
  }
  if (last) {
    int t = 0;
    for (unsigned b = 0; b < gridDim.x; ++b) t += partial[b];
    *total = t;
  }
}

// Each block adds its slice's sum into one total: with `+=` two blocks' read-modify-writes can
// interleave on a GPU and lose an update; with atomicAdd they cannot.
__global__ void add_block_sums_kernel(const int* x, int* total, bool atomic) {
  if (threadIdx.x != 0) return;
  int s = 0;
  for (unsigned i = 0; i < 8; ++i) s += x[blockIdx.x * 8 + i];
  if (atomic)
    atomicAdd(total, s);
  else
    *total += s;
}

// Restores the schedule a test found (tests may run under BP_SIM_SCHEDULE already).
class CudaSimSchedule : public ::testing::Test {
 protected:
  void TearDown() override {
    set_schedule(saved_);
    set_write_check(saved_check_);
  }
  ScheduleChoice saved_ = current_schedule();
  bool saved_check_ = write_check_enabled();
};

// A copy of `host` in simulated device memory (the write check watches cudaMalloc'd allocations).
template <class T>
T* device_copy(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
  cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(p);
}

std::string name_of(ScheduleChoice c) {
  const char* names[] = {"forward", "reverse", "shuffle"};
  return std::string(names[static_cast<int>(c.order)]) +
         (c.order == Schedule::Shuffle ? ":" + std::to_string(c.seed) : "");
}

const std::vector<ScheduleChoice> kShuffles = {{Schedule::Shuffle, 1}, {Schedule::Shuffle, 2}, {Schedule::Shuffle, 3}};
const std::vector<ScheduleChoice> kOtherOrders = {
    {Schedule::Reverse, 0}, {Schedule::Shuffle, 1}, {Schedule::Shuffle, 2}, {Schedule::Shuffle, 3}};

// Runs `run(racy)` under forward and every other order; `expected` is the correct result. The
// fixed kernel is right under every order; the racy one under forward (the in-order simulation
// alone would pass it) and wrong under each of `exposing`.
template <class Result, class Run>
void expect_race_shown_by(const std::vector<ScheduleChoice>& exposing, const Result& expected, Run run) {
  set_schedule({Schedule::Forward, 0});
  EXPECT_EQ(run(false), expected) << "the fixed kernel, forward";
  EXPECT_EQ(run(true), expected) << "the racy kernel passes the in-order schedule: the race is hidden there";
  for (ScheduleChoice c : kOtherOrders) {
    set_schedule(c);
    EXPECT_EQ(run(false), expected) << "the fixed kernel, " << name_of(c);
  }
  for (ScheduleChoice c : exposing) {
    set_schedule(c);
    EXPECT_NE(run(true), expected) << "the racy kernel, " << name_of(c);
  }
}

TEST_F(CudaSimSchedule, BroadcastThroughSharedMemoryWithoutABarrier) {
  const int blocks = 5, threads = 96;
  std::vector<float> scales = {2, 3, 5, 7, 11}, expected(blocks * threads);
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < threads; ++t) expected[b * threads + t] = scales[b] * (t + 1);
  expect_race_shown_by(kOtherOrders, expected, [&](bool racy) {
    std::vector<float> out(blocks * threads, -1.0f);
    BP_LAUNCH(blocks, threads, 0, nullptr, broadcast_scale_kernel)(scales.data(), out.data(), !racy);
    return out;
  });
}

TEST_F(CudaSimSchedule, BlockReductionMissingItsLastBarrier) {
  const int blocks = 3, threads = 128;
  std::vector<float> x(blocks * threads), expected(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7 + 1);
  for (int b = 0; b < blocks; ++b) {
    const float total = std::accumulate(x.begin() + b * threads, x.begin() + (b + 1) * threads, 0.0f);
    for (int t = 0; t < threads; ++t) expected[b * threads + t] = x[b * threads + t] / total;
  }
  expect_race_shown_by(kOtherOrders, expected, [&](bool racy) {
    std::vector<float> y(x.size(), -1.0f);
    BP_LAUNCH(blocks, threads, 0, nullptr, normalize_by_block_total_kernel)(x.data(), y.data(), !racy);
    return y;
  });
}

TEST_F(CudaSimSchedule, WarpExchangeThroughSharedMemoryWithoutSyncwarp) {
  int salt = 0;  // each launch its own values, so a stale value from the last launch is wrong
  std::vector<int> x(32);
  expect_race_shown_by(kOtherOrders, true, [&](bool racy) {
    salt += 100;
    for (int i = 0; i < 32; ++i) x[i] = salt + i;
    std::vector<int> y(32, -1);
    BP_LAUNCH(1, 32, 0, nullptr, shift_up_kernel)(x.data(), y.data(), !racy);
    bool right = y[0] == 0;
    for (int i = 1; i < 32; ++i) right &= y[i] == x[i - 1];
    return right;
  });
}

TEST_F(CudaSimSchedule, LastBlockByIndexAssumedToRunLast) {
  const int blocks = 64;  // a shuffle leaves block 63 last, and so hides the race, 1 time in 64
  std::vector<int> x(blocks * 8);
  std::iota(x.begin(), x.end(), 1);
  const int expected = std::accumulate(x.begin(), x.end(), 0);
  expect_race_shown_by(kOtherOrders, expected, [&](bool racy) {
    std::vector<int> partial(blocks, -1000);
    unsigned finished = 0;
    int total = 0;
    BP_LAUNCH(blocks, 32, 0, nullptr, sum_of_partials_kernel)(x.data(), partial.data(), &finished, &total, !racy);
    return total;
  });
}

TEST_F(CudaSimSchedule, ScratchReusedWithoutALeadingBarrier) {
  const int blocks = 16, threads = 128;
  std::vector<float> x(blocks * threads), expected(2 * blocks);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 101 + 1);
  for (int b = 0; b < blocks; ++b) {
    expected[2 * b] = *std::max_element(x.begin() + b * threads, x.begin() + (b + 1) * threads);
    expected[2 * b + 1] = std::accumulate(x.begin() + b * threads, x.begin() + (b + 1) * threads, 0.0f);
  }
  auto run = [&](bool racy) {
    std::vector<float> out(2 * blocks, -1.0f);
    BP_LAUNCH(blocks, threads, 0, nullptr, max_then_sum_kernel)(x.data(), out.data(), !racy);
    return out;
  };
  expect_race_shown_by(kShuffles, expected, run);
  set_schedule({Schedule::Reverse, 0});
  EXPECT_EQ(run(true), expected) << "lockstep rounds hide it, in either direction";
}

TEST_F(CudaSimSchedule, NonAtomicAddOfTwoBlocksIsReportedByTheWriteCheck) {
  const int blocks = 5;
  std::vector<int> x(blocks * 8);
  std::iota(x.begin(), x.end(), 1);
  const int expected = std::accumulate(x.begin(), x.end(), 0);
  int* dx = device_copy(x);
  int* total = device_copy(std::vector<int>{0});
  auto run = [&](bool atomic) {
    cudaMemset(total, 0, sizeof(int));
    BP_LAUNCH(blocks, 32, 0, nullptr, add_block_sums_kernel)(dx, total, atomic);
    return *total;
  };
  // Blocks run one at a time, so the lost update never happens: every schedule alone passes it.
  set_write_check(false);
  for (ScheduleChoice c : {ScheduleChoice{Schedule::Forward, 0}, ScheduleChoice{Schedule::Reverse, 0},
                           ScheduleChoice{Schedule::Shuffle, 1}}) {
    set_schedule(c);
    EXPECT_EQ(run(false), expected) << name_of(c);
  }
  set_schedule({Schedule::Forward, 0});
  set_write_check(true);
  try {
    run(false);
    ADD_FAILURE() << "two blocks' += on one int was not reported";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("blocks (0,0,0) and (1,0,0) of one launch both changed byte 0 of a 4-byte"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(run(true), expected) << "atomicAdd: the same bytes, no race";
  // One writer per element (the partials), atomics for the counter: nothing to report.
  int* partial = device_copy(std::vector<int>(blocks, -1));
  unsigned* finished = device_copy(std::vector<unsigned>{0});
  int* sum = device_copy(std::vector<int>{0});
  BP_LAUNCH(blocks, 32, 0, nullptr, sum_of_partials_kernel)(dx, partial, finished, sum, true);
  EXPECT_EQ(*sum, expected);
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(total), static_cast<void*>(partial),
                  static_cast<void*>(finished), static_cast<void*>(sum)})
    cudaFree(p);
}

TEST_F(CudaSimSchedule, BlocksRunInTheScheduledOrder) {
  // Records the order blocks start in: forward is grid order, reverse its mirror, shuffle a
  // permutation that depends on the seed alone (the same after set_schedule again).
  auto starts = [](ScheduleChoice c) {
    set_schedule(c);
    std::vector<int> order;
    int clock = 0;
    auto kernel = [&] {
      if (threadIdx.x == 0) order.push_back(static_cast<int>(blockIdx.x + 2 * (blockIdx.y + 3 * blockIdx.z)));
      ++clock;
    };
    launch_grid(dim3(2, 3, 4), dim3(32), 0, kernel);
    EXPECT_EQ(clock, 24 * 32);
    return order;
  };
  std::vector<int> forward(24);
  std::iota(forward.begin(), forward.end(), 0);
  EXPECT_EQ(starts({Schedule::Forward, 0}), forward);
  EXPECT_EQ(starts({Schedule::Reverse, 0}), std::vector<int>(forward.rbegin(), forward.rend()));
  const auto s7 = starts({Schedule::Shuffle, 7});
  EXPECT_TRUE(std::is_permutation(s7.begin(), s7.end(), forward.begin()));
  EXPECT_NE(s7, forward);
  EXPECT_EQ(starts({Schedule::Shuffle, 7}), s7);
  EXPECT_NE(starts({Schedule::Shuffle, 8}), s7);
}

TEST_F(CudaSimSchedule, ShuffleHoldsWarpsBackSoOneRunsAheadOfAnother) {
  // Two warps each pass 20 warp meetings; the lead (meetings passed by one warp minus the other's,
  // at the moment a lane arrives) stays 0 in lockstep rounds and grows under shuffle.
  int passed[2] = {0, 0}, max_lead = 0;
  auto kernel = [&] {
    const int w = static_cast<int>(threadIdx.x / 32);
    for (int i = 0; i < 20; ++i) {
      __syncwarp();
      if (threadIdx.x % 32 == 0) {
        ++passed[w];
        max_lead = std::max(max_lead, std::abs(passed[0] - passed[1]));
      }
    }
  };
  set_schedule({Schedule::Forward, 0});
  launch_grid(dim3(1), dim3(64), 0, kernel);
  EXPECT_LE(max_lead, 1);
  passed[0] = passed[1] = max_lead = 0;
  set_schedule({Schedule::Shuffle, 5});
  launch_grid(dim3(1), dim3(64), 0, kernel);
  EXPECT_EQ(passed[0], 20);
  EXPECT_EQ(passed[1], 20);
  EXPECT_GE(max_lead, 3);
}

TEST_F(CudaSimSchedule, ParsesTheEnvironmentsSpelling) {
  EXPECT_EQ(parse_schedule(nullptr).order, Schedule::Forward);
  EXPECT_EQ(parse_schedule("forward").order, Schedule::Forward);
  EXPECT_EQ(parse_schedule("reverse").order, Schedule::Reverse);
  EXPECT_EQ(parse_schedule("shuffle").order, Schedule::Shuffle);
  const ScheduleChoice s = parse_schedule("shuffle:42");
  EXPECT_EQ(s.order, Schedule::Shuffle);
  EXPECT_EQ(s.seed, 42u);
  for (const char* bad : {"Reverse", "shuffle:", "shuffle:x1", "random"})
    EXPECT_THROW(parse_schedule(bad), std::invalid_argument) << bad;
}

}  // namespace
}  // namespace bp::sim
