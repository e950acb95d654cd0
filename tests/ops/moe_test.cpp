// Mixture-of-Experts ops (ops/moe.h) against plain float64 references written here from the formulas
// (Hugging Face's softmax -> top-k -> renormalise routing, transformers' load_balancing_loss_func):
// odd sizes, tied router probabilities, the backward passes against central finite differences in
// f64 of the reference forward, and the whole sparse MLP (gather, one GEMM per expert's block,
// weighted scatter) against a per-token loop over the chosen experts.
#include "ops/moe.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "support/test_util.h"

namespace bp {
namespace {

using Vec = std::vector<double>;

Vec softmax(const float* l, int64_t E) {
  Vec p(static_cast<size_t>(E));
  double mx = l[0], s = 0;
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(l[e]));
  for (int64_t e = 0; e < E; ++e) s += p[static_cast<size_t>(e)] = std::exp(l[e] - mx);
  for (double& v : p) v /= s;
  return p;
}

// The reference routing of one token: ids by decreasing probability (stable: lower index on ties).
std::pair<std::vector<int>, Vec> route_ref(const float* l, int64_t E, int64_t k, bool renorm) {
  const Vec p = softmax(l, E);
  std::vector<int> idx(static_cast<size_t>(E));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int a, int b) { return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)]; });
  idx.resize(static_cast<size_t>(k));
  Vec w;
  double s = 0;
  for (int e : idx) s += p[static_cast<size_t>(e)];
  for (int e : idx) w.push_back(p[static_cast<size_t>(e)] / (renorm ? s : 1.0));
  return {idx, w};
}

TEST(Moe, RoutingMatchesSoftmaxTopkRenormalise) {
  for (const auto& [T, E, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 4, 2}, {31, 7, 3}, {33, 8, 1}, {5, 5, 5}}) {
    for (const bool renorm : {true, false}) {
      SCOPED_TRACE(testing::Message() << "T " << T << " E " << E << " k " << k << " renorm " << renorm);
      Tensor logits = test::random_tensor({T, E}, static_cast<uint64_t>(T * 10 + E), -2.0f, 2.0f);
      float* l = logits.data<float>();
      if (T > 3) {  // ties: token 2's experts 1 and 3 equal, token 3 all equal
        l[2 * E + 3] = l[2 * E + 1];
        for (int64_t e = 0; e < E; ++e) l[3 * E + e] = 0.25f;
      }
      const MoeRouting r = moe_route_forward(logits, k, renorm);
      for (int64_t t = 0; t < T; ++t) {
        const auto [ids, w] = route_ref(l + t * E, E, k, renorm);
        for (int64_t j = 0; j < k; ++j) {
          EXPECT_EQ(r.expert_ids.data<int32_t>()[t * k + j], ids[static_cast<size_t>(j)]) << "t " << t << " j " << j;
          EXPECT_NEAR(r.weights.data<float>()[t * k + j], w[static_cast<size_t>(j)], 1e-6) << "t " << t;
        }
      }
      if (T > 3) {  // all equal: experts 0..k-1 in order
        for (int64_t j = 0; j < k; ++j) EXPECT_EQ(r.expert_ids.data<int32_t>()[3 * k + j], j);
      }
    }
  }
}

