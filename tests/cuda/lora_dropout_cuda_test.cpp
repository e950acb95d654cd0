// CUDA LoRA dropout (src/backend/cuda/lora_dropout.cuh: xa, dA and dx with the mask regenerated,
// no dropped copy of x) on the CPU simulation against the CPU kernels (backend/cpu/linear.cpp:
// dropout_forward into scratch, then sgemm): odd T, in and r (r = 1, 16 and past one 64-rank
// chunk), p = 0.05 and 0.5, T = 0; the same bits under reverse and shuffled schedules with the
// cross-block write check on (one writer per output, every sum in an order fixed by the shape).
#include <cstring>

#include "backend/cpu/linear.h"
#include "backend/cuda/lora_dropout.cuh"
#include "sim_test_util.h"

namespace bp::sim {
namespace {

struct Case {
  int64_t T, in, r;
  float p;
};
const Case kCases[] = {{31, 33, 1, 0.05f}, {33, 97, 16, 0.5f}, {70, 45, 16, 0.05f},
                       {1, 1, 1, 0.5f},    {45, 31, 17, 0.5f}, {19, 40, 33, 0.05f},
                       {23, 35, 67, 0.5f}, {0, 31, 16, 0.05f}, {257, 300, 16, 0.05f}};
constexpr uint64_t kSeed = 0x5eedull;

// A copy of `host` in simulated device memory (the write check watches cudaMalloc'd allocations).
float* device_copy(const std::vector<float>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(host.size(), 1) * sizeof(float)), cudaSuccess);
  if (!host.empty()) cudaMemcpy(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
  return static_cast<float*>(p);
}
std::vector<float> host_copy(const float* d, size_t n) {
  std::vector<float> h(n);
  if (n) cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
  return h;
}

struct Inputs {
  std::vector<float> x, A, dxa, dA0, dx0;
};
Inputs inputs_for(const Case& c) {
  Inputs in{test::random_floats(c.T * c.in, 1 + c.in), test::random_floats(c.r * c.in, 2 + c.r),
            test::random_floats(c.T * c.r, 3 + c.T), test::random_floats(c.r * c.in, 4),
            test::random_floats(c.T * c.in, 5)};
  if (!in.x.empty()) in.x[in.x.size() / 2] = 0.0f;  // an exact zero: kept or not, it adds nothing
  return in;
}

struct Outputs {
  std::vector<float> xa, dA, dx;
};
Outputs cpu_reference(const Case& c, const Inputs& in) {
  Outputs o{std::vector<float>(c.T * c.r), in.dA0, in.dx0};
  std::vector<float> scratch(std::max<int64_t>(cpu::lora_dropout_scratch_floats(c.T, c.in, true), 1));
  cpu::lora_dropout_xa(in.x.data(), in.A.data(), c.p, kSeed, scratch.data(), o.xa.data(), c.T, c.in, c.r);
  cpu::lora_dropout_backward(in.dxa.data(), in.x.data(), in.A.data(), c.p, kSeed, scratch.data(), o.dA.data(),
                             o.dx.data(), c.T, c.in, c.r);
  return o;
}
Outputs simulated(const Case& c, const Inputs& in) {
  float *x = device_copy(in.x), *A = device_copy(in.A), *dxa = device_copy(in.dxa);
  float *xa = device_copy(std::vector<float>(c.T * c.r, NAN)), *dA = device_copy(in.dA0), *dx = device_copy(in.dx0);
  lora_dropout_xa(x, A, xa, c.T, c.in, c.r, c.p, kSeed);
  lora_dropout_dA_accumulate(dxa, x, dA, c.T, c.in, c.r, c.p, kSeed);
  lora_dropout_dx_accumulate(dxa, A, dx, c.T, c.in, c.r, c.p, kSeed);
  Outputs o{host_copy(xa, c.T * c.r), host_copy(dA, c.r * c.in), host_copy(dx, c.T * c.in)};
  for (float* p : {x, A, dxa, xa, dA, dx}) cudaFree(p);
  return o;
}

std::string name_of(const Case& c) {
  return "T=" + std::to_string(c.T) + " in=" + std::to_string(c.in) + " r=" + std::to_string(c.r) +
         " p=" + std::to_string(c.p);
}

TEST(CudaLoraDropout, MatchesCpuKernelsAtOddSizes) {
  for (const Case& c : kCases) {
    const Inputs in = inputs_for(c);
    const Outputs ref = cpu_reference(c, in), got = simulated(c, in);
    // Sums of `in` (xa) or T (dA) or r (dx) products of values up to 1/(1−p) = 2 in size.
    const test::Tolerance tol{2e-6 * static_cast<double>(std::max({c.in, c.T, c.r})), 1e-5};
    test::expect_close(got.xa, ref.xa, tol, "xa " + name_of(c));
    test::expect_close(got.dA, ref.dA, tol, "dA " + name_of(c));
    test::expect_close(got.dx, ref.dx, tol, "dx " + name_of(c));
    // A dropped element of dx gets nothing: its bits stay (the mask is the CPU's, bit for bit).
    for (int64_t i = 0; i < c.T * c.in; ++i) {
      if (cpu::dropout_keep(kSeed, static_cast<uint64_t>(i), c.p)) continue;
      ASSERT_EQ(0, std::memcmp(&got.dx[i], &in.dx0[i], sizeof(float))) << "dropped dx[" << i << "] " << name_of(c);
    }
  }
}

// The inputs' scale: kept values are x/(1−p) (a kernel without it is off by 1/(1−p)), the mask
// drops about p of them, and which ones depends on the element's index in the whole [T, in] input.
TEST(CudaLoraDropout, KeptValuesAreScaledAndTheMaskFollowsTheElementIndex) {
  const Case c{40, 50, 50, 0.5f};
  Inputs in = inputs_for(c);
  for (auto& v : in.A) v = 0.0f;
  for (int64_t j = 0; j < c.r; ++j) in.A[j * c.in + j] = 1.0f;  // A = I: xa is the dropped input itself
  const Outputs got = simulated(c, in);
  int64_t dropped = 0;
  for (int64_t i = 0; i < c.T * c.in; ++i) {
    const bool keep = cpu::dropout_keep(kSeed, static_cast<uint64_t>(i), c.p);
    dropped += !keep;
    ASSERT_EQ(got.xa[i], keep ? in.x[i] * 2.0f : 0.0f) << "xa[" << i << "]";
  }
  EXPECT_NEAR(static_cast<double>(dropped) / (c.T * c.in), 0.5, 0.05);
}

TEST(CudaLoraDropout, NoTokensLaunchNothing) {
  const uint64_t before = launch_count();
  lora_dropout_xa(nullptr, nullptr, nullptr, 0, 31, 16, 0.05f, kSeed);
  lora_dropout_dA_accumulate(nullptr, nullptr, nullptr, 0, 31, 16, 0.05f, kSeed);
  lora_dropout_dx_accumulate(nullptr, nullptr, nullptr, 0, 31, 16, 0.05f, kSeed);
  EXPECT_EQ(launch_count(), before);
}

TEST(CudaLoraDropout, SameBitsUnderEveryScheduleWithTheCrossBlockWriteCheck) {
  const ScheduleChoice saved = current_schedule();
  const bool saved_check = set_write_check(true);
  for (const Case& c : {Case{45, 71, 17, 0.5f}, Case{70, 33, 1, 0.05f}, Case{23, 35, 67, 0.05f}}) {
    const Inputs in = inputs_for(c);
    set_schedule({Schedule::Forward, 0});
    const Outputs first = simulated(c, in);
    for (ScheduleChoice other : {ScheduleChoice{Schedule::Reverse, 0}, ScheduleChoice{Schedule::Shuffle, 5}}) {
      set_schedule(other);
      const Outputs got = simulated(c, in);
      EXPECT_EQ(0, std::memcmp(got.xa.data(), first.xa.data(), got.xa.size() * sizeof(float))) << name_of(c);
      EXPECT_EQ(0, std::memcmp(got.dA.data(), first.dA.data(), got.dA.size() * sizeof(float))) << name_of(c);
      EXPECT_EQ(0, std::memcmp(got.dx.data(), first.dx.data(), got.dx.size() * sizeof(float))) << name_of(c);
    }
  }
  set_schedule(saved);
  set_write_check(saved_check);
}

}  // namespace
}  // namespace bp::sim
