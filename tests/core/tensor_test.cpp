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

TEST(Tensor, DtypeConversionRoundTrips) {
  Tensor t = test::random_tensor({33}, 2);
  Tensor b = t.to(DType::BF16);
  EXPECT_EQ(b.nbytes(), 66u);
  EXPECT_TRUE(test::all_close(b.to(DType::F32).to_vector(), t.to_vector(), test::kTolBF16));
  EXPECT_TRUE(test::all_close(t.to(DType::F16).to_vector(), t.to_vector(), test::kTolF16));
  EXPECT_THROW(t.data<int32_t>(), Error);
}

}  // namespace bp
