// Learning-rate schedules with linear warmup, as Hugging Face transformers defines them
// (get_{cosine,linear,constant}_schedule_with_warmup), so runs compare one to one:
//   step k (0-based, the k-th optimizer update), warmup W, total N:
//   k < W:    lr · k / max(1, W)
//   cosine:   lr · 0.5·(1 + cos(π · (k−W)/max(1, N−W)))
//   linear:   lr · max(0, (N−k)/max(1, N−W))
//   constant: lr
#pragma once

#include <cstdint>
#include <string>

namespace bp {

enum class LrScheduler { Cosine, Linear, Constant };

LrScheduler parse_lr_scheduler(const std::string& name);  // INPUT_VALIDATION_FAILED otherwise
double lr_at_step(LrScheduler kind, double lr_max, int64_t step, int64_t warmup_steps, int64_t total_steps);

}  // namespace bp
