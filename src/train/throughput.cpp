// Progress-bar rates (see throughput.h).
#include "train/throughput.h"

namespace bp {

ThroughputReading ThroughputMeter::update(int64_t step, int64_t tokens_total, int64_t total_steps,
                                          Clock::time_point now) {
  if (!started_) {
    started_ = true;
    first_step_ = step;
    first_tokens_ = tokens_total;
    first_time_ = now;
    ThroughputReading r;
    if (step >= total_steps) r.eta_s = 0;  // nothing left, even without a rate
    return r;
  }
  ThroughputReading r;
  const double elapsed_s = std::chrono::duration<double>(now - first_time_).count();
  const int64_t steps = step - first_step_;
  if (elapsed_s > 0) r.tokens_per_s = static_cast<double>(tokens_total - first_tokens_) / elapsed_s;
  if (steps > 0) r.eta_s = elapsed_s / static_cast<double>(steps) * static_cast<double>(total_steps - step);
  return r;
}

}  // namespace bp
