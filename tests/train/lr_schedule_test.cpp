#include "train/lr_schedule.h"

#include <cmath>

#include "support/test_util.h"

namespace bp {

// Values worked out by hand from Hugging Face's schedule definitions.
TEST(LrSchedule, WarmupThenCosineLinearConstant) {
  const double lr = 1e-3;
  EXPECT_DOUBLE_EQ(lr_at_step(LrScheduler::Cosine, lr, 0, 10, 110), 0.0);  // HF: first warmup step is 0
  EXPECT_DOUBLE_EQ(lr_at_step(LrScheduler::Cosine, lr, 5, 10, 110), 5e-4);
  EXPECT_DOUBLE_EQ(lr_at_step(LrScheduler::Cosine, lr, 10, 10, 110), lr);
  EXPECT_NEAR(lr_at_step(LrScheduler::Cosine, lr, 60, 10, 110), 5e-4, 1e-15);  // half way: cos(pi/2)
  EXPECT_NEAR(lr_at_step(LrScheduler::Cosine, lr, 35, 10, 110), lr * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-15);
  EXPECT_NEAR(lr_at_step(LrScheduler::Cosine, lr, 110, 10, 110), 0.0, 1e-18);
  EXPECT_DOUBLE_EQ(lr_at_step(LrScheduler::Linear, lr, 60, 10, 110), 5e-4);
  EXPECT_DOUBLE_EQ(lr_at_step(LrScheduler::Linear, lr, 200, 10, 110), 0.0);
  EXPECT_DOUBLE_EQ(lr_at_step(LrScheduler::Constant, lr, 3, 10, 110), 3e-4);
  EXPECT_DOUBLE_EQ(lr_at_step(LrScheduler::Constant, lr, 50, 10, 110), lr);
  EXPECT_DOUBLE_EQ(lr_at_step(LrScheduler::Cosine, lr, 0, 0, 10), lr);  // no warmup
}

TEST(LrSchedule, ParseRejectsUnknown) {
  EXPECT_EQ(parse_lr_scheduler("linear"), LrScheduler::Linear);
  EXPECT_THROW(parse_lr_scheduler("polynomial"), Error);
}

}  // namespace bp
