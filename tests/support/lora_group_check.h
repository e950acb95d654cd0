// A LoRA input group (ops/linear.h lora_group_forward / lora_group_backward) against its members
// alone: shared by the CPU test (tests/ops/linear_test.cpp), the simulated card's
// (tests/cuda/cuda_dispatch_test.cpp) and a real card's (tests/cuda_device/dispatch_device_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ops/linear.h"
#include "support/f32_bound.h"
#include "support/test_util.h"

namespace bp::test {

// Projections of one x [T, in] with outputs `outs` (the first with a bias), LoRA ranks `ranks` and
// random A, B, dy and accumulated dA/dB: run as a group on `dev` (A and dA rows of one tensor, x's
// products one GEMM each, or with dropout p > 0 one call of the dropout kernels each, every member
// with its own mask seed), and each alone on the CPU (linear_forward / linear_backward with that
// member's seed, checked against double references in linear_test.cpp). y, dx, dA and dB must
// agree within the f32 bound of their sums (test_util.h f32_sum_bound), or within `tol` where it is
// wider than f32's (a real card's rounded GEMM inputs).
inline void expect_lora_group_matches_projections_alone(Device dev, int64_t T, int64_t in,
                                                        const std::vector<int64_t>& outs,
                                                        const std::vector<int64_t>& ranks, uint64_t seed,
                                                        Tolerance tol = kTolF32, float p = 0.0f) {
  const size_t n = outs.size();
  std::string where = "T=" + std::to_string(T) + " in=" + std::to_string(in) + " p=" + std::to_string(p) + " r=";
  std::vector<int64_t> first_row;  // each member's first row of A_all
  int64_t R = 0;
  for (int64_t r : ranks) {
    where += std::to_string(r) + ",";
    first_row.push_back(R);
    R += r;
  }
  Tensor x = random_tensor({T, in}, seed);
  if (T > 0 && in > 0) x.data<float>()[0] = 0.0f;  // an exact zero: dropped or kept, it adds nothing
  const Tensor bias = random_tensor({outs[0]}, seed + 1);
  const Tensor A_all_host = random_tensor({R, in}, seed + 2), dA0 = random_tensor({R, in}, seed + 3);
  std::vector<Tensor> W, B, dy, dB0;
  for (size_t i = 0; i < n; ++i) {
    W.push_back(random_tensor({outs[i], in}, seed + 10 + i));
    B.push_back(random_tensor({outs[i], ranks[i]}, seed + 20 + i));
    dy.push_back(random_tensor({T, outs[i]}, seed + 30 + i));
    dB0.push_back(random_tensor({outs[i], ranks[i]}, seed + 40 + i));
  }
  const auto mask_seed = [&](size_t i) { return seed * 31 + 7 * i + 1; };
  const auto lora_of = [&](const Tensor* A, const Tensor* Bi, size_t i) {
    LoraWeights l;
    l.A = A;
    l.B = Bi;
    l.scale = 0.625f;
    l.dropout = p;
    l.dropout_seed = mask_seed(i);
    return l;
  };
  LoraGroupDropout dropout{p, {}};
  for (size_t i = 0; i < n; ++i) dropout.members.push_back({ranks[i], mask_seed(i)});

  // Each projection alone, on the CPU, on the given inputs: y, dx, dA and dB.
  struct AloneResults {
    std::vector<Tensor> y, dA, dB;
    Tensor dx;
  };
  const auto alone_on_cpu = [&](const Tensor& xs, const Tensor& bias_s, const Tensor& A_s, const Tensor& dA0_s,
                                const std::vector<Tensor>& W_s, const std::vector<Tensor>& B_s,
                                const std::vector<Tensor>& dy_s, const std::vector<Tensor>& dB0_s) {
    AloneResults r;
    std::vector<Tensor> A_cpu;
    std::vector<LinearSaved> saved_cpu(n);
    r.dx = Tensor::empty({T, in});
    for (size_t i = 0; i < n; ++i) {
      const int64_t row = first_row[i];
      A_cpu.push_back(A_s.rows(row, row + ranks[i]).clone());
      r.dA.push_back(dA0_s.rows(row, row + ranks[i]).clone());
      r.dB.push_back(dB0_s[i].clone());
    }
    for (size_t i = 0; i < n; ++i) {
      const LoraWeights l = lora_of(&A_cpu[i], &B_s[i], i);
      r.y.push_back(linear_forward(xs, W_s[i], i == 0 ? &bias_s : nullptr, &l, &saved_cpu[i]));
    }
    for (size_t i = 0; i < n; ++i) {
      const LoraWeights l = lora_of(&A_cpu[i], &B_s[i], i);
      LinearGrads g{&r.dx, nullptr, nullptr, &r.dA[i], &r.dB[i], i > 0};
      linear_backward(dy_s[i], xs, W_s[i], &l, &saved_cpu[i], g);
    }
    return r;
  };
  const AloneResults cpu = alone_on_cpu(x, bias, A_all_host, dA0, W, B, dy, dB0);
  // The same on the inputs' absolute values: every value's Σ|terms| (test_util.h f32_sum_bound; a
  // dropout mask's 0 or 1/(1-p) is non-negative too). K: the longest chain of additions, through
  // x·A (in), the B products (R), dy·B (out), the sums over the tokens (T) and the accumulated
  // dA/dB/dx and bias (a few).
  const auto abs_of = [](const Tensor& t) {
    std::vector<float> v = t.to_vector();
    for (float& f : v) f = std::fabs(f);
    return Tensor::from_vector(v, t.shape());
  };
  const auto abs_all = [&](const std::vector<Tensor>& ts) {
    std::vector<Tensor> out;
    for (const Tensor& t : ts) out.push_back(abs_of(t));
    return out;
  };
  const AloneResults mag = alone_on_cpu(abs_of(x), abs_of(bias), abs_of(A_all_host), abs_of(dA0), abs_all(W),
                                        abs_all(B), abs_all(dy), abs_all(dB0));
  int64_t max_out = 0;
  for (int64_t o : outs) max_out = std::max(max_out, o);
  const double K = static_cast<double>(in + R + T + static_cast<int64_t>(n) * max_out + 4);

  // The group on `dev`.
  const Tensor xd = x.to(dev), bias_d = bias.to(dev), A_all = A_all_host.to(dev);
  Tensor dA_all = dA0.to(dev);
  std::vector<Tensor> A_d, W_d, B_d, dy_d, dB_d, y_d;
  std::vector<LoraWeights> lw(n);
  std::vector<LinearSaved> saved(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t row = first_row[i];
    A_d.push_back(A_all.rows(row, row + ranks[i]));
    W_d.push_back(W[i].to(dev));
    B_d.push_back(B[i].to(dev));
    dy_d.push_back(dy[i].to(dev));
    dB_d.push_back(dB0[i].to(dev));
  }
  std::vector<const Tensor*> parts;
  for (const Tensor& a : A_d) parts.push_back(&a);
  ASSERT_TRUE(Tensor::joined_rows(parts).defined()) << where;
  Tensor xa_all = lora_group_forward(xd, Tensor::joined_rows(parts), &dropout);
  ASSERT_EQ(xa_all.shape(), (Shape{T, R})) << where;
  for (size_t i = 0; i < n; ++i) {
    lw[i] = lora_of(&A_d[i], &B_d[i], i);
    lw[i].group_xa = &xa_all;
    lw[i].group_col = first_row[i];
    y_d.push_back(linear_forward(xd, W_d[i], i == 0 ? &bias_d : nullptr, &lw[i], &saved[i]));
  }
  xa_all = Tensor();  // the members' saved columns keep it
  Tensor dx = Tensor::empty({T, in}, DType::F32, dev), dxa_all = Tensor::empty({T, R}, DType::F32, dev);
  for (size_t i = 0; i < n; ++i) {
    lw[i].group_xa = nullptr;
    lw[i].group_dxa = &dxa_all;
    LinearGrads g{&dx, nullptr, nullptr, nullptr, &dB_d[i], i > 0};
    linear_backward(dy_d[i], xd, W_d[i], &lw[i], &saved[i], g);
  }
  lora_group_backward(xd, A_all, dxa_all, &dA_all, &dx, &dropout);

  // y, dB and dx: within the f32 bound, or within `tol` on a card whose GEMMs round their inputs
  // (a wider tol than f32's); dA is summed in f32 everywhere.
  const bool f32_card = tol.atol <= kTolF32.atol && tol.rtol <= kTolF32.rtol;
  const auto expect_close = [&](const Tensor& got, const Tensor& ref, const Tensor& magnitude, bool f32_sums,
                                const std::string& what) {
    if (f32_sums)
      EXPECT_TRUE(within_f32_sum_bound(got.to_vector(), ref.to_vector(), magnitude.to_vector(), K)) << what << where;
    else
      EXPECT_TRUE(all_close(got.to_vector(), ref.to_vector(), tol)) << what << where;
  };
  for (size_t i = 0; i < n; ++i) {
    const int64_t row = first_row[i];
    const std::string member = std::to_string(i) + " ";
    expect_close(y_d[i], cpu.y[i], mag.y[i], f32_card, "y" + member);
    expect_close(dB_d[i], cpu.dB[i], mag.dB[i], f32_card, "dB" + member);
    expect_close(dA_all.rows(row, row + ranks[i]), cpu.dA[i], mag.dA[i], true, "dA" + member);
  }
  expect_close(dx, cpu.dx, mag.dx, f32_card, "dx ");
}

// q/k/v-like (three members, grouped-query outputs) and gate/up-like (two) groups at odd sizes,
// r = 1 and past 8, T = 1, in = 1; with dropout too (p = 0.1 and 0.5; members of unequal ranks,
// past one 64-rank chunk; T = 300 splits the card's dA over the tokens).
inline void expect_lora_groups_match_projections_alone(Device dev, Tolerance tol = kTolF32) {
  expect_lora_group_matches_projections_alone(dev, 31, 45, {33, 17, 17}, {3, 3, 3}, 900, tol);
  expect_lora_group_matches_projections_alone(dev, 1, 33, {65, 65}, {1, 1}, 910, tol);
  expect_lora_group_matches_projections_alone(dev, 257, 32, {31, 1, 257}, {9, 9, 9}, 920, tol);
  expect_lora_group_matches_projections_alone(dev, 33, 1, {7, 7}, {2, 2}, 930, tol);
  expect_lora_group_matches_projections_alone(dev, 31, 45, {33, 17, 17}, {3, 3, 3}, 940, tol, 0.1f);
  expect_lora_group_matches_projections_alone(dev, 300, 40, {31, 1, 20}, {9, 70, 2}, 950, tol, 0.5f);
  expect_lora_group_matches_projections_alone(dev, 1, 33, {65, 65}, {16, 16}, 960, tol, 0.1f);
}

}  // namespace bp::test
