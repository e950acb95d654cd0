// CUDA LoRA dropout (src/backend/cuda/lora_dropout.cuh: xa, dA and dx with the mask regenerated,
// no dropped copy of x) on the CPU simulation against the CPU kernels (backend/cpu/linear.cpp:
// dropout_forward into scratch, then sgemm): odd T, in and r (r = 1, 16 and past one 64-rank
// chunk), p = 0.05 and 0.5, T = 0; the same bits under reverse and shuffled schedules with the
// cross-block write check on (one writer per output, every sum in an order fixed by the shape).
// dA's split of the tokens (lora_dropout_split.h): the choice of S at the Qwen shapes and its
// bounds, single-pass and split cases (S at its edges, a last slice shorter than the others, r = 1
// and 67) checked for the path they took, and its workspace counted through the op on the card.
#include <algorithm>
#include <cstring>

#include "backend/cpu/linear.h"
#include "backend/cuda/lora_dropout.cuh"
#include "backend/cuda/lora_dropout_split.h"
#include "op_parity.h"
#include "ops/linear.h"
#include "sim_device.h"
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
// dA's token split: in = 40 and small r make a base grid of 2 × ceil(r / 8) blocks, so S is set by
// the tokens (T / 128) up to the target (512 blocks) or the cap (64 slices). `slices`: the S
// lora_dA_split must choose (the test fails if it changes: a regression to S = 1 everywhere too).
struct SplitCase {
  Case c;
  int64_t slices;
};
const SplitCase kSplitCases[] = {
    {{255, 40, 5, 0.05f}, 1},     // one token short of two slices: the single pass
    {{256, 40, 5, 0.5f}, 2},      // two slices of exactly 128 tokens
    {{257, 40, 5, 0.05f}, 2},     // slices of 129 and 128 tokens
    {{2000, 40, 5, 0.05f}, 15},   // 14 slices of 134 tokens and one of 124
    {{1500, 40, 1, 0.5f}, 11},    // r = 1: 10 slices of 137 and one of 130
    {{3001, 40, 67, 0.05f}, 23},  // r = 67 (9 rank blocks, the last with 3 ranks): 18 base blocks, T / 128 = 23
    {{4000, 40, 67, 0.05f}, 28},  // the target: 28 × 18 = 504 blocks <= 512 (T / 128 = 31)
    {{9001, 3, 2, 0.05f}, 64},    // the cap: one base block, T / 128 = 70
};
constexpr uint64_t kSeed = 0x5eedull;
// A projection alone: a member list of one.
cpu::LoraDropoutMember one_member(const Case& c) {
  return {c.r, kSeed};
}

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
  const cpu::LoraDropoutMember one = one_member(c);
  cpu::lora_dropout_xa(in.x.data(), in.A.data(), c.p, &one, 1, scratch.data(), o.xa.data(), c.T, c.in);
  cpu::lora_dropout_backward(in.dxa.data(), in.x.data(), in.A.data(), c.p, &one, 1, scratch.data(), o.dA.data(),
                             o.dx.data(), c.T, c.in);
  return o;
}
// The dA kernel's workspace, NaN-filled so a partial left unwritten would show in dA. `launches`:
// how many kernels dA took (2 with the split: the per-slice pass and the sum of the partials).
float* dA_workspace(const Case& c) {
  const size_t n = cuda_workspace::lora_dropout_dA_bytes(c.T, c.in, c.r) / sizeof(float);
  return n ? device_copy(std::vector<float>(n, NAN)) : nullptr;
}
Outputs simulated(const Case& c, const Inputs& in, uint64_t* dA_launches = nullptr) {
  float *x = device_copy(in.x), *A = device_copy(in.A), *dxa = device_copy(in.dxa);
  float *xa = device_copy(std::vector<float>(c.T * c.r, NAN)), *dA = device_copy(in.dA0), *dx = device_copy(in.dx0);
  float* workspace = dA_workspace(c);
  const cpu::LoraDropoutMember one = one_member(c);
  lora_dropout_xa(x, A, xa, c.T, c.in, &one, 1, c.p);
  const uint64_t before = launch_count();
  lora_dropout_dA_accumulate(dxa, x, dA, c.T, c.in, &one, 1, c.p, workspace);
  if (dA_launches) *dA_launches = launch_count() - before;
  lora_dropout_dx_accumulate(dxa, A, dx, c.T, c.in, &one, 1, c.p);
  Outputs o{host_copy(xa, c.T * c.r), host_copy(dA, c.r * c.in), host_copy(dx, c.T * c.in)};
  for (float* p : {x, A, dxa, xa, dA, dx}) cudaFree(p);
  if (workspace) cudaFree(workspace);
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

// dA alone (xa and dx have their own cases above) where the tokens are split into slices, at the
// edges of the choice, against the CPU's sgemm over the materialized xd; the path taken is checked:
// S = lora_dA_split's, two launches with the split and one without.
TEST(CudaLoraDropout, SplitTokensMatchCpuAndTakeTheChosenPath) {
  for (const SplitCase& sc : kSplitCases) {
    const Case& c = sc.c;
    const cuda_workspace::LoraDaSplit split = cuda_workspace::lora_dA_split(c.T, c.in, c.r);
    ASSERT_EQ(split.slices, sc.slices) << name_of(c);
    EXPECT_EQ(cuda_workspace::lora_dropout_dA_bytes(c.T, c.in, c.r),
              sc.slices > 1 ? static_cast<size_t>(sc.slices * c.r * c.in) * sizeof(float) : 0u)
        << name_of(c);
    const Inputs in = inputs_for(c);
    Outputs ref{{}, in.dA0, {}};
    std::vector<float> scratch(std::max<int64_t>(cpu::lora_dropout_scratch_floats(c.T, c.in, true), 1));
    const cpu::LoraDropoutMember one = one_member(c);
    cpu::lora_dropout_backward(in.dxa.data(), in.x.data(), in.A.data(), c.p, &one, 1, scratch.data(), ref.dA.data(),
                               nullptr, c.T, c.in);
    float *x = device_copy(in.x), *dxa = device_copy(in.dxa), *dA = device_copy(in.dA0);
    float* workspace = dA_workspace(c);
    const uint64_t before = launch_count();
    lora_dropout_dA_accumulate(dxa, x, dA, c.T, c.in, &one, 1, c.p, workspace);
    EXPECT_EQ(launch_count() - before, sc.slices > 1 ? 2u : 1u) << name_of(c);
    const std::vector<float> got = host_copy(dA, c.r * c.in);
    for (float* p : {x, dxa, dA}) cudaFree(p);
    if (workspace) cudaFree(workspace);
    // Sums of T products of values up to 1/(1−p) = 2 in size.
    test::expect_close(got, ref.dA, test::Tolerance{2e-6 * static_cast<double>(c.T), 1e-5}, "dA " + name_of(c));
  }
}

// dA as the kernels sum it, on the host with the same roundings: in slice z (tokens
// [z·L, min((z + 1)·L, T))) thread row g sums tokens t0 + g, t0 + g + 16, ... in order, the 16 rows'
// sums are added in order, the slices' sums in order 0..S−1, and that total is added to dA's value.
// With S = 1 this is the single pass's order.
std::vector<float> dA_in_kernel_order(const Case& c, const Inputs& in) {
  const cuda_workspace::LoraDaSplit split = cuda_workspace::lora_dA_split(c.T, c.in, c.r);
  const DropoutMask m = dropout_mask(c.p, kSeed);
  std::vector<float> dA = in.dA0;
  for (int64_t j = 0; j < c.r; ++j)
    for (int64_t col = 0; col < c.in; ++col) {
      float total = 0.0f;
      for (int64_t z = 0; z < split.slices; ++z) {
        const int64_t t0 = z * split.slice_tokens, t1 = std::min(c.T, t0 + split.slice_tokens);
        float rows[kDaRowGroups];
        for (int g = 0; g < kDaRowGroups; ++g) {
          float acc = 0.0f;
          for (int64_t t = t0 + g; t < t1; t += kDaRowGroups) {
            const float v =
                m.keep(static_cast<uint64_t>(t * c.in + col)) ? __fmul_rn(in.x[t * c.in + col], m.inv_keep) : 0.0f;
            acc = __fadd_rn(acc, __fmul_rn(in.dxa[t * c.r + j], v));
          }
          rows[g] = acc;
        }
        float slice_sum = rows[0];
        for (int g = 1; g < kDaRowGroups; ++g) slice_sum = __fadd_rn(slice_sum, rows[g]);
        total = z == 0 ? slice_sum : __fadd_rn(total, slice_sum);
      }
      dA[j * c.in + col] = __fadd_rn(dA[j * c.in + col], total);
    }
  return dA;
}

// The order of dA's sums is the documented one, bit for bit (a tolerance would not see the slices'
// partials added in another order, or a slice bound moved): split cases and single-pass ones.
TEST(CudaLoraDropout, DaSumsInTheDocumentedOrderBitForBit) {
  std::vector<Case> cases;
  for (const SplitCase& sc : kSplitCases) cases.push_back(sc.c);
  cases.insert(cases.end(), {Case{70, 45, 16, 0.05f}, Case{23, 35, 67, 0.5f}, Case{257, 300, 16, 0.05f}});
  for (const Case& c : cases) {
    const Inputs in = inputs_for(c);
    const std::vector<float> want = dA_in_kernel_order(c, in);
    float *x = device_copy(in.x), *dxa = device_copy(in.dxa), *dA = device_copy(in.dA0);
    float* workspace = dA_workspace(c);
    const cpu::LoraDropoutMember one = one_member(c);
    lora_dropout_dA_accumulate(dxa, x, dA, c.T, c.in, &one, 1, c.p, workspace);
    const std::vector<float> got = host_copy(dA, c.r * c.in);
    for (float* p : {x, dxa, dA}) cudaFree(p);
    if (workspace) cudaFree(workspace);
    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << name_of(c);
  }
}

// The split's choice at the shapes it was made for (Qwen2.5-0.5B: in = 896 and, down_proj, 4864;
// Qwen2.5-1.5B: 1536 and 8960; r = 16, 2048 tokens) and its invariants over many shapes: S >= 1,
// at most the cap and T / 128, a split grid within the target, every slice holding tokens, S never
// falling as T grows (the memory plan sizes for the longest micro-batch), and the workspace S·r·in
// floats only when S > 1.
TEST(CudaLoraDropout, TokenSplitIsChosenFromTheShape) {
  using cuda_workspace::lora_dA_split;
  EXPECT_EQ(lora_dA_split(2048, 896, 16).slices, 9);  // 56 base blocks -> 504
  EXPECT_EQ(lora_dA_split(2048, 896, 16).slice_tokens, 228);
  EXPECT_EQ(lora_dA_split(2048, 1536, 16).slices, 5);  // 96 -> 480
  EXPECT_EQ(lora_dA_split(2048, 1536, 16).slice_tokens, 410);
  EXPECT_EQ(lora_dA_split(2048, 4864, 16).slices, 1);  // 304 base blocks: no split
  EXPECT_EQ(lora_dA_split(2048, 8960, 16).slices, 1);  // 560
  EXPECT_EQ(lora_dA_split(2048, 8960, 16).slice_tokens, 2048);
  EXPECT_EQ(lora_dA_split(255, 896, 16).slices, 1);  // too few tokens for two slices
  EXPECT_EQ(lora_dA_split(256, 896, 16).slices, 2);
  EXPECT_EQ(lora_dA_split(1 << 20, 1, 1).slices, cuda_workspace::kLoraDaMaxSlices);
  EXPECT_EQ(lora_dA_split(0, 896, 16).slices, 1);
  EXPECT_EQ(cuda_workspace::lora_dropout_dA_bytes(2048, 896, 16), size_t{9} * 16 * 896 * 4);
  EXPECT_EQ(cuda_workspace::lora_dropout_dA_bytes(2048, 4864, 16), 0u);
  for (int64_t in : {1, 33, 40, 300, 896, 1536, 4864}) {
    for (int64_t r : {1, 8, 16, 67}) {
      const int64_t base = (in + 31) / 32 * ((r + 7) / 8);
      int64_t last = 1;
      for (int64_t T = 1; T <= 20000; T += T < 600 ? 1 : 37) {
        const auto s = lora_dA_split(T, in, r);
        const std::string at = "T=" + std::to_string(T) + " in=" + std::to_string(in) + " r=" + std::to_string(r);
        ASSERT_GE(s.slices, 1) << at;
        ASSERT_GE(s.slices, last) << at << ": S fell as T grew";
        last = s.slices;
        ASSERT_LE(s.slices, cuda_workspace::kLoraDaMaxSlices) << at;
        ASSERT_LT((s.slices - 1) * s.slice_tokens, T) << at << ": an empty slice";
        ASSERT_GE(s.slices * s.slice_tokens, T) << at << ": tokens left out";
        ASSERT_EQ(cuda_workspace::lora_dropout_dA_bytes(T, in, r),
                  s.slices > 1 ? static_cast<size_t>(s.slices * r * in) * 4 : 0u)
            << at;
        if (s.slices == 1) continue;
        ASSERT_LE(s.slices * base, cuda_workspace::kLoraDaTargetBlocks) << at;
        ASSERT_GE(s.slice_tokens, cuda_workspace::kLoraDaMinSliceTokens) << at;
        ASSERT_GE(T - (s.slices - 1) * s.slice_tokens, 1) << at;
      }
    }
  }
}

TEST(CudaLoraDropout, NoTokensLaunchNothing) {
  const uint64_t before = launch_count();
  const cpu::LoraDropoutMember one{16, kSeed};
  lora_dropout_xa(nullptr, nullptr, nullptr, 0, 31, &one, 1, 0.05f);
  lora_dropout_dA_accumulate(nullptr, nullptr, nullptr, 0, 31, &one, 1, 0.05f, nullptr);
  lora_dropout_dx_accumulate(nullptr, nullptr, nullptr, 0, 31, &one, 1, 0.05f);
  EXPECT_EQ(launch_count(), before);
}

TEST(CudaLoraDropout, SameBitsUnderEveryScheduleWithTheCrossBlockWriteCheck) {
  const ScheduleChoice saved = current_schedule();
  const bool saved_check = set_write_check(true);
  // The last three split dA's tokens (3, 2 and 5 slices; the one with r = 67 a last slice shorter).
  for (const Case& c : {Case{45, 71, 17, 0.5f}, Case{70, 33, 1, 0.05f}, Case{23, 35, 67, 0.05f},
                        Case{400, 40, 5, 0.05f}, Case{300, 33, 1, 0.5f}, Case{701, 40, 67, 0.05f}}) {
    const Inputs in = inputs_for(c);
    set_schedule({Schedule::Forward, 0});
    uint64_t dA_launches = 0;
    const Outputs first = simulated(c, in, &dA_launches);
    EXPECT_EQ(dA_launches, cuda_workspace::lora_dA_split(c.T, c.in, c.r).slices > 1 ? 2u : 1u) << name_of(c);
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

// A group's members in one launch per product (q/k/v, gate/up: ops/linear.h lora_group_forward):
// A's rows and xa's / dxa's columns of one matrix, each member its own mask. Its xa, dA and dx are,
// bit for bit, those of each member launched alone (dx: the members' launches in member order),
// under every schedule with the cross-block write check on. Ranks 5, 70 (past one 64-rank chunk,
// a chunk of 64 shared by no other member) and 16; one case splits dA's tokens (the same S for
// the group's Σr = 91 as for each member alone, so the sums are the same).
struct GroupCase {
  int64_t T, in;
  float p;
};
TEST(CudaLoraDropout, GroupInOneLaunchPerProductGivesEachMembersBits) {
  const ScheduleChoice saved = current_schedule();
  const bool saved_check = set_write_check(true);
  const std::vector<cpu::LoraDropoutMember> members{{5, 11}, {70, 12}, {16, 13}};
  const int64_t R = 91;
  const int n = static_cast<int>(members.size());
  for (const GroupCase& g : {GroupCase{47, 37, 0.3f}, GroupCase{300, 40, 0.1f}, GroupCase{1, 1, 0.5f}}) {
    const std::string name = "T=" + std::to_string(g.T) + " in=" + std::to_string(g.in);
    const int64_t T = g.T, in = g.in;
    std::vector<float> x = test::random_floats(T * in, 1), A = test::random_floats(R * in, 2),
                       dxa = test::random_floats(T * R, 3), dA0 = test::random_floats(R * in, 4),
                       dx0 = test::random_floats(T * in, 5);
    x[0] = 0.0f;
    const int64_t slices = cuda_workspace::lora_dA_split(T, in, R).slices;
    // Each member alone: its A rows, its dxa columns, its own dA; dx through all three in order.
    std::vector<float> xa_want(T * R), dA_want = dA0, dx_want;
    {
      float* dx = device_copy(dx0);
      int64_t col = 0;
      for (const cpu::LoraDropoutMember& m : members) {
        ASSERT_EQ(cuda_workspace::lora_dA_split(T, in, m.r).slices, slices) << name;
        std::vector<float> Am(A.begin() + col * in, A.begin() + (col + m.r) * in), dxam(T * m.r);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = 0; j < m.r; ++j) dxam[t * m.r + j] = dxa[t * R + col + j];
        float *xd = device_copy(x), *Ad = device_copy(Am), *dxad = device_copy(dxam);
        float *xa = device_copy(std::vector<float>(T * m.r)),
              *dA = device_copy(std::vector<float>(dA0.begin() + col * in, dA0.begin() + (col + m.r) * in));
        float* ws = dA_workspace(Case{T, in, m.r, g.p});
        lora_dropout_xa(xd, Ad, xa, T, in, &m, 1, g.p);
        lora_dropout_dA_accumulate(dxad, xd, dA, T, in, &m, 1, g.p, ws);
        lora_dropout_dx_accumulate(dxad, Ad, dx, T, in, &m, 1, g.p);
        const std::vector<float> xah = host_copy(xa, T * m.r), dAh = host_copy(dA, m.r * in);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = 0; j < m.r; ++j) xa_want[t * R + col + j] = xah[t * m.r + j];
        std::copy(dAh.begin(), dAh.end(), dA_want.begin() + col * in);
        for (float* p : {xd, Ad, dxad, xa, dA}) cudaFree(p);
        if (ws) cudaFree(ws);
        col += m.r;
      }
      dx_want = host_copy(dx, T * in);
      cudaFree(dx);
    }
    for (ScheduleChoice sched : {ScheduleChoice{Schedule::Forward, 0}, ScheduleChoice{Schedule::Reverse, 0},
                                 ScheduleChoice{Schedule::Shuffle, 3}}) {
      set_schedule(sched);
      float *xd = device_copy(x), *Ad = device_copy(A), *dxad = device_copy(dxa);
      float *xa = device_copy(std::vector<float>(T * R, NAN)), *dA = device_copy(dA0), *dx = device_copy(dx0);
      float* ws = dA_workspace(Case{T, in, R, g.p});
      const uint64_t before = launch_count();
      lora_dropout_xa(xd, Ad, xa, T, in, members.data(), n, g.p);
      EXPECT_EQ(launch_count() - before, 1u) << name;
      lora_dropout_dA_accumulate(dxad, xd, dA, T, in, members.data(), n, g.p, ws);
      EXPECT_EQ(launch_count() - before, slices > 1 ? 3u : 2u) << name;
      lora_dropout_dx_accumulate(dxad, Ad, dx, T, in, members.data(), n, g.p);
      EXPECT_EQ(launch_count() - before, slices > 1 ? 4u : 3u) << name;
      const std::vector<float> xah = host_copy(xa, T * R), dAh = host_copy(dA, R * in), dxh = host_copy(dx, T * in);
      for (float* p : {xd, Ad, dxad, xa, dA, dx}) cudaFree(p);
      if (ws) cudaFree(ws);
      EXPECT_EQ(0, std::memcmp(xah.data(), xa_want.data(), xah.size() * sizeof(float))) << "xa " << name;
      EXPECT_EQ(0, std::memcmp(dAh.data(), dA_want.data(), dAh.size() * sizeof(float))) << "dA " << name;
      EXPECT_EQ(0, std::memcmp(dxh.data(), dx_want.data(), dxh.size() * sizeof(float))) << "dx " << name;
    }
    if (T == 300) {
      EXPECT_EQ(slices, 2) << "the split case does not split";
    }
  }
  set_schedule(saved);
  set_write_check(saved_check);
}

}  // namespace
}  // namespace bp::sim