// d(Σ_j c_tj·w_tj + Σ_e g_e·Σ_t p_te)/d logits by central differences of the reference in f64.
TEST(Moe, RoutingBackwardMatchesFiniteDifferences) {
  const int64_t T = 9, E = 6, k = 2;
  for (const bool renorm : {true, false}) {
    const Tensor logits = test::random_tensor({T, E}, renorm ? 3 : 4, -1.5f, 1.5f);
    const Tensor dw = test::random_tensor({T, k}, 5);
    const Tensor aux = test::random_tensor({E}, 6);
    const MoeRouting r = moe_route_forward(logits, k, renorm);
    Tensor dlogits = Tensor::empty({T, E});
    moe_route_backward(logits, r.expert_ids, dw, &aux, renorm, dlogits);
    const int32_t* ids = r.expert_ids.data<int32_t>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) {
        // The chosen experts stay fixed (top-k is piecewise constant): the loss of fixed ids.
        auto loss = [&](double h) {
          std::vector<float> row(logits.data<float>() + t * E, logits.data<float>() + (t + 1) * E);
          std::vector<double> l(row.begin(), row.end());
          l[static_cast<size_t>(e)] += h;
          double mx = *std::max_element(l.begin(), l.end()), s = 0;
          Vec p(static_cast<size_t>(E));
          for (int64_t i = 0; i < E; ++i) s += p[static_cast<size_t>(i)] = std::exp(l[static_cast<size_t>(i)] - mx);
          for (double& v : p) v /= s;
          double S = 0, out = 0;
          for (int64_t j = 0; j < k; ++j) S += p[static_cast<size_t>(ids[t * k + j])];
          for (int64_t j = 0; j < k; ++j)
            out += dw.data<float>()[t * k + j] * p[static_cast<size_t>(ids[t * k + j])] / (renorm ? S : 1.0);
          for (int64_t i = 0; i < E; ++i) out += aux.data<float>()[i] * p[static_cast<size_t>(i)];
          return out;
        };
        const double h = 1e-5, fd = (loss(h) - loss(-h)) / (2 * h);
        EXPECT_NEAR(dlogits.data<float>()[t * E + e], fd, 2e-6 + 1e-4 * std::fabs(fd)) << "t " << t << " e " << e;
      }
  }
}

TEST(Moe, SortGatherScatterAndTheirBackwards) {
  const int64_t T = 33, E = 5, k = 3, D = 7;
  const Tensor logits = test::random_tensor({T, E}, 8);
  const MoeRouting r = moe_route_forward(logits, k, true);
  const MoeDispatch d = moe_sort(r.expert_ids, E);
  ASSERT_EQ(d.host_offsets.front(), 0);
  ASSERT_EQ(d.host_offsets.back(), T * k);
  const int32_t* ids = r.expert_ids.data<int32_t>();
  const int32_t* slot = d.slot_of.data<int32_t>();
  const int32_t* tok = d.row_token.data<int32_t>();
  std::vector<int> seen(static_cast<size_t>(T * k), 0);
  for (int64_t a = 0; a < T * k; ++a) {
    const int32_t row = slot[a];
    ++seen[static_cast<size_t>(row)];
    EXPECT_EQ(tok[row], a / k);
    EXPECT_GE(row, d.host_offsets[static_cast<size_t>(ids[a])]);  // inside its expert's block
    EXPECT_LT(row, d.host_offsets[static_cast<size_t>(ids[a]) + 1]);
  }
  for (int v : seen) EXPECT_EQ(v, 1);    // a permutation
  for (int64_t i = 1; i < T * k; ++i) {  // stable: tokens ascend within a block
    const bool block_start = std::find(d.host_offsets.begin(), d.host_offsets.end(), i) != d.host_offsets.end();
    if (!block_start) {
      EXPECT_GT(tok[i], tok[i - 1]) << "row " << i;
    }
  }

  const Tensor x = test::random_tensor({T, D}, 9);
  const Tensor xs = moe_gather_forward(x, d);
  for (int64_t i = 0; i < T * k; ++i)
    for (int64_t c = 0; c < D; ++c) EXPECT_EQ(xs.data<float>()[i * D + c], x.data<float>()[tok[i] * D + c]);
  // Gather backward: dx[t] += Σ_j dxs[row of (t, j)].
  const Tensor dxs = test::random_tensor({T * k, D}, 10);
  Tensor dx = test::random_tensor({T, D}, 11);
  const std::vector<float> dx0 = dx.to_vector();
  moe_gather_backward(dxs, d, dx);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < D; ++c) {
      double ref = dx0[static_cast<size_t>(t * D + c)];
      for (int64_t j = 0; j < k; ++j) ref += dxs.data<float>()[slot[t * k + j] * D + c];
      EXPECT_NEAR(dx.data<float>()[t * D + c], ref, 1e-6);
    }
  // Scatter: out[t] += Σ_j w·ys[row]; backward dys = w·dout, dweights = ⟨dout, ys[row]⟩.
  const Tensor ys = test::random_tensor({T * k, D}, 12);
  Tensor out = test::random_tensor({T, D}, 13);
  const std::vector<float> out0 = out.to_vector();
  moe_scatter_forward(ys, r.weights, d, out);
  const Tensor dout = test::random_tensor({T, D}, 14);
  Tensor dys = Tensor::empty({T * k, D}), dwts = Tensor::empty({T, k});
  moe_scatter_backward(dout, ys, r.weights, d, dys, dwts);
  const float* w = r.weights.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < D; ++c) {
      double ref = out0[static_cast<size_t>(t * D + c)];
      for (int64_t j = 0; j < k; ++j)
        ref += static_cast<double>(w[t * k + j]) * ys.data<float>()[slot[t * k + j] * D + c];
      EXPECT_NEAR(out.data<float>()[t * D + c], ref, 1e-5);
    }
    for (int64_t j = 0; j < k; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < D; ++c) {
        dot += static_cast<double>(dout.data<float>()[t * D + c]) * ys.data<float>()[slot[t * k + j] * D + c];
        EXPECT_NEAR(dys.data<float>()[slot[t * k + j] * D + c], w[t * k + j] * dout.data<float>()[t * D + c], 1e-6);
      }
      EXPECT_NEAR(dwts.data<float>()[t * k + j], dot, 1e-5);
    }
  }
}

