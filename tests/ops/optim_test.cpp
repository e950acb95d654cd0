// AdamW, global gradient norm / clipping and non-finite detection against plain double
// references, and a short AdamW trajectory against torch.optim.AdamW (tests/oracles/torch_ops.py).
#include "ops/optim.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "op_test_util.h"
#include "support/finite_diff_b.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::all_close;
using test::random_vector;

// The AdamW formula of ops/optim.h in double.
void adamw_reference(std::vector<double>& p, const std::vector<double>& g, std::vector<double>& m,
                     std::vector<double>& v, const AdamWConfig& c, int64_t t) {
  const double b1 = c.beta1, b2 = c.beta2;
  for (size_t i = 0; i < p.size(); ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    const double mh = m[i] / (1 - std::pow(b1, static_cast<double>(t)));
    const double vh = v[i] / (1 - std::pow(b2, static_cast<double>(t)));
    p[i] = p[i] - double(c.lr) * c.weight_decay * p[i] - double(c.lr) * mh / (std::sqrt(vh) + c.eps);
  }
}

class AdamWEveryCpuVariant : public test::PerKernelVariant {};

TEST_P(AdamWEveryCpuVariant, MatchesDoubleReferenceOverSeveralStepsAtOddSizes) {
  for (int64_t n : {1, 31, 32, 33, 257}) {
    AdamWConfig cfg{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    Tensor p = test::random_tensor({n}, 1 + n), m = Tensor::zeros({n}), v = Tensor::zeros({n});
    auto pr = test::to_double(p.to_vector());
    std::vector<double> mr(n, 0.0), vr(n, 0.0);
    for (int64_t t = 1; t <= 4; ++t) {
      Tensor g = test::random_tensor({n}, 100 * n + t);
      adamw_step(p, g, m, v, cfg, t);
      adamw_reference(pr, test::to_double(g.to_vector()), mr, vr, cfg, t);
    }
    EXPECT_TRUE(all_close(test::to_double(p.to_vector()), pr, {1e-6, 1e-5})) << "n=" << n;
    EXPECT_TRUE(all_close(test::to_double(m.to_vector()), mr, {1e-6, 1e-5})) << "n=" << n;
    EXPECT_TRUE(all_close(test::to_double(v.to_vector()), vr, {1e-7, 1e-5})) << "n=" << n;
  }
}
BP_PER_KERNEL_VARIANT(AdamWEveryCpuVariant);

TEST(AdamW, FirstStepMovesEachWeightByAboutLr) {
  // With bias correction, step 1 gives m̂/sqrt(v̂) = sign(g): every weight moves by ~lr.
  AdamWConfig cfg{.lr = 0.5f};
  Tensor p = Tensor::zeros({3}), m = Tensor::zeros({3}), v = Tensor::zeros({3});
  Tensor g = Tensor::from_vector(std::vector<float>{2.0f, -0.001f, 30.0f}, {3});
  adamw_step(p, g, m, v, cfg, 1);
  EXPECT_TRUE(all_close(p.to_vector(), {-0.5f, 0.5f, -0.5f}, {1e-4, 1e-4}));
}

TEST(AdamW, MatchesTorchOptimAdamWTrajectory) {
  test::TempDir dir;
  const int64_t n = 257;
  auto p0 = random_vector(n, 11), g = random_vector(n, 12, -2.0f, 2.0f);
  test::write_raw(dir.path + "/param.f32", p0);
  test::write_raw(dir.path + "/grad.f32", g);
  AdamWConfig cfg{.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
  const int steps = 5;
  auto res = test::run_torch_oracle("adamw", dir.path,
                                    {{"numel", n},
                                     {"lr", cfg.lr},
                                     {"beta1", cfg.beta1},
                                     {"beta2", cfg.beta2},
                                     {"eps", cfg.eps},
                                     {"weight_decay", cfg.weight_decay},
                                     {"steps", steps}});
  ASSERT_FALSE(res.is_null());
  Tensor p = Tensor::from_vector(p0, {n}), gt = Tensor::from_vector(g, {n});
  Tensor m = Tensor::zeros({n}), v = Tensor::zeros({n});
  for (int t = 1; t <= steps; ++t) adamw_step(p, gt, m, v, cfg, t);
  // Same f32 operation order as PyTorch: agreement to a couple of ulps.
  EXPECT_TRUE(all_close(p.to_vector(), test::read_raw_f32(dir.path + "/param.out.f32"), {1e-7, 1e-6}));
  EXPECT_TRUE(all_close(m.to_vector(), test::read_raw_f32(dir.path + "/m.out.f32"), {1e-7, 1e-6}));
  EXPECT_TRUE(all_close(v.to_vector(), test::read_raw_f32(dir.path + "/v.out.f32"), {1e-9, 1e-6}));
}

TEST(AdamW, RejectsBadArguments) {
  Tensor p = Tensor::zeros({4}), g = Tensor::zeros({4}), m = Tensor::zeros({4}), v = Tensor::zeros({4});
  Tensor small = Tensor::zeros({3});
  try {
    adamw_step(p, g, m, v, {}, 0);
    FAIL() << "step 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
    EXPECT_NE(std::string(e.what()).find("got 0"), std::string::npos) << e.what();
  }
  try {
    adamw_step(p, g, m, v, {.beta1 = 1.0f}, 1);
    FAIL() << "beta1 = 1 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
  }
  try {
    adamw_step(p, small, m, v, {}, 1);
    FAIL() << "shape mismatch accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_INTERNAL);
    EXPECT_NE(std::string(e.what()).find("[3]"), std::string::npos) << e.what();
  }
}

TEST(GradNorm, MatchesDoubleReferenceAcrossTensors) {
  std::vector<Tensor> gs;
  double ref = 0;
  for (int64_t n : {1, 31, 257, 33}) {
    gs.push_back(test::random_tensor({n}, 7 * n));
    for (float x : gs.back().to_vector()) ref += double(x) * x;
  }
  std::vector<const Tensor*> ptrs;
  for (auto& t : gs) ptrs.push_back(&t);
  EXPECT_NEAR(global_grad_norm(ptrs), std::sqrt(ref), 1e-12 * std::sqrt(ref));
  EXPECT_EQ(global_grad_norm({}), 0.0);
}

TEST(GradNorm, ClipScalesOnlyAboveMaxNorm) {
  Tensor a = Tensor::from_vector(std::vector<float>{3.0f, 0.0f}, {2});
  Tensor b = Tensor::from_vector(std::vector<float>{4.0f}, {1});  // norm 5
  EXPECT_DOUBLE_EQ(clip_grad_norm({&a, &b}, 10.0), 5.0);
  EXPECT_EQ(a.to_vector()[0], 3.0f);  // untouched below the limit
  EXPECT_DOUBLE_EQ(clip_grad_norm({&a, &b}, 1.0), 5.0);
  EXPECT_TRUE(all_close(a.to_vector(), {0.6f, 0.0f}, test::kTolF32));
  EXPECT_TRUE(all_close(b.to_vector(), {0.8f}, test::kTolF32));
  EXPECT_NEAR(global_grad_norm({&a, &b}), 1.0, 1e-6);
  try {
    clip_grad_norm({&a}, 0.0);
    FAIL() << "max_norm 0 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::INPUT_VALIDATION_FAILED);
  }
}

TEST(GradNorm, NonFiniteGradientGivesNonFiniteNormAndIsNotSpread) {
  Tensor a = test::random_tensor({33}, 5);
  Tensor b = test::random_tensor({31}, 6);
  a.data<float>()[17] = std::numeric_limits<float>::quiet_NaN();
  const auto b_before = b.to_vector();
  EXPECT_FALSE(std::isfinite(clip_grad_norm({&a, &b}, 1e-3)));
  EXPECT_EQ(b.to_vector(), b_before);
  a.data<float>()[17] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(std::isfinite(global_grad_norm({&a})));
}

TEST(AllFinite, FindsNanAndInfAnywhereInEveryFloatType) {
  for (int64_t n : {1, 31, 257}) {
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()}) {
        for (int64_t pos : {int64_t{0}, n / 2, n - 1}) {
          auto vals = random_vector(n, 3 + n, -100.0f, 100.0f);
          EXPECT_TRUE(all_finite(Tensor::from_vector(vals, {n}).to(dt)));
          vals[pos] = bad;
          EXPECT_FALSE(all_finite(Tensor::from_vector(vals, {n}).to(dt)))
              << dtype_name(dt) << " n=" << n << " pos=" << pos << " value=" << bad;
        }
      }
    }
  }
  // Large finite values are finite.
  EXPECT_TRUE(all_finite(Tensor::from_vector(std::vector<float>{3.0e38f, -3.0e38f}, {2})));
}

