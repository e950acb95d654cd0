// Causal GQA attention over packed samples against a naive per-sample full-softmax reference in
// double written here, finite differences in f64, and the PyTorch oracle (per-sample mask); the
// options (sliding window, scale, soft cap) against the same reference and the plain kernels.
#include "ops/attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <numeric>

#include "backend/cpu/attention.h"
#include "op_test_util.h"
#include "support/finite_diff_b.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::all_close;

struct Problem {
  std::vector<int32_t> cu;
  int64_t T = 0;
  AttentionShape shape;
  std::vector<float> q, k, v, dout;
};

Problem make_problem(const std::vector<int32_t>& lengths, int hq, int hkv, int d, uint64_t seed, int window = 0,
                     float scale = 0.0f, float softcap = 0.0f) {
  Problem p;
  p.cu = {0};
  for (int32_t l : lengths) p.cu.push_back(p.cu.back() + l);
  p.T = p.cu.back();
  p.shape = {hq, hkv, d, window, scale, softcap};
  p.q = test::random_vector(p.T * hq * d, seed, -2, 2);
  p.k = test::random_vector(p.T * hkv * d, seed + 1, -2, 2);
  p.v = test::random_vector(p.T * hkv * d, seed + 2);
  p.dout = test::random_vector(p.T * hq * d, seed + 3);
  return p;
}

struct RefOut {
  std::vector<double> o, lse, dq, dk, dv;
};

// Naive reference: for each sample and head, the full causal softmax of that sample alone, over
// the keys j > i - W a window W leaves, each score scaled (by the shape's scale or 1/sqrt(d)) and
// then soft-capped (c·tanh(s/c)) when the shape says so.
RefOut reference(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                 const std::vector<double>& v, const std::vector<double>& dout) {
  const int hq = p.shape.n_heads, hkv = p.shape.n_kv_heads, d = p.shape.head_dim, group = hq / hkv;
  const double scale = p.shape.scale > 0 ? p.shape.scale : 1.0 / std::sqrt(double(d)), cap = p.shape.softcap;
  RefOut r;
  r.o.assign(q.size(), 0);
  r.dq.assign(q.size(), 0);
  r.dk.assign(k.size(), 0);
  r.dv.assign(v.size(), 0);
  r.lse.assign(size_t(hq * p.T), 0);
  auto Q = [&](int64_t t, int h, int c) { return q[(t * hq + h) * d + c]; };
  auto K = [&](int64_t t, int g, int c) { return k[(t * hkv + g) * d + c]; };
  auto Vv = [&](int64_t t, int g, int c) { return v[(t * hkv + g) * d + c]; };
  auto dO = [&](int64_t t, int h, int c) { return dout[(t * hq + h) * d + c]; };
  for (size_t s = 0; s + 1 < p.cu.size(); ++s) {
    const int64_t b = p.cu[s], e = p.cu[s + 1];
    for (int h = 0; h < hq; ++h) {
      const int g = h / group;
      for (int64_t i = b; i < e; ++i) {
        const int64_t jb = p.shape.window > 0 ? std::max(b, i - p.shape.window + 1) : b;  // first visible key
        std::vector<double> sc(size_t(i - jb + 1)), P(sc.size()), dP(sc.size()), slope(sc.size(), 1.0);
        double mx = -INFINITY;
        for (int64_t j = jb; j <= i; ++j) {
          double x = 0;
          for (int c = 0; c < d; ++c) x += Q(i, h, c) * K(j, g, c);
          x *= scale;
          if (cap > 0) {
            const double t = std::tanh(x / cap);
            x = cap * t;
            slope[j - jb] = 1 - t * t;
          }
          sc[j - jb] = x;
          mx = std::max(mx, sc[j - jb]);
        }
        double sum = 0;
        for (double x : sc) sum += std::exp(x - mx);
        r.lse[h * p.T + i] = mx + std::log(sum);
        double dot_pdp = 0;
        for (int64_t j = jb; j <= i; ++j) {
          P[j - jb] = std::exp(sc[j - jb] - mx) / sum;
          double x = 0;
          for (int c = 0; c < d; ++c) {
            r.o[(i * hq + h) * d + c] += P[j - jb] * Vv(j, g, c);
            x += dO(i, h, c) * Vv(j, g, c);
          }
          dP[j - jb] = x;
          dot_pdp += P[j - jb] * x;
        }
        for (int64_t j = jb; j <= i; ++j) {
          const double dS = P[j - jb] * (dP[j - jb] - dot_pdp) * slope[j - jb];
          for (int c = 0; c < d; ++c) {
            r.dq[(i * hq + h) * d + c] += scale * dS * K(j, g, c);
            r.dk[(j * hkv + g) * d + c] += scale * dS * Q(i, h, c);
            r.dv[(j * hkv + g) * d + c] += P[j - jb] * dO(i, h, c);
          }
        }
      }
    }
  }
  return r;
}

