// CUDA attention (src/backend/cuda/attention.cuh) on the simulation against the CPU backend's
// blocked kernels (cpu::attention_forward / attention_backward): o and lse forward, dq, dk, dv
// backward, f32 and bf16 storage, over packed samples of odd lengths (1, 7, 33, 70 and an empty
// one), GQA ratios 1, 3 and 7, and head dims that pick each tile size of the kernels (32 rows up
// to d = 64, 16 above, 8 for the dK/dV pass at d = 128) — so samples span several query and key
// tiles and the online softmax really rescales. Outputs start as NaN: every element must be
// written.
//
// Two kernels (attention.cuh's launchers pick by the card): the scalar f32 kernels on a Turing card
// (simulated compute capability 7.5) and for head dims that are not multiples of 16; the
// tensor-core kernels from 8.0 on (attention_fa2.cuh's register-resident forward and dQ up to
// d = 128 and dK/dV up to d = 64, attention_tc.cuh's wmma kernels for the rest; the mma and wmma
// counters say which ran). The scalar path is checked at f32 tolerance
// in f32 storage. The tensor-core path rounds the products' inputs (Q, K, V, dO, P, dS) to bf16:
// relative error 2^-9 per input, so a score or an output element moves by up to ~2^-8 of the sum
// of |terms| it adds, and the sums over a long sample's keys (dK, dV) accumulate it; it is checked
// at the bf16 tolerance of every bf16 kernel test (2e-2 + 2e-2·|ref|, CONVENTIONS.md), lse and
// delta included, in both storages. The largest error seen uses 72% of it (dV, d = 16, the
// 161-token sample with sharp scores). The options (sliding window, scale, soft cap) run through
// every kernel against the CPU's the same way (OptionsMatchCpu).
#include <cstring>

#include "backend/cpu/attention.h"
#include "backend/cuda/attention.cuh"
#include "sim_device.h"
#include "sim_test_util.h"