TEST(Optim, LargeTensorsTakeTheParallelPathWithTheSameResults) {
  const int64_t n = 100003;  // above the kernels' parallel threshold
  AdamWConfig cfg{.lr = 1e-3f, .weight_decay = 0.05f};
  Tensor p = test::random_tensor({n}, 21), g = test::random_tensor({n}, 22);
  Tensor m = Tensor::zeros({n}), v = Tensor::zeros({n});
  auto pr = test::to_double(p.to_vector());
  std::vector<double> mr(n, 0.0), vr(n, 0.0);
  adamw_step(p, g, m, v, cfg, 1);
  adamw_reference(pr, test::to_double(g.to_vector()), mr, vr, cfg, 1);
  EXPECT_TRUE(all_close(test::to_double(p.to_vector()), pr, {1e-6, 1e-5}));
  double ref = 0;
  for (float x : g.to_vector()) ref += double(x) * x;
  EXPECT_NEAR(global_grad_norm({&g}), std::sqrt(ref), 1e-10 * std::sqrt(ref));
  // Bit-identical whatever the thread count (clipping must not make resumed runs diverge).
  const double norm_all = global_grad_norm({&g});
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const double norm_one = global_grad_norm({&g});
  omp_set_num_threads(threads);
  EXPECT_EQ(norm_all, norm_one);
  EXPECT_TRUE(all_finite(g));
  g.data<float>()[n - 1] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(all_finite(g));
}