struct OpOut {
  std::vector<float> o, lse, dq, dk, dv;
};

OpOut run_op(const Problem& p) {
  const int64_t cq = int64_t{p.shape.n_heads} * p.shape.head_dim, ckv = int64_t{p.shape.n_kv_heads} * p.shape.head_dim;
  Tensor q = Tensor::from_vector(p.q, {p.T, cq}), k = Tensor::from_vector(p.k, {p.T, ckv}),
         v = Tensor::from_vector(p.v, {p.T, ckv}), dout = Tensor::from_vector(p.dout, {p.T, cq});
  Tensor cu = Tensor::from_vector(p.cu, {int64_t(p.cu.size())});
  Tensor lse;
  Tensor o = attention_forward(q, k, v, cu, p.shape, &lse);
  Tensor dq = Tensor::empty({p.T, cq}), dk = Tensor::empty({p.T, ckv}), dv = Tensor::empty({p.T, ckv});
  dq.fill(NAN), dk.fill(NAN), dv.fill(NAN);  // overwritten (=)
  attention_backward(dout, q, k, v, o, lse, cu, p.shape, dq, dk, dv);
  return {o.to_vector(), lse.to_vector(), dq.to_vector(), dk.to_vector(), dv.to_vector()};
}

constexpr test::Tolerance kTolGrad{2e-5, 1e-4};  // sums over up to Hq/Hkv · 257 terms in f32

void expect_matches_reference(const Problem& p) {
  RefOut ref = reference(p, test::to_double(p.q), test::to_double(p.k), test::to_double(p.v), test::to_double(p.dout));
  OpOut got = run_op(p);
  EXPECT_TRUE(all_close(got.o, test::to_float(ref.o), test::kTolF32));
  EXPECT_TRUE(all_close(got.lse, test::to_float(ref.lse), test::kTolF32));
  EXPECT_TRUE(all_close(got.dq, test::to_float(ref.dq), kTolGrad));
  EXPECT_TRUE(all_close(got.dk, test::to_float(ref.dk), kTolGrad));
  EXPECT_TRUE(all_close(got.dv, test::to_float(ref.dv), kTolGrad));
}

TEST(Attention, MatchesNaiveReferenceAtOddSizesAndGqaRatios) {
  const std::vector<std::vector<int32_t>> packs = {{1}, {31}, {32}, {33}, {257}, {5, 1, 64, 65, 1, 129}};
  const std::vector<std::array<int, 3>> shapes = {{2, 2, 16}, {4, 2, 8}, {4, 1, 7}};
  uint64_t seed = 1;
  for (const auto& lengths : packs)
    for (const auto& [hq, hkv, d] : shapes) {
      Problem p = make_problem(lengths, hq, hkv, d, seed += 10);
      SCOPED_TRACE(::testing::Message() << "T=" << p.T << " samples=" << lengths.size() << " Hq=" << hq
                                        << " Hkv=" << hkv << " d=" << d);
      expect_matches_reference(p);
    }
}