namespace bp::sim {
namespace {

struct Case {
  std::vector<int32_t> lengths;
  int n_heads, n_kv_heads, head_dim;
  float qk_range;  // q and k uniform in ±qk_range: larger spreads the scores (sharper softmax)
  int window = 0;  // AttentionDims' options (ops/attention.h)
  float scale = 0.0f, softcap = 0.0f;
};

std::string describe(const Case& c) {
  std::string s = "Hq=" + std::to_string(c.n_heads) + " Hkv=" + std::to_string(c.n_kv_heads) +
                  " d=" + std::to_string(c.head_dim) + " window=" + std::to_string(c.window) +
                  " scale=" + std::to_string(c.scale) + " softcap=" + std::to_string(c.softcap) + " lengths";
  for (int32_t l : c.lengths) s += " " + std::to_string(l);
  return s;
}

template <class T>
std::vector<T> nan_filled(size_t n) {
  return test::as<T>(std::vector<float>(n, NAN));
}

// The card the kernels run on: Turing (scalar kernels), Ampere or Hopper (tensor cores).
struct Card {
  int major, minor;
};
constexpr Card kTuring{7, 5}, kAmpere{8, 0}, kHopper{9, 0};

template <class T>
void check_attention(const Case& c, Card card = kTuring) {
  bp::test::SimulatedComputeCapability cc(card.major, card.minor);
  const bool tensor_cores = card.major >= 8 && c.head_dim % 16 == 0;
  const std::string at = describe(c) + " cc " + std::to_string(card.major) + "." + std::to_string(card.minor);
  const uint64_t mma_before = wmma_mma_count();
  std::vector<int32_t> cu{0};
  for (int32_t l : c.lengths) cu.push_back(cu.back() + l);
  const int64_t tokens = cu.back(), S = static_cast<int64_t>(c.lengths.size());
  const cpu::AttentionDims dims{tokens, S, c.n_heads, c.n_kv_heads, c.head_dim, c.window, c.scale, c.softcap};
  const size_t nq = static_cast<size_t>(tokens) * c.n_heads * c.head_dim,
               nkv = static_cast<size_t>(tokens) * c.n_kv_heads * c.head_dim,
               nlse = static_cast<size_t>(tokens) * c.n_heads;
  const uint32_t seed = static_cast<uint32_t>(tokens * 31 + c.n_heads * 7 + c.head_dim);
  // Inputs hold values storage T can represent, so both sides see the same numbers.
  const auto q = test::back(test::as<T>(test::random_floats(nq, seed, -c.qk_range, c.qk_range)));
  const auto k = test::back(test::as<T>(test::random_floats(nkv, seed + 1, -c.qk_range, c.qk_range)));
  const auto v = test::back(test::as<T>(test::random_floats(nkv, seed + 2)));
  const auto dout = test::back(test::as<T>(test::random_floats(nq, seed + 3)));

  // Forward.
  std::vector<float> o_ref(nq), lse_ref(nlse);
  cpu::attention_forward(q.data(), k.data(), v.data(), cu.data(), dims, o_ref.data(), nullptr, lse_ref.data());
  const auto qd = test::as<T>(q), kd = test::as<T>(k), vd = test::as<T>(v), doutd = test::as<T>(dout);
  auto o = nan_filled<T>(nq);
  std::vector<float> lse(nlse, NAN);
  const uint64_t wmma_before_forward = wmma_mma_count(), mma_before_forward = mma_m16n8k16_count();
  std::vector<bf16> o16(nq);  // o's bf16 copy, o_proj's GEMM operand
  attention_forward<T>(qd.data(), kd.data(), vd.data(), cu.data(), dims, o.data(), o16.data(), lse.data());
  // The forward of the tensor-core cards: the register-resident kernel (PTX mma) up to
  // kFa2MaxHeadDim, attention_tc.cuh's (wmma) above.
  const bool fa2 = tensor_cores && c.head_dim <= kFa2MaxHeadDim;
  EXPECT_EQ(mma_m16n8k16_count() > mma_before_forward, fa2) << "which forward ran: " << at;
  EXPECT_EQ(wmma_mma_count() > wmma_before_forward, tensor_cores && !fa2) << "which forward ran: " << at;
  const auto tol = tensor_cores ? test::kBf16Tol : test::tolerance_of<T>();
  test::expect_close(test::back(o), o_ref, tol, "o " + at);
  test::expect_close(lse, lse_ref, tensor_cores ? test::kBf16Tol : test::kF32Tol, "lse " + at);  // f32 storage
  test::expect_bf16_copy(o16, test::back(o), "o bf16 copy " + at);

  // Without lse and the copy the output is the same.
  auto o_only = nan_filled<T>(nq);
  attention_forward<T>(qd.data(), kd.data(), vd.data(), cu.data(), dims, o_only.data(), nullptr, nullptr);
  EXPECT_EQ(0, std::memcmp(o_only.data(), o.data(), nq * sizeof(T))) << "forward without lse " << at;

  // Backward, from the same o (as stored in T) and lse on both sides.
  const auto o_in = test::back(test::as<T>(o_ref));
  std::vector<float> delta_ref(nlse), dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
  cpu::attention_backward(dout.data(), q.data(), k.data(), v.data(), o_in.data(), lse_ref.data(), cu.data(), dims,
                          delta_ref.data(), dq_ref.data(), dk_ref.data(), dv_ref.data(), nullptr);
  const auto o_ind = test::as<T>(o_in);
  std::vector<float> delta(nlse, NAN);
  auto dq = nan_filled<T>(nq), dk = nan_filled<T>(nkv), dv = nan_filled<T>(nkv);
  std::vector<bf16> dv16(nkv);  // dv's bf16 copy, v_proj's dy
  const uint64_t mma_before_backward = mma_m16n8k16_count(), wmma_before_backward = wmma_mma_count();
  attention_backward<T>(doutd.data(), qd.data(), kd.data(), vd.data(), o_ind.data(), lse_ref.data(), cu.data(), dims,
                        delta.data(), dq.data(), dk.data(), dv.data(), dv16.data());
  // On the tensor-core cards dK/dV run in registers (PTX mma) up to kFa2BackwardMaxHeadDim (64) and
  // dQ up to kFa2DqMaxHeadDim (128), each on wmma above. So no wmma at all up to 64 says dQ took
  // its mma kernel there, mma between 64 and 128 that it did there (dK/dV is on wmma), and no mma
  // above 128 that it did not.
  static_assert(kFa2BackwardMaxHeadDim < kFa2DqMaxHeadDim);
  const bool dq_fa2 = tensor_cores && c.head_dim <= kFa2DqMaxHeadDim;
  const bool dkdv_fa2 = tensor_cores && c.head_dim <= kFa2BackwardMaxHeadDim;
  EXPECT_EQ(mma_m16n8k16_count() > mma_before_backward, dq_fa2 || dkdv_fa2) << "which dQ ran: " << at;
  EXPECT_EQ(wmma_mma_count() > wmma_before_backward, tensor_cores && !(dq_fa2 && dkdv_fa2))
      << "which dK/dV or dQ ran: " << at;
  test::expect_close(delta, delta_ref, tensor_cores ? test::kBf16Tol : test::kF32Tol, "delta " + at);
  test::expect_close(test::back(dq), dq_ref, tol, "dq " + at);
  test::expect_close(test::back(dk), dk_ref, tol, "dk " + at);
  test::expect_close(test::back(dv), dv_ref, tol, "dv " + at);
  test::expect_bf16_copy(dv16, test::back(dv), "dv bf16 copy " + at);

  // Without the copy the gradients are the same.
  auto dq2 = nan_filled<T>(nq), dk2 = nan_filled<T>(nkv), dv2 = nan_filled<T>(nkv);
  attention_backward<T>(doutd.data(), qd.data(), kd.data(), vd.data(), o_ind.data(), lse_ref.data(), cu.data(), dims,
                        delta.data(), dq2.data(), dk2.data(), dv2.data(), nullptr);
  EXPECT_EQ(0, std::memcmp(dq2.data(), dq.data(), nq * sizeof(T))) << "backward without the copy " << at;
  EXPECT_EQ(0, std::memcmp(dk2.data(), dk.data(), nkv * sizeof(T))) << "backward without the copy " << at;
  EXPECT_EQ(0, std::memcmp(dv2.data(), dv.data(), nkv * sizeof(T))) << "backward without the copy " << at;
  EXPECT_EQ(wmma_mma_count() > mma_before, tensor_cores && c.head_dim > kFa2BackwardMaxHeadDim)
      << "which kernels ran: " << at;
}

const std::vector<int32_t> kLengths{1, 7, 33, 0, 70};

TEST(CudaAttention, TileRowsFollowTheHeadDim) {
  // The cases below rely on these: each tile size of each pass is exercised.
  EXPECT_EQ(attention_tile_rows(AttentionPass::Forward, 64), 32);
  EXPECT_EQ(attention_tile_rows(AttentionPass::GradKV, 64), 16);
  EXPECT_EQ(attention_tile_rows(AttentionPass::Forward, 97), 16);
  EXPECT_EQ(attention_tile_rows(AttentionPass::GradQ, 128), 16);
  EXPECT_EQ(attention_tile_rows(AttentionPass::GradKV, 128), 8);
  for (auto pass : {AttentionPass::Forward, AttentionPass::GradQ, AttentionPass::GradKV})
    for (int d : {1, 8, 64, 97, 128, 256}) {
      const auto bytes = attention_shared_floats(pass, attention_tile_rows(pass, d), d) * sizeof(float);
      EXPECT_LE(bytes, d <= 128 ? kAttentionDefaultSharedBytes : size_t{99} * 1024) << "d=" << d;
    }
  // The tensor-core kernels' tiles: 16-row multiples, and the sizes the cases below exercise.
  EXPECT_EQ(attention_tc_tile_rows(AttentionPass::Forward, 16), 64);
  EXPECT_EQ(attention_tc_tile_rows(AttentionPass::GradKV, 64), 32);
  EXPECT_EQ(attention_tc_tile_rows(AttentionPass::Forward, 128), 32);
  EXPECT_EQ(attention_tc_tile_rows(AttentionPass::GradKV, 128), 16);
  EXPECT_EQ(attention_tc_tile_rows(AttentionPass::GradQ, 256), 16);
  for (auto pass : {AttentionPass::Forward, AttentionPass::GradQ, AttentionPass::GradKV})
    for (int d : {16, 32, 64, 128, 256}) {
      const size_t bytes = attention_tc_shared_bytes(pass, attention_tc_tile_rows(pass, d), d);
      EXPECT_LE(bytes, d <= 128 ? kAttentionTcSharedBudget : size_t{99} * 1024) << "d=" << d;
    }
}

TEST(CudaAttention, TileBoundCoversEverySample) {
  // Σ ceil(len/B) <= bound, and a block past the last tile finds none.
  for (int B : {8, 16, 32}) {
    std::vector<int32_t> cu{0};
    int64_t tiles = 0;
    for (int32_t l : kLengths) {
      cu.push_back(cu.back() + l);
      tiles += (l + B - 1) / B;
    }
    const int64_t bound = attention_tile_bound(cu.back(), static_cast<int64_t>(kLengths.size()), B);
    EXPECT_GE(bound, tiles) << "B=" << B;
    AttentionTile tile{};
    EXPECT_TRUE(find_attention_tile(cu.data(), static_cast<int64_t>(kLengths.size()), B, tiles - 1, true, tile));
    EXPECT_FALSE(find_attention_tile(cu.data(), static_cast<int64_t>(kLengths.size()), B, tiles, true, tile));
  }
}

const std::vector<Case> kF32Cases{
    {kLengths, 2, 2, 8, 2.0f},      // stories260K's head dim, GQA ratio 1
    {kLengths, 3, 1, 5, 4.0f},      // ratio 3, odd d, sharp scores
    {kLengths, 7, 1, 13, 2.0f},     // ratio 7
    {{40, 3, 1}, 4, 2, 32, 2.0f},   // tiny-chat's heads
    {{33, 1, 17}, 6, 2, 97, 1.0f},  // 16-row tiles, ratio 3 over two KV heads
    {{19, 2}, 2, 1, 128, 1.0f},     // 8-row dK/dV tiles
    {{32, 16, 64}, 3, 3, 8, 2.0f},  // samples ending exactly on a tile edge
    {{16, 48}, 2, 2, 97, 2.0f},     // the same with 16-row tiles
    {{161, 5}, 2, 1, 8, 3.0f},      // six key tiles, sharp scores
};

TEST(CudaAttention, MatchesCpuF32) {
  for (const Case& c : kF32Cases) check_attention<float>(c, kTuring);
}

// The same cases on an Ampere card: the head dims that are multiples of 16 (32, 128) take the
// tensor cores, the others (5, 8, 13, 97) the scalar kernels, at f32 tolerance.
TEST(CudaAttention, MatchesCpuF32OnTensorCoreCards) {
  for (const Case& c : kF32Cases) check_attention<float>(c, kAmpere);
}

// The tensor-core kernels at the head dims of real models (64, 128), GQA, odd lengths spanning
// several 32-row tiles (the 70-token sample: three query and key tiles, the online softmax
// rescales), samples ending on a tile edge, and both storages, on Ampere and Hopper.
TEST(CudaAttention, TensorCoresMatchCpu) {
  for (Card card : {kAmpere, kHopper}) {
    check_attention<float>({kLengths, 4, 2, 64, 2.0f}, card);
    check_attention<bf16>({{33, 1, 17, 40}, 6, 2, 128, 1.0f}, card);  // 16-row dK/dV tiles, ratio 3
  }
  check_attention<bf16>({kLengths, 3, 1, 64, 2.0f}, kAmpere);
  check_attention<float>({{32, 16, 64}, 2, 2, 64, 2.0f}, kAmpere);  // tile edges
  check_attention<float>({{161, 5}, 2, 1, 16, 3.0f}, kAmpere);      // 64-row forward tiles, sharp scores
  // The register-resident forward at a head dim below its compiled width (96 of 128), a sample of
  // three 64-row query and key tiles (the diagonal tiles' skipped products, the rescale), one
  // ending on a tile edge.
  check_attention<bf16>({{150, 3, 64}, 4, 2, 96, 2.0f}, kHopper);
  // The register-resident dQ below its compiled widths (48 of 64, 80 of 128), GQA 3 and 2, a
  // sample of three 64-row tiles, odd lengths.
  check_attention<float>({{131, 9, 1}, 3, 1, 48, 2.0f}, kHopper);
  check_attention<bf16>({{70, 5, 33}, 4, 2, 80, 1.0f}, kAmpere);
}

// The tensor-core path is really a different computation: on f32 storage its outputs differ from
// the scalar kernels' (which agree with the CPU to f32 rounding) by bf16-rounding-sized amounts.
TEST(CudaAttention, TensorCoresRoundTheProductsToBf16) {
  const Case c{{45, 20}, 2, 1, 64, 2.0f};
  const cpu::AttentionDims dims{65, 2, c.n_heads, c.n_kv_heads, c.head_dim};
  const std::vector<int32_t> cu{0, 45, 65};
  const size_t nq = size_t{65} * c.n_heads * c.head_dim, nkv = size_t{65} * c.n_kv_heads * c.head_dim;
  const auto q = test::random_floats(nq, 1, -2.0f, 2.0f), k = test::random_floats(nkv, 2, -2.0f, 2.0f),
             v = test::random_floats(nkv, 3);
  auto run = [&](Card card) {
    bp::test::SimulatedComputeCapability cc(card.major, card.minor);
    std::vector<float> o(nq, NAN);
    attention_forward<float>(q.data(), k.data(), v.data(), cu.data(), dims, o.data(), nullptr, nullptr);
    return o;
  };
  const uint64_t mma_before = mma_m16n8k16_count();
  const auto scalar = run(kTuring);
  EXPECT_EQ(mma_m16n8k16_count(), mma_before);
  const auto tensor = run(kAmpere);
  EXPECT_GT(mma_m16n8k16_count(), mma_before);
  double max_diff = 0;
  for (size_t i = 0; i < nq; ++i) max_diff = std::max(max_diff, std::abs(double(scalar[i]) - tensor[i]));
  EXPECT_GT(max_diff, 1e-4);  // not the f32 kernel: f32 rounding differences stay below 1e-6 here
  EXPECT_LT(max_diff, 2e-2);  // bf16 inputs: 2^-9 relative each
}

// The register-resident kernels (forward, dK/dV, dQ) give bit-identical results whatever order the
// threads and blocks run in: every sum has a fixed order and every output one writer (a race on
// the staged K/V or Q/dO tiles, or a reduction depending on lane timing, would change bits here).
// One forward and backward at head dim d on an Ampere card, each output compared bit for bit
// between the in-order schedule and two others.
void expect_bit_identical_under_every_schedule(int d) {
  bp::test::SimulatedComputeCapability cc(kAmpere.major, kAmpere.minor);
  const std::vector<int32_t> cu{0, 70, 103};
  const cpu::AttentionDims dims{103, 2, 4, 2, d};
  const size_t nq = size_t{103} * 4 * d, nkv = size_t{103} * 2 * d, nlse = size_t{103} * 4;
  const auto q = test::random_floats(nq, 11, -2.0f, 2.0f), k = test::random_floats(nkv, 12, -2.0f, 2.0f),
             v = test::random_floats(nkv, 13), dout = test::random_floats(nq, 14);
  auto run = [&](ScheduleChoice schedule) {
    const ScheduleChoice saved = set_schedule(schedule);
    std::vector<float> o(nq, NAN), lse(nlse, NAN), delta(nlse, NAN), dq(nq, NAN), dk(nkv, NAN), dv(nkv, NAN);
    attention_forward<float>(q.data(), k.data(), v.data(), cu.data(), dims, o.data(), nullptr, lse.data());
    attention_backward<float>(dout.data(), q.data(), k.data(), v.data(), o.data(), lse.data(), cu.data(), dims,
                              delta.data(), dq.data(), dk.data(), dv.data());
    set_schedule(saved);
    o.insert(o.end(), lse.begin(), lse.end());
    o.insert(o.end(), dq.begin(), dq.end());
    o.insert(o.end(), dk.begin(), dk.end());
    o.insert(o.end(), dv.begin(), dv.end());
    return o;
  };
  const uint64_t mma_before = mma_m16n8k16_count();
  const auto in_order = run({Schedule::Forward, 0});
  EXPECT_GT(mma_m16n8k16_count(), mma_before);
  for (ScheduleChoice other : {ScheduleChoice{Schedule::Reverse, 0}, ScheduleChoice{Schedule::Shuffle, 5}}) {
    const auto got = run(other);
    EXPECT_EQ(0, std::memcmp(got.data(), in_order.data(), got.size() * sizeof(float))) << "d=" << d;
  }
}

// d = 64: every kernel register-resident; d = 128: the forward and dQ (the 128-wide build).
TEST(CudaAttention, RegisterKernelsAreBitIdenticalUnderEverySchedule) {
  for (int d : {64, 128}) expect_bit_identical_under_every_schedule(d);
}

// head_dim 256: the dK/dV pass needs more than 48 KiB of shared memory, which the simulation
// (like a card) grants only after attention.cuh's cudaFuncSetAttribute opt-in.
TEST(CudaAttention, WidestHeadsOptInToMoreSharedMemory) {
  ASSERT_GT(attention_shared_floats(AttentionPass::GradKV, attention_tile_rows(AttentionPass::GradKV, 256), 256) *
                sizeof(float),
            kAttentionDefaultSharedBytes);
  check_attention<float>({{9, 3}, 2, 1, 256, 1.0f}, kTuring);
  ASSERT_GT(attention_tc_shared_bytes(AttentionPass::GradKV, attention_tc_tile_rows(AttentionPass::GradKV, 256), 256),
            kAttentionDefaultSharedBytes);
  check_attention<float>({{9, 3}, 2, 1, 256, 1.0f}, kAmpere);
}

// Sliding windows (shorter than a tile, spanning tile edges), a custom scale and a soft cap in each
// kernel: the scalar ones (Turing), the register-resident forward, dQ and dK/dV (Ampere, d = 64),
// attention_tc.cuh's dK/dV (d = 128) and forward and dQ (d = 256, Gemma's head dim). Samples span
// several tiles so whole key and query tiles are skipped.
TEST(CudaAttention, OptionsMatchCpu) {
  struct Options {
    int window;
    float scale, softcap;
  };
  for (const Options& o : {Options{5, 0.0f, 0.0f}, Options{40, 0.3f, 2.0f}, Options{0, 0.0f, 1.5f}}) {
    check_attention<float>({{130, 7}, 4, 2, 8, 2.0f, o.window, o.scale, o.softcap}, kTuring);
    check_attention<float>({{130, 7}, 2, 1, 64, 2.0f, o.window, o.scale, o.softcap}, kAmpere);
    check_attention<float>({{40, 3}, 2, 1, 128, 1.0f, o.window, o.scale, o.softcap}, kAmpere);
    check_attention<bf16>({{36, 2}, 2, 1, 256, 1.0f, o.window, o.scale, o.softcap}, kAmpere);
  }
}

TEST(CudaAttention, MatchesCpuBf16) {
  for (Card card : {kTuring, kAmpere}) {
    check_attention<bf16>({kLengths, 3, 1, 8, 2.0f}, card);
    check_attention<bf16>({{33, 1, 17}, 7, 1, 64, 1.0f}, card);
  }
}

}  // namespace
}  // namespace bp::sim
