// The progress bar's tokens/s and ETA with injected times (issue 13: they were k/(k-1) too high).
#include "train/throughput.h"

#include <gtest/gtest.h>

namespace bp {

using namespace std::chrono_literals;

TEST(ThroughputMeter, RateCountsOnlyTokensProcessedAfterTheFirstUpdate) {
  ThroughputMeter m;
  const auto t0 = ThroughputMeter::Clock::time_point{} + 100s;
  ThroughputReading first = m.update(1, 64, 10, t0);  // step 1: 64 tokens, no time base yet
  EXPECT_EQ(first.tokens_per_s, 0);
  EXPECT_LT(first.eta_s, 0);
  // Step 2 takes 1 s for 64 tokens: 64 tok/s measured (the old bar showed 128).
  ThroughputReading second = m.update(2, 128, 10, t0 + 1s);
  EXPECT_DOUBLE_EQ(second.tokens_per_s, 64.0);
  EXPECT_DOUBLE_EQ(second.eta_s, 8.0);  // 1 s per step, 8 steps left
  // Steps 3 and 4: 32 and 96 tokens in 2 s and 1 s more: (32 + 96 + 64) tokens / 4 s.
  m.update(3, 160, 10, t0 + 3s);
  ThroughputReading fourth = m.update(4, 256, 10, t0 + 4s);
  EXPECT_DOUBLE_EQ(fourth.tokens_per_s, 192.0 / 4.0);
  EXPECT_DOUBLE_EQ(fourth.eta_s, 4.0 / 3.0 * 6.0);
  ThroughputReading last = m.update(10, 640, 10, t0 + 10s);
  EXPECT_DOUBLE_EQ(last.eta_s, 0.0);
  ThroughputMeter one_step;
  EXPECT_EQ(one_step.update(1, 64, 1, t0).eta_s, 0.0);  // a one-step run ends with nothing left
}

// A resumed run starts counting at its first step, with the tokens of the earlier run excluded.
TEST(ThroughputMeter, ResumedRunMeasuresFromItsFirstStep) {
  ThroughputMeter m;
  const auto t0 = ThroughputMeter::Clock::time_point{} + 5s;
  m.update(7, 7 * 50, 20, t0);
  ThroughputReading r = m.update(9, 9 * 50, 20, t0 + 4s);
  EXPECT_DOUBLE_EQ(r.tokens_per_s, 100.0 / 4.0);
  EXPECT_DOUBLE_EQ(r.eta_s, 2.0 * 11);
}

}  // namespace bp
