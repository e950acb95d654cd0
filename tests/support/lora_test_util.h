// Test helpers shared by the export tests: a LoRA adapter whose lora_B weights are random (a fresh
// adapter is the identity), and the logits of a fixed stories260K prompt.
#pragma once

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

// Logits of a fixed 12-token prompt (positions 0..11).
inline std::vector<float> story_logits(Model& m) {
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 56, 424, 263, 300, 11, 92, 5};
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  const auto T = static_cast<int64_t>(ids.size());
  return m.logits(Tensor::from_vector(ids, {T}), Tensor::from_vector(pos, {T})).to_vector();
}

}  // namespace bp::test