// Sliding windows (HF's kv_idx > q_idx - W) of 1, shorter than a block, a block and one past it,
// and longer than every sample; a custom scale; a soft cap (with scores large enough for tanh to
// bend them); all three together. Samples span several 64-row blocks so blocks whose window starts
// mid-sample and key rows that only earlier blocks reach are covered.
TEST(Attention, OptionsMatchNaiveReference) {
  struct Case {
    int window;
    float scale, softcap;
  };
  const Case cases[] = {{1, 0, 0},    {5, 0, 0},       {64, 0, 0},      {65, 0, 0},      {300, 0, 0},
                        {0, 0.7f, 0}, {0, 0.0f, 1.5f}, {0, 1.2f, 2.0f}, {37, 0.3f, 3.0f}};
  uint64_t seed = 500;
  for (const Case& c : cases)
    for (const auto& [hq, hkv, d] : {std::array<int, 3>{4, 2, 8}, std::array<int, 3>{3, 3, 5}}) {
      Problem p = make_problem({150, 1, 70, 9}, hq, hkv, d, ++seed, c.window, c.scale, c.softcap);
      SCOPED_TRACE(::testing::Message() << "window=" << c.window << " scale=" << c.scale << " softcap=" << c.softcap
                                        << " Hq=" << hq << " Hkv=" << hkv);
      expect_matches_reference(p);
    }
}

// Independent checks of the window's meaning: W = 1 leaves each query its own key (o = v of its
// KV head, dv = Σ of the group's dout); a window covering every sample is no window, to the bit.
TEST(Attention, WindowOfOneAttendsToItselfAndAWideWindowIsNone) {
  Problem p = make_problem({20, 3, 70}, 4, 2, 6, 91, 1);
  OpOut got = run_op(p);
  std::vector<float> want_o(p.q.size()), want_dv(p.v.size(), 0.0f);
  for (int64_t t = 0; t < p.T; ++t)
    for (int h = 0; h < 4; ++h)
      for (int c = 0; c < 6; ++c) {
        want_o[(t * 4 + h) * 6 + c] = p.v[(t * 2 + h / 2) * 6 + c];
        want_dv[(t * 2 + h / 2) * 6 + c] += p.dout[(t * 4 + h) * 6 + c];
      }
  EXPECT_TRUE(all_close(got.o, want_o, test::kTolF32));
  EXPECT_TRUE(all_close(got.dv, want_dv, test::kTolF32));
  for (float x : got.dq) EXPECT_NEAR(x, 0.0f, 1e-6f);  // softmax over one key: no score gradient
  Problem wide = make_problem({20, 3, 70}, 4, 2, 6, 91, 70), none = make_problem({20, 3, 70}, 4, 2, 6, 91);
  OpOut a = run_op(wide), b = run_op(none);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
  Problem narrower = make_problem({20, 3, 70}, 4, 2, 6, 91, 69);  // one key fewer for the last row
  EXPECT_NE(run_op(narrower).o, b.o);
}

TEST(Attention, BackwardMatchesFiniteDifferencesInF64) {
  Problem p = make_problem({3, 1, 4}, 4, 2, 3, 77);
  auto q = test::to_double(p.q), k = test::to_double(p.k), v = test::to_double(p.v), dout = test::to_double(p.dout);
  // L = Σ dout · out, so dL/dx is what attention_backward returns for that dout.
  auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk, const std::vector<double>& vv) {
    auto o = reference(p, qq, kk, vv, dout).o;
    return std::inner_product(o.begin(), o.end(), dout.begin(), 0.0);
  };
  auto gq = test::finite_diff_grad([&](const std::vector<double>& x) { return loss(x, k, v); }, q);
  auto gk = test::finite_diff_grad([&](const std::vector<double>& x) { return loss(q, x, v); }, k);
  auto gv = test::finite_diff_grad([&](const std::vector<double>& x) { return loss(q, k, x); }, v);
  OpOut got = run_op(p);
  EXPECT_TRUE(all_close(test::to_double(got.dq), gq, {1e-5, 1e-4}));
  EXPECT_TRUE(all_close(test::to_double(got.dk), gk, {1e-5, 1e-4}));
  EXPECT_TRUE(all_close(test::to_double(got.dv), gv, {1e-5, 1e-4}));
}

