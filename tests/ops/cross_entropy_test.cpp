// Fused linear + cross-entropy against a plain double reference written here (full logits),
// finite differences in f64, the PyTorch oracle, and the allocator's measured peak.
#include "ops/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "op_test_util.h"
#include "support/f32_cpu_gemms.h"
#include "support/finite_diff_b.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::all_close;

struct RefCE {
  double loss_sum = 0;
  int64_t n_counted = 0;
  std::vector<double> dx, dW;  // gradients of grad_scale · loss_sum
};

// Plain reference: full [T × V] logits in double, softmax per row. softcap > 0: the logits are
// softcap·tanh(logits/softcap) (Gemma 2's final_logit_softcapping); the gradients then are not
// computed here (finite differences of the loss check them).
RefCE reference_ce(const std::vector<double>& x, const std::vector<double>& W, const std::vector<int32_t>& labels,
                   int64_t T, int64_t D, int64_t V, double grad_scale, double softcap = 0.0) {
  RefCE r;
  r.dx.assign(static_cast<size_t>(T * D), 0.0);
  r.dW.assign(static_cast<size_t>(V * D), 0.0);
  std::vector<double> logits(static_cast<size_t>(V));
  for (int64_t t = 0; t < T; ++t) {
    if (labels[t] == -100) continue;
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += x[t * D + d] * W[v * D + d];
      logits[v] = softcap > 0 ? softcap * std::tanh(s / softcap) : s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(logits[v] - mx);
    const double lse = mx + std::log(sum);
    r.loss_sum += lse - logits[labels[t]];
    r.n_counted++;
    for (int64_t v = 0; v < V; ++v) {
      const double g = grad_scale * (std::exp(logits[v] - lse) - (v == labels[t] ? 1.0 : 0.0));
      for (int64_t d = 0; d < D; ++d) {
        r.dx[t * D + d] += g * W[v * D + d];
        r.dW[v * D + d] += g * x[t * D + d];
      }
    }
  }
  return r;
}

// Labels with runs of −100 (like prompt masking) and scattered ignored tokens.
std::vector<int32_t> random_labels(int64_t T, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> l(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    const bool in_prompt = (t / 11) % 3 == 0;
    l[t] = (in_prompt || rng() % 5 == 0) ? -100 : static_cast<int32_t>(rng() % V);
  }
  if (T > 2) l[static_cast<size_t>(T - 1)] = static_cast<int32_t>(V - 1);
  return l;
}

std::vector<float> as_vec(const Tensor& t) {
  return t.to_vector();
}

class CrossEntropyEveryCpuVariant : public test::PerKernelVariant {};

TEST_P(CrossEntropyEveryCpuVariant, MatchesReferenceAtOddSizesAndChunks) {
  const int64_t D = 19, V = 37;
  for (int64_t T : {1, 31, 32, 33, 257}) {
    for (int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{32}, kDefaultCrossEntropyChunk}) {
      Tensor x = test::random_tensor({T, D}, 10 + T, -2, 2), W = test::random_tensor({V, D}, 20 + T, -1, 1);
      auto labels = random_labels(T, V, 30 + T);
      if (T == 1) labels[0] = 5;
      Tensor lab = Tensor::from_vector(labels, {T});
      const float scale = 1.0f / 7.0f;
      auto ref = reference_ce(test::to_double(as_vec(x)), test::to_double(as_vec(W)), labels, T, D, V, scale);
      Tensor dx = Tensor::empty({T, D});
      dx.fill(std::numeric_limits<float>::quiet_NaN());  // overwritten, never read
      Tensor dW = test::random_tensor({V, D}, 40);       // accumulated into
      auto dW0 = test::to_double(as_vec(dW));
      auto res = linear_cross_entropy_forward_backward(x, W, lab, scale, dx, &dW, chunk);
      SCOPED_TRACE("T=" + std::to_string(T) + " chunk=" + std::to_string(chunk));
      EXPECT_EQ(res.n_counted, ref.n_counted);
      EXPECT_NEAR(res.loss_sum, ref.loss_sum, 1e-5 * std::max(1.0, ref.loss_sum));
      EXPECT_TRUE(all_close(as_vec(dx), test::to_float(ref.dx), test::kTolF32));
      for (size_t i = 0; i < dW0.size(); ++i) ref.dW[i] += dW0[i];
      EXPECT_TRUE(all_close(as_vec(dW), test::to_float(ref.dW), test::kTolF32));
      // Loss-only evaluation gives the same loss; no dW means the frozen-head path.
      auto fwd = linear_cross_entropy_forward(x, W, lab, chunk);
      EXPECT_NEAR(fwd.loss_sum, res.loss_sum, 1e-6 * std::max(1.0, ref.loss_sum));
      EXPECT_EQ(fwd.n_counted, res.n_counted);
      Tensor dx2 = Tensor::empty({T, D});
      linear_cross_entropy_forward_backward(x, W, lab, scale, dx2, nullptr, chunk);
      EXPECT_EQ(as_vec(dx2), as_vec(dx));
    }
  }
}
BP_PER_KERNEL_VARIANT(CrossEntropyEveryCpuVariant);

