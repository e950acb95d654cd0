// Packing samples into flat micro-batches with cu_seqlens, restarting positions and shifted labels.
#include "text/packing.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace bp {

int64_t PackedBatch::num_loss_tokens() const {
  return std::count_if(labels.begin(), labels.end(), [](int32_t l) { return l != kIgnoreLabel; });
}

PackedBatch pack_samples(const std::vector<const Sample*>& samples) {
  PackedBatch b;
  size_t total = 0;
  for (const Sample* s : samples) total += s->ids.size();
  b.tokens.reserve(total);
  b.positions.reserve(total);
  b.labels.reserve(total);
  b.cu_seqlens.reserve(samples.size() + 1);
  b.cu_seqlens.push_back(0);
  for (const Sample* s : samples) {
    BP_CHECK(s->ids.size() == s->loss_mask.size(), "[packing] sample {} has {} ids but {} mask entries", s->id,
             s->ids.size(), s->loss_mask.size());
    const size_t n = s->ids.size();
    for (size_t t = 0; t < n; ++t) {
      b.tokens.push_back(s->ids[t]);
      b.positions.push_back(static_cast<int32_t>(t));
      b.labels.push_back(t + 1 < n && s->loss_mask[t + 1] ? s->ids[t + 1] : kIgnoreLabel);
    }
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
    b.sample_ids.push_back(s->id);
  }
  return b;
}

}  // namespace bp
