// Console output of `backprop train`: a one-line progress bar on stderr (step/total, loss, lr,
// tokens/s, memory in use and peak, ETA), redrawn in place on a terminal and printed every
// few steps otherwise, and the final summary.
#pragma once

#include <chrono>
#include <string>

#include "train/throughput.h"
#include "train/trainer.h"

namespace bp::cli {

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled);
  void update(const StepRecord& r, const TrainSummary& s, int64_t total_steps);
  void clear_line();  // before another message is printed
  void finish();
  // Trainer callbacks that drive this bar: each step updates it, an event clears its line first.
  TrainCallbacks callbacks();

 private:
  bool enabled_, tty_;
  bool drawn_ = false;
  ThroughputMeter meter_;
};

// "[========>     ] 12/50 loss 1.2345 lr 2.0e-04 | 1,234 tok/s | mem 1.2 GiB (peak 1.5 GiB) | ETA 1m05s"
std::string format_progress_line(const StepRecord& r, int64_t total_steps, double tokens_per_s, size_t bytes_in_use,
                                 size_t bytes_peak, double eta_s, int width);
std::string format_duration(double seconds);  // "1h02m", "3m05s", "12.3s"
std::string format_train_summary(const TrainSummary& s, const TrainOptions& o);

}  // namespace bp::cli