TEST(CrossEntropy, StableForLargeLogitGaps) {
  // Logit gaps of hundreds: a naive exp overflows, a clamped exp would cap the loss.
  const int64_t T = 5, D = 4, V = 9;
  Tensor x = test::random_tensor({T, D}, 1, -30, 30), W = test::random_tensor({V, D}, 2, -3, 3);
  std::vector<int32_t> labels{0, 3, 8, -100, 4};
  auto ref = reference_ce(test::to_double(as_vec(x)), test::to_double(as_vec(W)), labels, T, D, V, 1.0);
  Tensor dx = Tensor::empty({T, D});
  auto res = linear_cross_entropy_forward_backward(x, W, Tensor::from_vector(labels, {T}), 1.0f, dx, nullptr, 2);
  EXPECT_TRUE(std::isfinite(res.loss_sum));
  EXPECT_NEAR(res.loss_sum, ref.loss_sum, 1e-5 * std::max(1.0, ref.loss_sum));
  EXPECT_TRUE(all_close(as_vec(dx), test::to_float(ref.dx), {1e-4, 1e-5}));
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferencesInF64) {
  const int64_t T = 6, D = 3, V = 7;
  const double scale = 0.25;
  Tensor x = test::random_tensor({T, D}, 3), W = test::random_tensor({V, D}, 4);
  std::vector<int32_t> labels{1, -100, 6, 0, 2, -100};
  auto xd = test::to_double(as_vec(x)), Wd = test::to_double(as_vec(W));
  auto gx = test::finite_diff_grad(
      [&](const std::vector<double>& xv) { return scale * reference_ce(xv, Wd, labels, T, D, V, 0).loss_sum; }, xd);
  auto gW = test::finite_diff_grad(
      [&](const std::vector<double>& wv) { return scale * reference_ce(xd, wv, labels, T, D, V, 0).loss_sum; }, Wd);
  Tensor dx = Tensor::empty({T, D}), dW = Tensor::zeros({V, D});
  linear_cross_entropy_forward_backward(x, W, Tensor::from_vector(labels, {T}), static_cast<float>(scale), dx, &dW, 4);
  EXPECT_TRUE(all_close(test::to_double(as_vec(dx)), gx, {1e-6, 1e-5}));
  EXPECT_TRUE(all_close(test::to_double(as_vec(dW)), gW, {1e-6, 1e-5}));
}

