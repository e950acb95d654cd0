// CUDA attention (src/backend/cuda/attention.cuh) on the simulation against the CPU backend's
// blocked kernels (cpu::attention_forward / attention_backward): o and lse forward, dq, dk, dv
// backward, f32 and bf16 storage, over packed samples of odd lengths (1, 7, 33, 70 and an empty
// one), GQA ratios 1, 3 and 7, and head dims that pick each tile size of the kernels (32 rows up
// to d = 64, 16 above, 8 for the dK/dV pass at d = 128) — so samples span several query and key
// tiles and the online softmax really rescales. Outputs start as NaN: every element must be
// written.
#include <cstring>

#include "backend/cpu/attention.h"
#include "backend/cuda/attention.cuh"
#include "sim_test_util.h"

namespace bp::sim {
namespace {

struct Case {
  std::vector<int32_t> lengths;
  int n_heads, n_kv_heads, head_dim;
  float qk_range;  // q and k uniform in ±qk_range: larger spreads the scores (sharper softmax)
};

std::string describe(const Case& c) {
  std::string s = "Hq=" + std::to_string(c.n_heads) + " Hkv=" + std::to_string(c.n_kv_heads) +
                  " d=" + std::to_string(c.head_dim) + " lengths";
  for (int32_t l : c.lengths) s += " " + std::to_string(l);
  return s;
}

template <class T>
std::vector<T> nan_filled(size_t n) {
  return test::as<T>(std::vector<float>(n, NAN));
}

template <class T>
void check_attention(const Case& c) {
  const std::string at = describe(c);
  std::vector<int32_t> cu{0};
  for (int32_t l : c.lengths) cu.push_back(cu.back() + l);
  const int64_t tokens = cu.back(), S = static_cast<int64_t>(c.lengths.size());
  const cpu::AttentionDims dims{tokens, S, c.n_heads, c.n_kv_heads, c.head_dim};
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
  cpu::attention_forward(q.data(), k.data(), v.data(), cu.data(), dims, o_ref.data(), lse_ref.data());
  const auto qd = test::as<T>(q), kd = test::as<T>(k), vd = test::as<T>(v), doutd = test::as<T>(dout);
  auto o = nan_filled<T>(nq);
  std::vector<float> lse(nlse, NAN);
  attention_forward<T>(qd.data(), kd.data(), vd.data(), cu.data(), dims, o.data(), lse.data());
  const auto tol = test::tolerance_of<T>();
  test::expect_close(test::back(o), o_ref, tol, "o " + at);
  test::expect_close(lse, lse_ref, test::kF32Tol, "lse " + at);  // f32 in both storages

  // Without lse the output is the same.
  auto o_only = nan_filled<T>(nq);
  attention_forward<T>(qd.data(), kd.data(), vd.data(), cu.data(), dims, o_only.data(), nullptr);
  EXPECT_EQ(0, std::memcmp(o_only.data(), o.data(), nq * sizeof(T))) << "forward without lse " << at;

  // Backward, from the same o (as stored in T) and lse on both sides.
  const auto o_in = test::back(test::as<T>(o_ref));
  std::vector<float> delta_ref(nlse), dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
  cpu::attention_backward(dout.data(), q.data(), k.data(), v.data(), o_in.data(), lse_ref.data(), cu.data(), dims,
                          delta_ref.data(), dq_ref.data(), dk_ref.data(), dv_ref.data());
  const auto o_ind = test::as<T>(o_in);
  std::vector<float> delta(nlse, NAN);
  auto dq = nan_filled<T>(nq), dk = nan_filled<T>(nkv), dv = nan_filled<T>(nkv);
  attention_backward<T>(doutd.data(), qd.data(), kd.data(), vd.data(), o_ind.data(), lse_ref.data(), cu.data(), dims,
                        delta.data(), dq.data(), dk.data(), dv.data());
  test::expect_close(delta, delta_ref, test::kF32Tol, "delta " + at);
  test::expect_close(test::back(dq), dq_ref, tol, "dq " + at);
  test::expect_close(test::back(dk), dk_ref, tol, "dk " + at);
  test::expect_close(test::back(dv), dv_ref, tol, "dv " + at);
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

TEST(CudaAttention, MatchesCpuF32) {
  check_attention<float>({kLengths, 2, 2, 8, 2.0f});      // stories260K's head dim, GQA ratio 1
  check_attention<float>({kLengths, 3, 1, 5, 4.0f});      // ratio 3, odd d, sharp scores
  check_attention<float>({kLengths, 7, 1, 13, 2.0f});     // ratio 7
  check_attention<float>({{40, 3, 1}, 4, 2, 32, 2.0f});   // tiny-chat's heads
  check_attention<float>({{33, 1, 17}, 6, 2, 97, 1.0f});  // 16-row tiles, ratio 3 over two KV heads
  check_attention<float>({{19, 2}, 2, 1, 128, 1.0f});     // 8-row dK/dV tiles
  check_attention<float>({{32, 16, 64}, 3, 3, 8, 2.0f});  // samples ending exactly on a tile edge
  check_attention<float>({{16, 48}, 2, 2, 97, 2.0f});     // the same with 16-row tiles
  check_attention<float>({{161, 5}, 2, 1, 8, 3.0f});      // six key tiles, sharp scores
}

// head_dim 256: the dK/dV pass needs more than 48 KiB of shared memory, which the simulation
// (like a card) grants only after attention.cuh's cudaFuncSetAttribute opt-in.
TEST(CudaAttention, WidestHeadsOptInToMoreSharedMemory) {
  ASSERT_GT(attention_shared_floats(AttentionPass::GradKV, attention_tile_rows(AttentionPass::GradKV, 256), 256) *
                sizeof(float),
            kAttentionDefaultSharedBytes);
  check_attention<float>({{9, 3}, 2, 1, 256, 1.0f});
}

TEST(CudaAttention, MatchesCpuBf16) {
  check_attention<bf16>({kLengths, 3, 1, 8, 2.0f});
  check_attention<bf16>({{33, 1, 17}, 7, 1, 64, 1.0f});
}

}  // namespace
}  // namespace bp::sim