TEST(Attention, NoAttentionCrossesSamples) {
  // Changing sample 2 (q, k, v and its upstream gradient) leaves sample 1 bit-identical.
  Problem a = make_problem({70, 33, 5}, 4, 2, 8, 5);
  Problem b = a;
  const int64_t cq = 4 * 8, ckv = 2 * 8, s2 = a.cu[1], e2 = a.cu[2];
  for (int64_t t = s2; t < e2; ++t) {
    for (int64_t c = 0; c < ckv; ++c) b.k[t * ckv + c] += 0.5f, b.v[t * ckv + c] -= 0.25f;
    for (int64_t c = 0; c < cq; ++c) b.q[t * cq + c] *= 1.5f, b.dout[t * cq + c] += 0.3f;
  }
  OpOut ra = run_op(a), rb = run_op(b);
  auto rows = [](const std::vector<float>& x, int64_t cols, int64_t r0, int64_t r1) {
    return std::vector<float>(x.begin() + r0 * cols, x.begin() + r1 * cols);
  };
  for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, s2}, {e2, a.T}}) {
    EXPECT_EQ(rows(ra.o, cq, r0, r1), rows(rb.o, cq, r0, r1));
    EXPECT_EQ(rows(ra.dq, cq, r0, r1), rows(rb.dq, cq, r0, r1));
    EXPECT_EQ(rows(ra.dk, ckv, r0, r1), rows(rb.dk, ckv, r0, r1));
    EXPECT_EQ(rows(ra.dv, ckv, r0, r1), rows(rb.dv, ckv, r0, r1));
  }
  EXPECT_NE(rows(ra.o, cq, s2, e2), rows(rb.o, cq, s2, e2));  // the change did reach sample 2
}

class AttentionEveryCpuVariant : public test::PerKernelVariant {};

TEST_P(AttentionEveryCpuVariant, BlockedKernelsMatchThePlainKernels) {
  // Head dims 64, 128 and odd ones; GQA ratios 3 (SmolLM), 7 (Qwen2.5), 2 and 1 (partial dk/dv
  // buffers or direct writes); samples of length 1, exactly one block, one past a block, not a
  // multiple of the block, and many short samples (blocks smaller than the 64-row block).
  const std::vector<std::vector<int32_t>> packs = {
      {1, 64, 65, 200}, {3, 1, 17, 1, 40, 2, 63, 5, 1, 9, 30, 1, 11}, {129}};
  const std::vector<std::array<int, 3>> shapes = {{9, 3, 64}, {14, 2, 64}, {4, 2, 128}, {4, 4, 5}, {2, 1, 33}};
  uint64_t seed = 13;
  for (const auto& lengths : packs)
    for (auto [hq, hkv, d] : shapes) {
      Problem p = make_problem(lengths, hq, hkv, d, ++seed);
      SCOPED_TRACE(::testing::Message() << "samples=" << lengths.size() << " T=" << p.T << " Hq=" << hq
                                        << " Hkv=" << hkv << " d=" << d);
      cpu::AttentionDims dims{p.T, int64_t(lengths.size()), hq, hkv, d};
      // Every shape once plainly, then with a window (short, a block plus one) and a scale / soft cap.
      const int64_t windows[] = {0, 3, 0, 65, 0};
      dims.window = windows[seed % 5];
      dims.softcap = seed % 3 == 0 ? 2.5f : 0.0f;
      dims.scale = seed % 4 == 1 ? 0.2f : 0.0f;
      SCOPED_TRACE(::testing::Message() << "window=" << dims.window << " softcap=" << dims.softcap
                                        << " scale=" << dims.scale);
      const size_t nq = p.q.size(), nkv = p.k.size(), nl = size_t(hq * p.T);
      std::vector<float> o1(nq), o2(nq), l1(nl), l2(nl), dl(nl), dq1(nq, NAN), dq2(nq), dk1(nkv, NAN), dk2(nkv),
          dv1(nkv, NAN), dv2(nkv);
      cpu::attention_forward(p.q.data(), p.k.data(), p.v.data(), p.cu.data(), dims, o1.data(), nullptr, l1.data());
      cpu::attention_forward_plain(p.q.data(), p.k.data(), p.v.data(), p.cu.data(), dims, o2.data(), l2.data());
      EXPECT_TRUE(all_close(o1, o2, test::kTolF32));
      EXPECT_TRUE(all_close(l1, l2, test::kTolF32));
      cpu::attention_backward(p.dout.data(), p.q.data(), p.k.data(), p.v.data(), o1.data(), l1.data(), p.cu.data(),
                              dims, dl.data(), dq1.data(), dk1.data(), dv1.data(), nullptr);
      cpu::attention_backward_plain(p.dout.data(), p.q.data(), p.k.data(), p.v.data(), o1.data(), l1.data(),
                                    p.cu.data(), dims, dl.data(), dq2.data(), dk2.data(), dv2.data());
      EXPECT_TRUE(all_close(dq1, dq2, kTolGrad));
      EXPECT_TRUE(all_close(dk1, dk2, kTolGrad));
      EXPECT_TRUE(all_close(dv1, dv2, kTolGrad));
    }
}
BP_PER_KERNEL_VARIANT(AttentionEveryCpuVariant);