// A parameter's bf16 GEMM copy (full fine-tuning, training.matmul_dtype bf16) is rewritten by the
// update itself: bit for bit the nearest-even rounding of the updated parameter, in every chunk of
// a tensor above the parallel threshold; the parameter and moments are exactly an update without a
// copy's; a tensor without one in the same list is untouched; a copy of another shape or type is
// refused before anything is written.
TEST(Optim, AdamwRewritesAParametersBf16GemmCopyFromTheUpdatedValues) {
  const int64_t n = 100003;  // several chunks, the parallel path
  AdamWConfig cfg{.lr = 1e-2f, .weight_decay = 0.05f};
  Tensor p = test::random_tensor({n}, 31), g = test::random_tensor({n}, 32);
  Tensor m = Tensor::zeros({n}), v = Tensor::zeros({n});
  Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
  Tensor q = test::random_tensor({7, 5}, 33), gq = test::random_tensor({7, 5}, 34);
  Tensor mq = Tensor::zeros({7, 5}), vq = Tensor::zeros({7, 5});
  Tensor copy = Tensor::zeros({n}, DType::BF16);
  for (int64_t t = 1; t <= 3; ++t) {
    adamw_step({{&p, &g, &m, &v, &copy}, {&q, &gq, &mq, &vq}}, cfg, t);
    adamw_step(p2, g, m2, v2, cfg, t);
  }
  EXPECT_EQ(p.to_vector(), p2.to_vector());
  EXPECT_EQ(m.to_vector(), m2.to_vector());
  EXPECT_EQ(v.to_vector(), v2.to_vector());
  const float* pd = p.data<float>();
  const uint16_t* cd = copy.data<uint16_t>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += cd[i] != f32_to_bf16(pd[i]);
  EXPECT_EQ(wrong, 0) << "elements of the copy that are not bf16(updated parameter)";
  EXPECT_NE(copy.to(DType::F32).to_vector(), Tensor::zeros({n}).to_vector());

  Tensor wrong_shape = Tensor::zeros({n - 1}, DType::BF16), wrong_type = Tensor::zeros({n}, DType::F16);
  const auto before = p.to_vector();
  for (Tensor* bad : {&wrong_shape, &wrong_type}) {
    try {
      adamw_step({{&p, &g, &m, &v, bad}}, cfg, 4);
      ADD_FAILURE() << "a mismatched GEMM copy was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gemm_copy"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(p.to_vector(), before) << "a refused update wrote the parameter";
}

}  // namespace
}  // namespace bp
