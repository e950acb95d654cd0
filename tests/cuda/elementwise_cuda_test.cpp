// CUDA SwiGLU and GeGLU, RoPE and embedding (src/backend/cuda/{swiglu,rope,embedding}.cuh) on the CPU
// simulation against the CPU backend: f32 and bf16 storage, forward and backward, odd sizes; and the
// column sums of the backward's reductions over tokens (column_sum.cuh, through the bias gradient).
#include <cmath>
#include <cstring>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/embedding.h"
#include "backend/cpu/rope.h"
#include "backend/cpu/swiglu.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/swiglu.cuh"
#include "sim_test_util.h"

namespace bp::sim {
namespace {

// SwiGLU, or GeGLU (gelu: Gemma's gelu_pytorch_tanh gate), against the CPU kernel.
template <class T>
void check_glu(int64_t n, bool gelu) {
  const auto g = test::back(test::as<T>(test::random_floats(n, 10 + n, -4, 4)));
  const auto u = test::back(test::as<T>(test::random_floats(n, 11 + n)));
  const auto dh = test::back(test::as<T>(test::random_floats(n, 12 + n)));
  std::vector<float> h_ref(n), dg_ref(n), du_ref(n);
  (gelu ? cpu::geglu_forward : cpu::swiglu_forward)(g.data(), u.data(), h_ref.data(), nullptr, n);
  (gelu ? cpu::geglu_backward : cpu::swiglu_backward)(dh.data(), g.data(), u.data(), dg_ref.data(), du_ref.data(),
                                                      nullptr, nullptr, n);
  auto fwd = gelu ? geglu_forward<T> : swiglu_forward<T>;
  auto bwd = gelu ? geglu_backward<T> : swiglu_backward<T>;
  auto gd = test::as<T>(g), ud = test::as<T>(u), dhd = test::as<T>(dh);
  std::vector<T> h(n), dg(n), du(n), h2(n), dg2(n), du2(n);
  std::vector<bf16> h16(n), dg16(n), du16(n);  // the bf16 copies the GEMMs read
  fwd(gd.data(), ud.data(), h.data(), h16.data(), n, nullptr);
  bwd(dhd.data(), gd.data(), ud.data(), dg.data(), du.data(), dg16.data(), du16.data(), n, nullptr);
  fwd(gd.data(), ud.data(), h2.data(), nullptr, n, nullptr);
  bwd(dhd.data(), gd.data(), ud.data(), dg2.data(), du2.data(), nullptr, nullptr, n, nullptr);
  const std::string at = " n=" + std::to_string(n);
  test::expect_bf16_copy(h16, test::back(h), "h bf16 copy" + at);
  test::expect_bf16_copy(dg16, test::back(dg), "dgate bf16 copy" + at);
  test::expect_bf16_copy(du16, test::back(du), "dup bf16 copy" + at);
  EXPECT_EQ(test::back(h2), test::back(h)) << at;  // the copies change nothing else
  EXPECT_EQ(test::back(dg2), test::back(dg)) << at;
  EXPECT_EQ(test::back(du2), test::back(du)) << at;
  test::expect_close(test::back(h), h_ref, test::tolerance_of<T>(), "h" + at);
  test::expect_close(test::back(dg), dg_ref, test::tolerance_of<T>(), "dgate" + at);
  test::expect_close(test::back(du), du_ref, test::tolerance_of<T>(), "dup" + at);
}

TEST(CudaSwiglu, MatchesCpuAtOddSizes) {
  for (int64_t n : {1, 31, 33, 257, 1000}) {
    check_glu<float>(n, false);
    check_glu<bf16>(n, false);
  }
}

TEST(CudaGeglu, MatchesCpuAtOddSizes) {
  for (int64_t n : {1, 31, 33, 257, 1000}) {
    check_glu<float>(n, true);
    check_glu<bf16>(n, true);
  }
}

// q [T, q_heads·d] and k [T, k_heads·d] (k_heads 0: q alone) in one launch against the CPU kernel,
// with both bf16 copies; with_bias: q's and k's biases added before the rotation.
// rot_dim (-1: head_dim): only the first rot_dim dims of each head rotate (partial rotary; 0: a
// layer without RoPE), the rest pass through; attn_scale multiplies cos and sin (LongRoPE).
template <class T>
void check_rope(int64_t T_tokens, int64_t q_heads, int64_t k_heads, int64_t head_dim, bool inverse,
                bool with_bias = false, int64_t rot_dim = -1, float attn_scale = 1.0f) {
  if (rot_dim < 0) rot_dim = head_dim;
  const int64_t nq = T_tokens * q_heads * head_dim, nk = T_tokens * k_heads * head_dim;
  const auto q = test::back(test::as<T>(test::random_floats(nq, 20 + nq)));
  const auto k = test::back(test::as<T>(test::random_floats(nk, 21 + nk)));
  const auto bq = test::random_floats(q_heads * head_dim, 22), bk = test::random_floats(k_heads * head_dim, 23);
  const float* qb = with_bias ? bq.data() : nullptr;
  const float* kb = with_bias ? bk.data() : nullptr;
  std::vector<int32_t> pos(T_tokens);
  for (int64_t t = 0; t < T_tokens; ++t) pos[t] = static_cast<int32_t>((t * 7919) % 2049);  // packed: restarts
  std::vector<float> inv_freq(std::max<int64_t>(rot_dim / 2, 1));
  for (size_t i = 0; i < inv_freq.size(); ++i)
    inv_freq[i] = std::pow(10000.0f, -2.0f * i / std::max<int64_t>(rot_dim, 1));
  auto q_ref = q, k_ref = k;
  cpu::rope_apply({q_ref.data(), q_heads, nullptr, qb}, {k_heads ? k_ref.data() : nullptr, k_heads, nullptr, kb},
                  pos.data(), inv_freq.data(), T_tokens, head_dim, rot_dim, attn_scale, inverse);
  auto qg = test::as<T>(q), kg = test::as<T>(k);
  // the rotated tensors' bf16 copies (the backward's dq, dk)
  std::vector<bf16> q16(static_cast<size_t>(nq)), k16(static_cast<size_t>(nk));
  rope_apply<T>(qg.data(), q_heads, q16.data(), qb, k_heads ? kg.data() : nullptr, k_heads, k16.data(), kb, pos.data(),
                inv_freq.data(), T_tokens, head_dim, rot_dim, attn_scale, inverse);
  // f32: angles up to ~2000 rad, where sincosf and the CPU's rounded double differ by a few ulp.
  const auto tol = std::is_same_v<T, float> ? test::Tolerance{2e-5, 2e-5} : test::kBf16Tol;
  const std::string at = "rope T=" + std::to_string(T_tokens) + " heads=" + std::to_string(q_heads) + "+" +
                         std::to_string(k_heads) + " d=" + std::to_string(head_dim) + (inverse ? " inverse" : "") +
                         (with_bias ? " with biases" : "") + " rot=" + std::to_string(rot_dim) +
                         " scale=" + std::to_string(attn_scale);
  test::expect_close(test::back(qg), q_ref, tol, "q " + at);
  test::expect_bf16_copy(q16, test::back(qg), "bf16 copy of q " + at);
  if (k_heads) {
    test::expect_close(test::back(kg), k_ref, tol, "k " + at);
    test::expect_bf16_copy(k16, test::back(kg), "bf16 copy of k " + at);
  }
  // Without the copies, and each tensor in a launch of its own: the same bits.
  auto q_plain = test::as<T>(q), k_plain = test::as<T>(k);
  rope_apply<T>(q_plain.data(), q_heads, nullptr, qb, nullptr, 0, nullptr, nullptr, pos.data(), inv_freq.data(),
                T_tokens, head_dim, rot_dim, attn_scale, inverse);
  EXPECT_EQ(0, std::memcmp(q_plain.data(), qg.data(), qg.size() * sizeof(T))) << at;
  if (!k_heads) return;
  rope_apply<T>(k_plain.data(), k_heads, nullptr, kb, nullptr, 0, nullptr, nullptr, pos.data(), inv_freq.data(),
                T_tokens, head_dim, rot_dim, attn_scale, inverse);
  EXPECT_EQ(0, std::memcmp(k_plain.data(), kg.data(), kg.size() * sizeof(T))) << at;
}

TEST(CudaRope, ForwardAndInverseMatchCpu) {
  for (bool inverse : {false, true}) {
    check_rope<float>(1, 1, 0, 2, inverse);
    check_rope<float>(33, 3, 0, 34, inverse);
    check_rope<float>(31, 2, 0, 64, inverse);
    check_rope<bf16>(33, 3, 0, 34, inverse);
  }
}

// q and k of grouped heads in one launch: the grid walks both tensors' heads, each at its own row.
TEST(CudaRope, QAndKInOneLaunchMatchCpu) {
  for (bool inverse : {false, true}) {
    check_rope<float>(1, 1, 1, 2, inverse);
    check_rope<float>(33, 3, 1, 34, inverse);
    check_rope<float>(31, 4, 2, 64, inverse);
    check_rope<bf16>(33, 2, 3, 34, inverse);  // more k heads than q: the split is by count, not order
  }
  // q_proj's and k_proj's biases (Qwen2) added before the rotation, each at its own head's columns.
  check_rope<float>(33, 3, 1, 34, false, true);
  check_rope<float>(31, 2, 4, 64, false, true);
  check_rope<bf16>(33, 3, 1, 34, false, true);
}

// Partial rotary (Phi-3: the first rot_dim dims rotate, the rest pass through with their bias and
// bf16 copy), LongRoPE's attention factor on cos and sin, and rotary width 0 (SmolLM3's layers
// without RoPE: only the biases and the copies).
TEST(CudaRope, PartialRotaryScaleAndNoRopeMatchCpu) {
  for (bool inverse : {false, true}) {
    check_rope<float>(33, 3, 1, 34, inverse, true, 24, 1.1902380714f);
    check_rope<float>(31, 2, 2, 16, inverse, false, 12, 1.0f);
    check_rope<bf16>(33, 2, 3, 34, inverse, true, 10, 0.75f);
    check_rope<float>(17, 3, 1, 34, inverse, true, 0, 1.0f);
  }
  // A pass-through dim is the input plus its bias, untouched by the rotation.
  const int64_t d = 8, rot = 6;
  std::vector<float> x = test::random_floats(d, 5), bias = test::random_floats(d, 6);
  const std::vector<int32_t> pos = {3};
  const std::vector<float> inv = {1.0f, 0.1f, 0.01f};
  std::vector<float> y = x;
  cpu::rope_apply({y.data(), 1, nullptr, bias.data()}, {}, pos.data(), inv.data(), 1, d, rot, 1.5f, false);
  EXPECT_EQ(y[6], x[6] + bias[6]);
  EXPECT_EQ(y[7], x[7] + bias[7]);
  EXPECT_NEAR(y[0], 1.5 * ((x[0] + bias[0]) * std::cos(3.0) - (x[3] + bias[3]) * std::sin(3.0)), 1e-5);
}

template <class T>
void check_embedding(int64_t T_tokens, int64_t V, int64_t D) {
  const auto table = test::back(test::as<T>(test::random_floats(V * D, 30 + D)));
  const auto dy = test::back(test::as<T>(test::random_floats(T_tokens * D, 31 + D)));
  std::vector<int32_t> ids(T_tokens);
  std::mt19937 rng(static_cast<uint32_t>(T_tokens));
  for (auto& id : ids) id = static_cast<int32_t>(rng() % V);  // repeats when T > V
  std::vector<float> y_ref(T_tokens * D), dt_ref(V * D, 0.5f);
  cpu::embedding_forward(ids.data(), table.data(), y_ref.data(), T_tokens, D);
  cpu::embedding_backward(dy.data(), ids.data(), dt_ref.data(), T_tokens, D);
  auto tabled = test::as<T>(table), dyd = test::as<T>(dy);
  std::vector<T> y(T_tokens * D);
  std::vector<float> dt(V * D, 0.5f);
  embedding_forward<T>(ids.data(), tabled.data(), y.data(), T_tokens, D);
  embedding_backward<T>(dyd.data(), ids.data(), dt.data(), T_tokens, D);
  test::expect_close(test::back(y), y_ref, {0, 0}, "embedding y");  // a copy: exact
  // Each (id, column) is summed by one thread over the tokens in order, as the CPU does: the same bits.
  test::expect_close(dt, dt_ref, {0, 0}, "embedding dtable");
}

TEST(CudaEmbedding, ForwardCopiesRowsBackwardAccumulatesRepeatedIds) {
  check_embedding<float>(1, 1, 1);
  check_embedding<float>(33, 7, 31);
  check_embedding<float>(257, 50, 33);
  check_embedding<bf16>(33, 7, 257);
  check_embedding<float>(700, 300, 70);  // ids in every one of the kernel's id parts, partial column tiles
  check_embedding<float>(300, 1, 40);    // every token the same id: one thread per column adds them all
}

// db += Σ_t dy[t, :] with the tokens split over the thread rows of a block (column_sum.cuh): against
// a double sum within f32's rounding of T additions, and the same bits under another schedule (the
// split and every order of addition depend on the shape alone).
TEST(CudaColumnSum, BiasGradOverManyTokensMatchesADoubleSumAndRepeatsBitForBit) {
  for (auto [T_tokens, N] : {std::pair<int64_t, int64_t>{1, 1}, {15, 33}, {17, 32}, {1000, 70}}) {
    const auto dy = test::random_floats(T_tokens * N, 40 + N);
    std::vector<float> db(N, 0.5f), db_shuffled(N, 0.5f), ref(N);
    for (int64_t j = 0; j < N; ++j) {
      double s = 0.5;
      for (int64_t t = 0; t < T_tokens; ++t) s += dy[t * N + j];
      ref[j] = static_cast<float>(s);
    }
    bias_grad_accumulate(dy.data(), db.data(), T_tokens, N, nullptr);
    const ScheduleChoice before = set_schedule({Schedule::Shuffle, 7});
    bias_grad_accumulate(dy.data(), db_shuffled.data(), T_tokens, N, nullptr);
    set_schedule(before);
    const std::string at = " T=" + std::to_string(T_tokens) + " N=" + std::to_string(N);
    test::expect_close(db, ref, {1e-6 * T_tokens, 1e-6}, "db" + at);
    test::expect_close(db_shuffled, db, {0, 0}, "db under a shuffled schedule" + at);
  }
}

// DoRA's per-column kernels against the CPU backend's: the column scale and c = m/sqrt(n²) bit for
// bit (one rounding each, the same operations), the weighted column dot within f32's rounding of a
// T-term sum (another order of addition: column_sum.cuh's row groups), at odd sizes.
TEST(CudaDora, ColumnKernelsMatchTheCpuBackend) {
  for (auto [T_tokens, N] : {std::pair<int64_t, int64_t>{1, 1}, {31, 33}, {257, 32}}) {
    const std::string at = " T=" + std::to_string(T_tokens) + " N=" + std::to_string(N);
    const auto z = test::random_floats(T_tokens * N, 60 + N), g = test::random_floats(T_tokens * N, 61 + N);
    const auto c = test::random_floats(N, 62 + N, 0.5f, 2.0f), m = test::random_floats(N, 63 + N, 0.5f, 2.0f);
    const auto nsq = test::random_floats(N, 64 + N, 0.1f, 3.0f), w = test::random_floats(N, 65 + N, 0.5f, 2.0f);
    std::vector<float> y = test::random_floats(T_tokens * N, 66 + N), y_ref = y;
    column_scale_add(y.data(), c.data(), z.data(), T_tokens, N, nullptr);
    cpu::column_scale_add(y_ref.data(), c.data(), z.data(), T_tokens, N);
    EXPECT_EQ(y, y_ref) << "column_scale_add" << at;
    std::vector<float> acc(N, 0.25f), acc_ref(N, 0.25f), abs_sum(N, 0.0f);
    column_dot_accumulate(g.data(), z.data(), w.data(), acc.data(), T_tokens, N, nullptr);
    cpu::column_dot_accumulate(g.data(), z.data(), w.data(), acc_ref.data(), T_tokens, N);
    for (int64_t j = 0; j < N; ++j)
      for (int64_t t = 0; t < T_tokens; ++t) abs_sum[j] += std::fabs(g[t * N + j] * z[t * N + j]) * w[j];
    for (int64_t j = 0; j < N; ++j)
      EXPECT_NEAR(acc[j], acc_ref[j], 2e-7 * T_tokens * abs_sum[j] + 1e-7) << "column_dot_accumulate" << at;
    std::vector<float> cc(N), inv(N), cc_ref(N), inv_ref(N);
    dora_column_scale(m.data(), nsq.data(), cc.data(), inv.data(), N, nullptr);
    cpu::dora_column_scale(m.data(), nsq.data(), cc_ref.data(), inv_ref.data(), N);
    EXPECT_EQ(cc, cc_ref) << at;
    EXPECT_EQ(inv, inv_ref) << at;
  }
}

}  // namespace
}  // namespace bp::sim