// o's bf16 copy (o_proj's GEMM operand on a card: ops/linear.h x_bf16): each value the
// nearest-even rounding of o; o unchanged by asking for it.
TEST(Attention, Bf16CopyIsTheRoundedOutput) {
  const Problem p = make_problem({37, 1, 90}, 4, 2, 24, 71);
  const int64_t cq = int64_t{p.shape.n_heads} * p.shape.head_dim, ckv = int64_t{p.shape.n_kv_heads} * p.shape.head_dim;
  const Tensor q = Tensor::from_vector(p.q, {p.T, cq}), k = Tensor::from_vector(p.k, {p.T, ckv}),
               v = Tensor::from_vector(p.v, {p.T, ckv}), cu = Tensor::from_vector(p.cu, {int64_t(p.cu.size())});
  Tensor o16;
  const Tensor o = attention_forward(q, k, v, cu, p.shape, nullptr, &o16);
  EXPECT_EQ(o.to_vector(), attention_forward(q, k, v, cu, p.shape, nullptr).to_vector());
  test::expect_bf16_copy_of(o16, o, "o");
}

// dv's bf16 copy (v_proj's dy on a card: ops/linear.h dy_bf16): each value the nearest-even
// rounding of dv; dq, dk, dv unchanged by asking for it. Grouped heads (dv summed over the group's
// partials before it is rounded) and one head per KV head.
TEST(Attention, BackwardBf16CopyIsTheRoundedDv) {
  for (const int hkv : {2, 4}) {
    const Problem p = make_problem({37, 1, 90}, 4, hkv, 24, 73);
    const int64_t cq = int64_t{p.shape.n_heads} * p.shape.head_dim,
                  ckv = int64_t{p.shape.n_kv_heads} * p.shape.head_dim;
    const Tensor q = Tensor::from_vector(p.q, {p.T, cq}), k = Tensor::from_vector(p.k, {p.T, ckv}),
                 v = Tensor::from_vector(p.v, {p.T, ckv}), cu = Tensor::from_vector(p.cu, {int64_t(p.cu.size())}),
                 dout = Tensor::from_vector(p.dout, {p.T, cq});
    Tensor lse;
    const Tensor o = attention_forward(q, k, v, cu, p.shape, &lse);
    auto grads = [&](Tensor* dv16) {
      std::array<Tensor, 3> g{Tensor::empty({p.T, cq}), Tensor::empty({p.T, ckv}), Tensor::empty({p.T, ckv})};
      attention_backward(dout, q, k, v, o, lse, cu, p.shape, g[0], g[1], g[2], dv16);
      return g;
    };
    Tensor dv16;
    const auto with = grads(&dv16), without = grads(nullptr);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(with[i].to_vector(), without[i].to_vector()) << "gradient " << i;
    test::expect_bf16_copy_of(dv16, with[2], "dv, Hkv = " + std::to_string(hkv));
  }
}

TEST(Attention, LseOutputIsReusedOrReallocated) {
  Problem p = make_problem({3, 5}, 2, 1, 4, 17);
  Tensor q = Tensor::from_vector(p.q, {8, 8}), k = Tensor::from_vector(p.k, {8, 4}),
         v = Tensor::from_vector(p.v, {8, 4});
  Tensor cu = Tensor::from_vector(p.cu, {3});
  Tensor lse = Tensor::zeros({2, 8});
  const void* storage = lse.raw();
  attention_forward(q, k, v, cu, p.shape, &lse);
  EXPECT_EQ(lse.raw(), storage);         // right shape: written in place
  Tensor stale = Tensor::zeros({2, 5});  // from a step with another token count
  attention_forward(q, k, v, cu, p.shape, &stale);
  EXPECT_EQ(stale.shape(), Shape({2, 8}));
  EXPECT_EQ(stale.to_vector(), lse.to_vector());
}

