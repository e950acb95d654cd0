// Elementwise helpers against plain references at odd sizes, including sizes past the
// OpenMP threshold, and += semantics of the bias gradient.
#include "ops/elementwise.h"

#include <gtest/gtest.h>

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

TEST(Elementwise, ShapeMismatchIsAnInternalError) {
  Tensor y = random_tensor({3, 4}, 1), x = random_tensor({4, 3}, 2), b = random_tensor({3}, 3);
  test::expect_op_error([&] { add_inplace(y, x); }, ErrorCode::RUNTIME_INTERNAL, {"[add]", "[4, 3]", "[3, 4]"});
  test::expect_op_error([&] { add_bias_inplace(y, b); }, ErrorCode::RUNTIME_INTERNAL, {"[add_bias]", "[3]", "[4]"});
}

}  // namespace
}  // namespace bp