TEST(CrossEntropy, FinalLogitSoftcapMatchesReferenceAndFiniteDifferences) {
  const int64_t T = 9, D = 5, V = 11;
  const double scale = 0.5, cap = 3.0;  // logits up to ~10: the cap bends them
  Tensor x = test::random_tensor({T, D}, 13, -2.0f, 2.0f), W = test::random_tensor({V, D}, 14, -1.0f, 1.0f);
  const std::vector<int32_t> labels{1, -100, 6, 0, 2, -100, 10, 3, 4};
  const Tensor lab = Tensor::from_vector(labels, {T});
  auto xd = test::to_double(as_vec(x)), Wd = test::to_double(as_vec(W));
  const RefCE ref = reference_ce(xd, Wd, labels, T, D, V, 0, cap);
  const RefCE plain = reference_ce(xd, Wd, labels, T, D, V, 0);
  ASSERT_GT(std::fabs(ref.loss_sum - plain.loss_sum), 0.1);  // the cap matters here
  auto gx = test::finite_diff_grad(
      [&](const std::vector<double>& xv) { return scale * reference_ce(xv, Wd, labels, T, D, V, 0, cap).loss_sum; },
      xd);
  auto gW = test::finite_diff_grad(
      [&](const std::vector<double>& wv) { return scale * reference_ce(xd, wv, labels, T, D, V, 0, cap).loss_sum; },
      Wd);
  Tensor dx = Tensor::empty({T, D}), dW = Tensor::zeros({V, D});
  const auto r =
      linear_cross_entropy_forward_backward(x, W, lab, static_cast<float>(scale), dx, &dW, 4, static_cast<float>(cap));
  EXPECT_NEAR(r.loss_sum, ref.loss_sum, 1e-5 * std::fabs(ref.loss_sum));
  EXPECT_NEAR(linear_cross_entropy_forward(x, W, lab, 2, static_cast<float>(cap)).loss_sum, ref.loss_sum,
              1e-5 * std::fabs(ref.loss_sum));
  EXPECT_TRUE(all_close(test::to_double(as_vec(dx)), gx, {1e-6, 1e-5}));
  EXPECT_TRUE(all_close(test::to_double(as_vec(dW)), gW, {1e-6, 1e-5}));
  // The full logits (generation) are capped the same way.
  const auto logits = lm_head_logits(x, W, static_cast<float>(cap)).to_vector();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += xd[t * D + d] * Wd[v * D + d];
      EXPECT_NEAR(logits[t * V + v], cap * std::tanh(s / cap), 1e-5);
    }
  test::expect_op_error([&] { linear_cross_entropy_forward(x, W, lab, 4, -1.0f); }, ErrorCode::INPUT_VALIDATION_FAILED,
                        {"softcap"});
}

TEST(CrossEntropy, AllIgnoredGivesZeroLossAndZeroGradients) {
  const int64_t T = 33, D = 8, V = 17;
  Tensor x = test::random_tensor({T, D}, 5), W = test::random_tensor({V, D}, 6);
  Tensor lab = Tensor::from_vector(std::vector<int32_t>(T, -100), {T});
  Tensor dx = Tensor::empty({T, D});
  dx.fill(std::numeric_limits<float>::quiet_NaN());
  Tensor dW = test::random_tensor({V, D}, 7);
  const auto dW_before = as_vec(dW);
  auto res = linear_cross_entropy_forward_backward(x, W, lab, 1.0f, dx, &dW, 8);
  EXPECT_EQ(res.n_counted, 0);
  EXPECT_EQ(res.loss_sum, 0.0);
  EXPECT_EQ(res.mean(), 0.0);
  EXPECT_EQ(as_vec(dx), std::vector<float>(T * D, 0.0f));
  EXPECT_EQ(as_vec(dW), dW_before);
}

// A trainable head read through its bf16 GEMM copy (training.matmul_dtype bf16): loss and dx are
// those of the rounded head, dW (the f32 master's gradient, added to what it held) is
// grad_scale·(softmax − onehot)ᵀ·x of those logits, against the double reference over the rounded
// values; chunks smaller than T. A head held in another type (f16) is still refused a gradient.
TEST(CrossEntropy, Bf16GemmCopyOfATrainableHeadGetsTheMastersGradient) {
  // The f64 oracle multiplies the unrounded x: the f32 path (the bf16 path's rounding is
  // HeldBf16Head's, tests/ops/held_bf16_gemm_test.cpp).
  const test::F32CpuGemms f32_gemms;
  const int64_t T = 37, D = 24, V = 53;
  const Tensor x = test::random_tensor({T, D}, 81), W = test::random_tensor({V, D}, 82);
  const Tensor copy = W.to(DType::BF16);
  const auto labels = random_labels(T, V, 83);
  const Tensor lab = Tensor::from_vector(labels, {T});
  const auto xv = as_vec(x), wv = as_vec(copy.to(DType::F32));
  const RefCE ref = reference_ce(std::vector<double>(xv.begin(), xv.end()), std::vector<double>(wv.begin(), wv.end()),
                                 labels, T, D, V, 0.125);
  Tensor dx = Tensor::empty({T, D}), dW = test::random_tensor({V, D}, 84);
  const auto prior = as_vec(dW);
  const auto res = linear_cross_entropy_forward_backward(x, copy, lab, 0.125f, dx, &dW, 8);
  EXPECT_EQ(res.n_counted, ref.n_counted);
  EXPECT_NEAR(res.loss_sum, ref.loss_sum, 1e-5 * std::fabs(ref.loss_sum));
  std::vector<double> want(prior.begin(), prior.end());
  for (size_t i = 0; i < want.size(); ++i) want[i] += ref.dW[i];
  const auto got_dW = as_vec(dW), got_dx = as_vec(dx);
  EXPECT_TRUE(all_close(std::vector<double>(got_dW.begin(), got_dW.end()), want, {1e-5, 1e-5}));
  EXPECT_TRUE(all_close(std::vector<double>(got_dx.begin(), got_dx.end()), ref.dx, {1e-5, 1e-5}));
  Tensor dW_q = Tensor::zeros({V, D});
  EXPECT_THROW(linear_cross_entropy_forward_backward(x, W.to(DType::F16), lab, 1.0f, dx, &dW_q, 8), Error);
}