namespace bp::test {
namespace {

// Through the op on the simulated card (ops/linear.cpp linear_backward, kernel_wrappers.h): a LoRA
// projection with dropout whose dA splits its tokens takes the partials from the card's allocator,
// exactly cuda_workspace::lora_dropout_dA_bytes (what the memory plan counts) beside the front-end's
// dxa [T, r], gives them back, and agrees with the CPU.
TEST(CudaLoraDropout, SplitWorkspaceComesFromTheCardsAllocatorAndIsCounted) {
  SimulatedCudaDevice card;
  const int64_t T = 300, in = 40, out = 9, r = 4;
  ASSERT_EQ(cuda_workspace::lora_dA_split(T, in, r).slices, 2);
  Tensor x = random_tensor({T, in}, 40), W = random_tensor({out, in}, 41), A = random_tensor({r, in}, 42);
  Tensor B = random_tensor({out, r}, 43), dy = random_tensor({T, out}, 44);
  Tensor xg = parity::gpu(x), Wg = parity::gpu(W), Ag = parity::gpu(A), Bg = parity::gpu(B), dyg = parity::gpu(dy);
  LoraWeights lc{&A, &B, 0.5f, 0.1f, 7, true}, lg{&Ag, &Bg, 0.5f, 0.1f, 7, true};
  LinearSaved sc, sg;
  linear_forward(x, W, nullptr, &lc, &sc);
  linear_forward(xg, Wg, nullptr, &lg, &sg);
  Tensor dA = random_tensor({r, in}, 45), dAg = parity::gpu(dA);
  linear_backward(dy, x, W, &lc, &sc, LinearGrads{nullptr, nullptr, nullptr, &dA});
  EXPECT_EQ(scratch_of(card,
                       [&] {
                         linear_backward(dyg, xg, Wg, &lg, &sg, LinearGrads{nullptr, nullptr, nullptr, &dAg});
                       }),
            static_cast<size_t>(T * r) * 4 + cuda_workspace::lora_dropout_dA_bytes(T, in, r));
  EXPECT_EQ(cuda_workspace::lora_dropout_dA_bytes(T, in, r), size_t{2} * r * in * 4);
  parity::expect_same(dAg, dA, "dA", Tolerance{1e-4, 1e-5});
}

}  // namespace
}  // namespace bp::test