TEST(Attention, DeterministicAcrossRunsAndThreadCounts) {
  // The blocked kernels call sgemm inside OpenMP regions (per-task GEMMs on the calling thread)
  // and sum the per-query-head partial dk/dv in a fixed order: 1, 2 and 3 threads must give the
  // same bits. Shapes: GQA 3 with head_dim 64 (partials) and GQA 1 (direct writes).
  for (auto [hq, hkv, d] : {std::array<int, 3>{9, 3, 64}, std::array<int, 3>{4, 4, 16}}) {
    Problem p = make_problem({100, 157, 1, 64}, hq, hkv, d, 9);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    OpOut a = run_op(p);
    for (int n : {2, 3}) {
      omp_set_num_threads(n);
      OpOut b = run_op(p);
      SCOPED_TRACE(::testing::Message() << n << " threads, Hq=" << hq << " Hkv=" << hkv);
      EXPECT_EQ(a.o, b.o);
      EXPECT_EQ(a.lse, b.lse);
      EXPECT_EQ(a.dq, b.dq);
      EXPECT_EQ(a.dk, b.dk);
      EXPECT_EQ(a.dv, b.dv);
    }
    omp_set_num_threads(threads);
    EXPECT_EQ(run_op(p).dk, a.dk);  // and across runs
  }
}

// One 1024-token sample (T² floats would be 4 MiB per head) through forward and backward: the op
// may only allocate its outputs, lse, the [Hq, T] delta scratch, [64 × block_keys] score blocks per
// thread (one forward, two backward) and, with grouped heads, per-query-head partial dk/dv
// ([T, Hq·d] each); the scratch functions count the same.
void expect_linear_allocations(int hq, int hkv, int d, int window, size_t block_keys) {
  Problem p = make_problem({1024}, hq, hkv, d, 3, window);
  Tensor q = Tensor::from_vector(p.q, {p.T, hq * d}), k = Tensor::from_vector(p.k, {p.T, hkv * d}),
         v = Tensor::from_vector(p.v, {p.T, hkv * d}), dout = Tensor::from_vector(p.dout, {p.T, hq * d});
  Tensor cu = Tensor::from_vector(p.cu, {2});
  Allocator& a = cpu_allocator();
  size_t before = a.stats().bytes_in_use;
  a.reset_peak();
  Tensor lse;
  Tensor o = attention_forward(q, k, v, cu, p.shape, &lse);
  const size_t threads = size_t(omp_get_max_threads()), block = 64 * block_keys * sizeof(float);
  EXPECT_EQ(size_t(attention_forward_scratch_floats(p.T, p.shape, int(threads))) * sizeof(float), threads * block);
  EXPECT_EQ(a.stats().bytes_peak - before, o.nbytes() + lse.nbytes() + threads * block);
  Tensor dq = Tensor::empty({p.T, hq * d}), dk = Tensor::empty({p.T, hkv * d}), dv = Tensor::empty({p.T, hkv * d});
  before = a.stats().bytes_in_use;
  a.reset_peak();
  attention_backward(dout, q, k, v, o, lse, cu, p.shape, dq, dk, dv);
  const size_t partials = hq > hkv ? 2 * size_t(p.T) * hq * d * sizeof(float) : 0;
  EXPECT_EQ(size_t(attention_backward_scratch_floats(p.T, p.shape, int(threads))) * sizeof(float),
            2 * threads * block + partials);
  EXPECT_EQ(a.stats().bytes_peak - before, size_t(hq * p.T * 4) + 2 * threads * block + partials);
}

TEST(Attention, MemoryGrowsLinearlyNotWithTheSquareOfTheLength) {
  expect_linear_allocations(2, 1, 8, 0, 1024);
}

