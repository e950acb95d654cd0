// Elementwise helpers against plain references at odd sizes, including sizes past the
// OpenMP threshold, and += semantics of the bias gradient.
#include "ops/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>

#include "op_test_util.h"
#include "support/test_util.h"

namespace bp {
namespace {

using test::all_close;
using test::random_tensor;

const std::pair<int64_t, int64_t> kShapes[] = {{1, 1}, {1, 31}, {31, 32}, {33, 257}, {257, 33}, {257, 257}};

TEST(Elementwise, AddAxpyScaleMatchReference) {
  uint64_t seed = 1;
  for (auto [R, C] : kShapes) {
    Tensor y = random_tensor({R, C}, ++seed), x = random_tensor({R, C}, ++seed);
    const auto yv = y.to_vector(), xv = x.to_vector();
    std::vector<float> r_add(yv.size()), r_axpy(yv.size()), r_scale(yv.size());
    for (size_t i = 0; i < yv.size(); ++i) {
      r_add[i] = yv[i] + xv[i];
      r_axpy[i] = r_add[i] + -0.3f * xv[i];
      r_scale[i] = r_axpy[i] * 1.7f;
    }
    add_inplace(y, x);
    EXPECT_TRUE(all_close(y.to_vector(), r_add, {0, 0}));
    axpy_inplace(y, -0.3f, x);
    EXPECT_TRUE(all_close(y.to_vector(), r_axpy, {1e-7, 1e-6}));
    scale_inplace(y, 1.7f);
    EXPECT_TRUE(all_close(y.to_vector(), r_scale, {1e-7, 1e-6}));
  }
}

TEST(Elementwise, BiasAddAndBiasGradMatchReference) {
  uint64_t seed = 100;
  for (auto [T, N] : kShapes) {
    Tensor y = random_tensor({T, N}, ++seed), b = random_tensor({N}, ++seed);
    const auto yv = y.to_vector(), bv = b.to_vector();
    std::vector<float> ref(yv.size());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < N; ++j) ref[t * N + j] = yv[t * N + j] + bv[j];
    add_bias_inplace(y, b);
    EXPECT_TRUE(all_close(y.to_vector(), ref, {0, 0}));

    Tensor db = random_tensor({N}, ++seed);  // += onto an existing gradient
    std::vector<double> rdb(bv.size());
    const auto dbv = db.to_vector();
    for (int64_t j = 0; j < N; ++j) {
      double s = dbv[j];
      for (int64_t t = 0; t < T; ++t) s += yv[t * N + j];
      rdb[j] = s;
    }
    Tensor dy = Tensor::from_vector(yv, {T, N});
    bias_grad_accumulate(dy, db);
    const auto got = db.to_vector();
    EXPECT_TRUE(all_close(std::vector<double>(got.begin(), got.end()), rdb, {1e-5, 1e-5})) << T << "x" << N;
  }
}

// The bf16 GEMM copy of a trainable matrix (training.matmul_dtype, model/transformer.h): each value
// is the nearest bf16, ties to the even significand, checked against the bf16 grid itself (the two
// neighbours of the result are no closer) rather than against the kernel's bit trick.
TEST(Elementwise, RoundToBf16IsNearestEvenOnTheBf16Grid) {
  std::vector<float> v = {0.0f,      -0.0f,         1.0f,           1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -1.0f - 0x1p-8f,
                          0x1p-130f, 3.4028235e38f, -3.4028235e38f, INFINITY,       -INFINITY,          NAN};
  const size_t named = v.size();
  const Tensor r = random_tensor({5000}, 7);  // past the OpenMP threshold, magnitudes 2^-40 .. 2^40
  const auto rv = r.to_vector();
  for (size_t i = 0; i < rv.size(); ++i) v.push_back(std::ldexp(rv[i], static_cast<int>(i % 81) - 40));
  const Tensor src = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  Tensor dst = Tensor::empty(src.shape(), DType::BF16);
  round_to_bf16(src, dst);
  const uint16_t* b = dst.data<uint16_t>();
  auto f = [](uint32_t bits16) { return bf16_to_f32(static_cast<uint16_t>(bits16)); };
  EXPECT_EQ(f(b[3]), 1.0f) << "a tie goes to the even significand (down)";
  EXPECT_EQ(f(b[4]), 1.0f + 0x1p-6f) << "a tie goes to the even significand (up)";
  EXPECT_EQ(f(b[5]), -1.0f);
  EXPECT_EQ(f(b[7]), INFINITY) << "f32's largest value lies above bf16's largest and its midpoint";
  EXPECT_EQ(f(b[8]), -INFINITY);
  EXPECT_EQ(f(b[9]), INFINITY);
  EXPECT_EQ(f(b[10]), -INFINITY);
  EXPECT_TRUE(std::isnan(f(b[11])));
  EXPECT_EQ(std::signbit(f(b[1])), true);
  for (size_t i = 0; i < v.size(); ++i) {
    const double x = v[i], got = f(b[i]);
    if (!std::isfinite(x) || !std::isfinite(got)) continue;
    for (int step : {-1, 1}) {  // the neighbours on the bf16 grid (the sign bit stays)
      const uint32_t nb = static_cast<uint32_t>(b[i]) + static_cast<uint32_t>(step);
      if ((nb & 0x7fffu) == 0x7f80u || ((nb ^ b[i]) & 0x8000u)) continue;  // Inf, or across zero
      const double other = f(nb & 0xffffu);
      ASSERT_LE(std::fabs(x - got), std::fabs(x - other)) << "value " << i << " (" << v[i] << ")";
      if (std::fabs(x - got) == std::fabs(x - other)) {
        EXPECT_EQ(b[i] & 1u, 0u) << "tie to even at " << i;
      }
    }
  }
  EXPECT_GT(v.size(), named);
  Tensor wrong = Tensor::empty(src.shape(), DType::F32);
  EXPECT_THROW(round_to_bf16(src, wrong), Error);
  Tensor short_dst = Tensor::empty({3}, DType::BF16);
  EXPECT_THROW(round_to_bf16(src, short_dst), Error);
}

TEST(Elementwise, ShapeMismatchIsAnInternalError) {
  Tensor y = random_tensor({3, 4}, 1), x = random_tensor({4, 3}, 2), b = random_tensor({3}, 3);
  test::expect_op_error([&] { add_inplace(y, x); }, ErrorCode::RUNTIME_INTERNAL, {"[add]", "[4, 3]", "[3, 4]"});
  test::expect_op_error([&] { add_bias_inplace(y, b); }, ErrorCode::RUNTIME_INTERNAL, {"[add_bias]", "[3]", "[4]"});
}

}  // namespace
}  // namespace bp
