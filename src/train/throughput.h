// Tokens per second and time left of a training run, as the progress bar shows them.
//
// The first update marks the start: the tokens of that step were processed before the mark, so
// they are not counted (counting them over the time since the mark made the rate k/(k-1) too high
// after k steps). After updates at steps s0 < ... < sk: rate = tokens of steps s0+1..sk over the
// time from s0 to sk, and ETA = that time / (sk - s0) per step x steps left. Times are passed in,
// so tests can inject them.
#pragma once

#include <chrono>
#include <cstdint>

namespace bp {

struct ThroughputReading {
  double tokens_per_s = 0;  // 0 until two updates were seen
  double eta_s = -1;        // < 0: unknown (first update)
};

class ThroughputMeter {
 public:
  using Clock = std::chrono::steady_clock;
  // step: 1-based step just finished; tokens_total: tokens of every step so far (resumed runs
  // included); total_steps: the run's length.
  ThroughputReading update(int64_t step, int64_t tokens_total, int64_t total_steps, Clock::time_point now);

 private:
  bool started_ = false;
  int64_t first_step_ = 0;
  int64_t first_tokens_ = 0;
  Clock::time_point first_time_;
};

}  // namespace bp