TEST(CrossEntropy, RejectsLabelsOutsideTheVocabulary) {
  const int64_t T = 4, D = 3, V = 10;
  Tensor x = test::random_tensor({T, D}, 8), W = test::random_tensor({V, D}, 9);
  for (int32_t bad : {10, -1, -101}) {
    Tensor lab = Tensor::from_vector(std::vector<int32_t>{1, 2, bad, 3}, {T});
    try {
      linear_cross_entropy_forward(x, W, lab);
      FAIL() << "label " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("token 2"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[0, 10)"), std::string::npos) << msg;
    }
  }
  try {
    linear_cross_entropy_forward(x, test::random_tensor({V, D + 1}, 1),
                                 Tensor::from_vector(std::vector<int32_t>(T, 0), {T}));
    FAIL() << "D mismatch accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_INTERNAL);
    EXPECT_NE(std::string(e.what()).find("x has 3 columns but W has 4"), std::string::npos) << e.what();
  }
  try {
    linear_cross_entropy_forward(x, W, Tensor::from_vector(std::vector<int32_t>(T, 0), {T}), 0);
    FAIL() << "chunk 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
  }
}

TEST(CrossEntropy, WorkspaceIsOneChunkAndMatchesTheAllocatorPeak) {
  const int64_t T = 257, D = 16, V = 5003, chunk = 32;
  Tensor x = test::random_tensor({T, D}, 10), W = test::random_tensor({V, D}, 11, -0.1f, 0.1f);
  std::vector<int32_t> labels(T);
  for (int64_t t = 0; t < T; ++t) labels[t] = static_cast<int32_t>((t * 131) % V);
  Tensor lab = Tensor::from_vector(labels, {T});
  Tensor dx = Tensor::empty({T, D}), dW = Tensor::zeros({V, D});
  const size_t planned = linear_cross_entropy_workspace_bytes(T, V, chunk);
  EXPECT_EQ(planned, size_t(chunk * V * 4));
  EXPECT_LE(planned * 8, size_t(T * V * 4));  // far from the full logits
  for (int pass = 0; pass < 2; ++pass) {
    Allocator& a = cpu_allocator();
    const size_t before = a.stats().bytes_in_use;
    a.reset_peak();
    if (pass == 0)
      linear_cross_entropy_forward_backward(x, W, lab, 1.0f / T, dx, &dW, chunk);
    else
      linear_cross_entropy_forward(x, W, lab, chunk);
    const MemoryStats s = a.stats();
    EXPECT_EQ(s.bytes_peak - before, planned) << "pass " << pass;
    EXPECT_EQ(s.bytes_in_use, before) << "pass " << pass;
  }
  EXPECT_EQ(linear_cross_entropy_workspace_bytes(5, V, chunk), size_t(5 * V * 4));  // short batch: T rows
}

// Spans of −100 labels (SFT prompts) cost no logits rows: the workspace is the longest window
// (from a labelled token, at most `chunk` rows, trimmed after its last labelled one).
TEST(CrossEntropy, IgnoredSpansCostNoWorkspaceRows) {
  const int64_t T = 300, D = 16, V = 5003, chunk = 64;
  Tensor x = test::random_tensor({T, D}, 20), W = test::random_tensor({V, D}, 21, -0.1f, 0.1f);
  std::vector<int32_t> labels(T, kIgnoreLabel);
  for (int64_t t = 100; t < 110; ++t) labels[t] = static_cast<int32_t>((t * 37) % V);  // window of 10
  for (int64_t t = 250; t < 299; ++t) labels[t] = static_cast<int32_t>((t * 53) % V);  // 49 (299 ignored)
  EXPECT_EQ(linear_cross_entropy_workspace_rows(labels.data(), T, chunk), 49);
  std::vector<int32_t> two = std::vector<int32_t>(T, kIgnoreLabel);
  two[100] = 1, two[150] = 2;  // one window spans the gap between them: 51 rows
  EXPECT_EQ(linear_cross_entropy_workspace_rows(two.data(), T, chunk), 51);
  EXPECT_EQ(linear_cross_entropy_workspace_rows(two.data(), T, 40), 1);  // 150 is past 100's window
  EXPECT_EQ(linear_cross_entropy_workspace_rows(std::vector<int32_t>(T, kIgnoreLabel).data(), T, chunk), 0);

  Tensor lab = Tensor::from_vector(labels, {T});
  Allocator& a = cpu_allocator();
  Tensor dx = Tensor::empty({T, D}), dx_one = Tensor::empty({T, D});
  const size_t before = a.stats().bytes_in_use;
  a.reset_peak();
  const auto r = linear_cross_entropy_forward_backward(x, W, lab, 0.5f, dx, nullptr, chunk);
  EXPECT_EQ(a.stats().bytes_peak - before, size_t(49 * V * 4));
  // The same loss and gradient as one window over every token.
  const auto one = linear_cross_entropy_forward_backward(x, W, lab, 0.5f, dx_one, nullptr, T);
  EXPECT_EQ(r.n_counted, 59);
  EXPECT_NEAR(r.loss_sum, one.loss_sum, 1e-6 * std::fabs(one.loss_sum));
  EXPECT_TRUE(all_close(dx.to_vector(), dx_one.to_vector(), test::kTolF32));
}

TEST(CrossEntropy, MatchesTorchOracle) {
  const int64_t T = 33, D = 24, V = 101;
  test::TempDir dir;
  auto x = test::random_vector(T * D, 50, -2, 2), W = test::random_vector(V * D, 51);
  auto labels = random_labels(T, V, 52);
  const float scale = 1.0f / 3.0f;
  test::write_raw(dir.path + "/x.f32", x);
  test::write_raw(dir.path + "/W.f32", W);
  test::write_raw(dir.path + "/labels.i32", labels);
  auto res = test::run_torch_oracle("cross_entropy", dir.path,
                                    {{"tokens", T}, {"dim", D}, {"vocab", V}, {"grad_scale", scale}});
  ASSERT_FALSE(res.is_null());
  Tensor dx = Tensor::empty({T, D}), dW = Tensor::zeros({V, D});
  auto ours = linear_cross_entropy_forward_backward(Tensor::from_vector(x, {T, D}), Tensor::from_vector(W, {V, D}),
                                                    Tensor::from_vector(labels, {T}), scale, dx, &dW, 8);
  EXPECT_EQ(ours.n_counted, res["n_counted"].get<int64_t>());
  const double loss = res["loss_sum"].get<double>();
  EXPECT_NEAR(ours.loss_sum, loss, 1e-5 * loss);
  EXPECT_TRUE(all_close(as_vec(dx), test::read_raw_f32(dir.path + "/dx.out.f32"), test::kTolF32));
  EXPECT_TRUE(all_close(as_vec(dW), test::read_raw_f32(dir.path + "/dW.out.f32"), test::kTolF32));
}

TEST(LmHead, LogitsMatchReference) {
  const int64_t T = 33, D = 7, V = 31;
  Tensor x = test::random_tensor({T, D}, 60), W = test::random_tensor({V, D}, 61);
  auto xv = as_vec(x), wv = as_vec(W);
  std::vector<float> ref(T * V);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d) s += double(xv[t * D + d]) * wv[v * D + d];
      ref[t * V + v] = static_cast<float>(s);
    }
  Tensor logits = lm_head_logits(x, W);
  EXPECT_EQ(logits.shape(), Shape({T, V}));
  EXPECT_TRUE(all_close(as_vec(logits), ref, test::kTolF32));
}

}  // namespace
}  // namespace bp