TEST(Moe, BadExpertIdIsRefused) {
  Tensor ids = Tensor::from_vector(std::vector<int32_t>{0, 1, 4, 2}, {2, 2});
  try {
    moe_sort(ids, 4);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_INTERNAL);
    EXPECT_NE(std::string(e.what()).find("expert id 4"), std::string::npos) << e.what();
  }
}

// load_balancing_loss_func over two layers' tokens concatenated: E · Σ_e f_e · P_e, written here
// as the reference does it (one-hot of the top-k, means over all tokens, summed over the k choices).
TEST(Moe, AuxLossMatchesLoadBalancingLossFunc) {
  const int64_t T = 17, E = 6, k = 2;
  Tensor counts = Tensor::zeros({E}), probs = Tensor::zeros({E});
  Vec f(static_cast<size_t>(E), 0.0), P(static_cast<size_t>(E), 0.0);
  for (uint64_t layer = 0; layer < 2; ++layer) {
    const Tensor logits = test::random_tensor({T, E}, 20 + layer, -2.0f, 2.0f);
    const MoeRouting r = moe_route_forward(logits, k, true);
    moe_aux_accumulate(logits, r.expert_ids, counts, probs);
    for (int64_t t = 0; t < T; ++t) {
      const auto [ids, w] = route_ref(logits.data<float>() + t * E, E, k, false);
      const Vec p = softmax(logits.data<float>() + t * E, E);
      for (int64_t e = 0; e < E; ++e) P[static_cast<size_t>(e)] += p[static_cast<size_t>(e)] / (2.0 * T);
      for (int e : ids) f[static_cast<size_t>(e)] += 1.0 / (2.0 * T);
    }
  }
  double ref = 0;
  for (int64_t e = 0; e < E; ++e) ref += f[static_cast<size_t>(e)] * P[static_cast<size_t>(e)];
  ref *= E;
  const double aux = moe_aux_loss(counts.to_vector(), probs.to_vector(), 2 * T);
  EXPECT_NEAR(aux, ref, 1e-6 * ref);
  EXPECT_GT(aux, 0.5 * k);  // about k for balanced routing (E · Σ (k/E)·(1/E) = k)
  // Its gradient per token's probability: coef · E · count_e / N².
  const std::vector<float> g = moe_aux_grad(counts.to_vector(), 2 * T, 0.5);
  for (int64_t e = 0; e < E; ++e)
    EXPECT_NEAR(g[static_cast<size_t>(e)], 0.5 * E * f[static_cast<size_t>(e)] / (2.0 * T), 1e-7);
}

}  // namespace
}  // namespace bp