// With a window of 16, a 64-row block sees at most 64 + 15 keys: score blocks of [64 × 79].
TEST(Attention, WindowBoundsTheScratch) {
  expect_linear_allocations(2, 2, 8, 16, 64 + 15);
  expect_linear_allocations(2, 1, 8, 16, 64 + 15);  // and with partial dk/dv
}

TEST(Attention, MatchesTorchOracle) {
  for (auto [hq, hkv] : {std::pair{4, 2}}) {  // ratios 1 and 4 are covered by the reference test
    Problem p = make_problem({7, 1, 70, 33}, hq, hkv, 16, 40 + hkv);
    test::TempDir dir;
    test::write_raw(dir.path + "/q.f32", p.q);
    test::write_raw(dir.path + "/k.f32", p.k);
    test::write_raw(dir.path + "/v.f32", p.v);
    test::write_raw(dir.path + "/dout.f32", p.dout);
    test::write_raw(dir.path + "/cu_seqlens.i32", p.cu);
    auto res = test::run_torch_oracle("attention", dir.path,
                                      {{"tokens", p.T}, {"n_heads", hq}, {"n_kv_heads", hkv}, {"head_dim", 16}});
    ASSERT_FALSE(res.is_null());
    OpOut got = run_op(p);
    SCOPED_TRACE(::testing::Message() << "Hq=" << hq << " Hkv=" << hkv);
    EXPECT_TRUE(all_close(got.o, test::read_raw_f32(dir.path + "/out.out.f32"), test::kTolF32));
    EXPECT_TRUE(all_close(got.lse, test::read_raw_f32(dir.path + "/lse.out.f32"), test::kTolF32));
    EXPECT_TRUE(all_close(got.dq, test::read_raw_f32(dir.path + "/dq.out.f32"), kTolGrad));
    EXPECT_TRUE(all_close(got.dk, test::read_raw_f32(dir.path + "/dk.out.f32"), kTolGrad));
    EXPECT_TRUE(all_close(got.dv, test::read_raw_f32(dir.path + "/dv.out.f32"), kTolGrad));
  }
}

TEST(Attention, RejectsBadSeqlensAndShapes) {
  Problem p = make_problem({4, 4}, 2, 1, 4, 1);
  Tensor q = Tensor::from_vector(p.q, {8, 8}), k = Tensor::from_vector(p.k, {8, 4}),
         v = Tensor::from_vector(p.v, {8, 4});
  auto expect_code = [&](std::vector<int32_t> cu, ErrorCode code, const std::string& needle) {
    try {
      attention_forward(q, k, v, Tensor::from_vector(cu, {int64_t(cu.size())}), p.shape, nullptr);
      ADD_FAILURE() << "accepted cu_seqlens ending " << cu.back();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_code({0, 4, 7}, ErrorCode::INPUT_VALIDATION_FAILED, "token count 8");
  expect_code({1, 4, 8}, ErrorCode::INPUT_VALIDATION_FAILED, "got 1 and 8");
  expect_code({0, 5, 4, 8}, ErrorCode::INPUT_VALIDATION_FAILED, "decreases at sample 1");
  try {
    attention_forward(q, k, v, Tensor::from_vector(p.cu, {3}), {2, 2, 4}, nullptr);
    FAIL() << "k with 1 kv head accepted as 2";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_INTERNAL);
    EXPECT_NE(std::string(e.what()).find("k must be f32 [8, 8]"), std::string::npos) << e.what();
  }
  try {
    attention_forward(q, k, v, Tensor::from_vector(p.cu, {3}), {3, 2, 4}, nullptr);
    FAIL() << "3 heads over 2 kv heads accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_INTERNAL);
  }
  for (const AttentionShape& bad :
       {AttentionShape{2, 1, 4, -1}, AttentionShape{2, 1, 4, 0, -0.5f}, AttentionShape{2, 1, 4, 0, 0.0f, NAN}}) {
    try {
      attention_forward(q, k, v, Tensor::from_vector(p.cu, {3}), bad, nullptr);
      ADD_FAILURE() << "accepted window " << bad.window << ", scale " << bad.scale << ", softcap " << bad.softcap;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
      EXPECT_NE(std::string(e.what()).find("window, scale and softcap"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace bp
