// AdamW over the model's trainable parameters, with state that checkpoints round-trip exactly.
// The math is ops/optim.h (PyTorch's torch.optim.AdamW order); this class owns m and v (f32,
// from the CPU allocator, counted as the "optimizer state" group of the memory plan) and the
// step counter used for bias correction.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/optim.h"

namespace bp {

struct TrainableParam;

class AdamW {
 public:
  AdamW() = default;
  // Allocates zeroed m and v for each parameter (same names and shapes).
  void init(const std::vector<TrainableParam>& params);
  // One update of every parameter with its gradient at learning rate `lr`.
  void step(const std::vector<TrainableParam>& params, const AdamWConfig& cfg);
  int64_t steps_taken() const { return step_; }

  // "<name>.exp_avg" / "<name>.exp_avg_sq" tensors plus the step counter, for checkpoints.
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  // Restores from state_tensors() output; throws STATE_CHECKPOINT_INVALID on a missing or
  // mis-shaped entry.
  void load_state(const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t step);

 private:
  std::vector<std::string> names_;
  std::vector<Tensor> m_, v_;
  int64_t step_ = 0;
};

}  // namespace bp
