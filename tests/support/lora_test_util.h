// Test helpers shared by the export and adapter tests: a LoRA adapter whose lora_B weights (or DoRA
// magnitudes) are random (a fresh adapter is the identity), the logits of a fixed stories260K
// prompt, and the check that a merged export gives the logits of its base with the adapter.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/lora.h"
#include "model/transformer.h"
#include "test_util.h"

namespace bp::test {

// Every defined lora_B gets uniform values in [-0.3, 0.3], seeded first_seed + 1, + 2, ...
inline void randomize_lora_b(LoraAdapter& ad, uint64_t first_seed) {
  uint64_t s = first_seed;
  for (auto& layer : ad.layers)
    for (auto& B : layer.B)
      if (B.defined()) B = random_tensor(B.shape(), ++s, -0.3f, 0.3f);
}

// Every adapted projection's DoRA magnitude [out] uniform in [0.5, 1.5], seeded first_seed + 1, ...
inline void randomize_dora_magnitudes(LoraAdapter& ad, uint64_t first_seed) {
  uint64_t s = first_seed;
  for (LoraLayer& l : ad.layers)
    for (LoraTarget t : kAllLoraTargets)
      if (l.has(t) && l.m(t).defined())  // in place: a fused module's magnitude rows stay one tensor
        l.m(t).copy_from(random_tensor({l.b(t).dim(0)}, ++s, 0.5f, 1.5f));
      else if (l.has(t))
        l.m(t) = random_tensor({l.b(t).dim(0)}, ++s, 0.5f, 1.5f);
}

// Logits of a fixed 12-token prompt (positions 0..11).
inline std::vector<float> story_logits(Model& m) {
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 56, 424, 263, 300, 11, 92, 5};
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  const auto T = static_cast<int64_t>(ids.size());
  return m.logits(Tensor::from_vector(ids, {T}), Tensor::from_vector(pos, {T})).to_vector();
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(double(a[i]) - b[i]));
  return d;
}

// A merged export (the model `merged`) gives the logits of `base` with `adapter` attached, and the
// adapter changes them by more than `min_change` (so the check can fail).
inline void expect_merged_logits_match(ModelWeights base, LoraAdapter& adapter, ModelWeights merged,
                                       double min_change) {
  Model frozen(base, ModelOptions{TrainMode::Frozen});
  frozen.set_training(false);
  const auto plain = story_logits(frozen);
  Model with_lora(std::move(base), ModelOptions{TrainMode::Lora});
  with_lora.attach_lora(adapter);
  with_lora.set_training(false);
  Model merged_model(std::move(merged), ModelOptions{TrainMode::Frozen});
  merged_model.set_training(false);
  const auto want = story_logits(with_lora), got = story_logits(merged_model);
  EXPECT_TRUE(all_close(got, want, {1e-4, 1e-4})) << max_abs_diff(got, want);
  EXPECT_GT(max_abs_diff(plain, want), min_change) << "the adapter should change the logits";
}

}  // namespace bp::test
