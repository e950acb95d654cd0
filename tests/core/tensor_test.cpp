#include "core/tensor.h"

#include "support/test_util.h"

namespace bp {

TEST(Tensor, ShapeViewsAndCopies) {
  Tensor t = test::random_tensor({5, 3}, 1);
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.describe(), "f32[5, 3] on CPU");
  Tensor r = t.rows(2, 4);
  EXPECT_EQ(r.shape(), Shape({2, 3}));
  EXPECT_EQ(r.data<float>(), t.data<float>() + 6);  // a view, not a copy
  Tensor c = r.clone();
  c.data<float>()[0] = 42.0f;
  EXPECT_NE(t.data<float>()[6], 42.0f);
  EXPECT_EQ(t.reshape({15}).dim(0), 15);
  EXPECT_THROW(t.reshape({4, 4}), Error);
  EXPECT_THROW(t.rows(3, 6), Error);
}

// joined_rows: consecutive row views of one storage, in order, are one view (no copy); a gap, the
// wrong order, another storage, another width or a missing part are not.
TEST(Tensor, JoinedRowsIsTheViewOfConsecutiveRowRanges) {
  Tensor t = test::random_tensor({7, 3}, 3);
  Tensor a = t.rows(1, 3), b = t.rows(3, 4), c = t.rows(4, 7);
  std::vector<const Tensor*> abc = {&a, &b, &c};
  Tensor j = Tensor::joined_rows(abc);
  ASSERT_TRUE(j.defined());
  EXPECT_EQ(j.shape(), Shape({6, 3}));
  EXPECT_EQ(j.data<float>(), t.data<float>() + 3);
  const std::vector<const Tensor*> one = {&b};
  EXPECT_EQ(Tensor::joined_rows(one).data<float>(), b.data<float>());
  const Tensor other = b.clone(), wide = test::random_tensor({7, 4}, 4).rows(3, 4), gap = t.rows(5, 7);
  for (const std::vector<const Tensor*>& bad :
       std::vector<std::vector<const Tensor*>>{{&b, &a}, {&a, &other}, {&a, &wide}, {&a, &gap}, {&a, nullptr}, {}})
    EXPECT_FALSE(Tensor::joined_rows(bad).defined());
}

TEST(Tensor, DtypeConversionRoundTrips) {
  Tensor t = test::random_tensor({33}, 2);
  Tensor b = t.to(DType::BF16);
  EXPECT_EQ(b.nbytes(), 66u);
  EXPECT_TRUE(test::all_close(b.to(DType::F32).to_vector(), t.to_vector(), test::kTolBF16));
  EXPECT_TRUE(test::all_close(t.to(DType::F16).to_vector(), t.to_vector(), test::kTolF16));
  EXPECT_THROW(t.data<int32_t>(), Error);
}

}  // namespace bp
