#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace bp {

LrScheduler parse_lr_scheduler(const std::string& name) {
  if (name == "cosine") return LrScheduler::Cosine;
  if (name == "linear") return LrScheduler::Linear;
  if (name == "constant") return LrScheduler::Constant;
  throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
              fmt::format("[lr] unknown scheduler '{}'; allowed: cosine, linear, constant", name));
}

double lr_at_step(LrScheduler kind, double lr_max, int64_t step, int64_t warmup, int64_t total) {
  if (step < warmup) return lr_max * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  double span = static_cast<double>(std::max<int64_t>(1, total - warmup));
  switch (kind) {
    case LrScheduler::Constant: return lr_max;
    case LrScheduler::Linear: return lr_max * std::max(0.0, static_cast<double>(total - step) / span);
    case LrScheduler::Cosine: {
      double progress = static_cast<double>(step - warmup) / span;
      return lr_max * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
    }
  }
  return lr_max;
}

}  // namespace bp
