// Packing samples into flat micro-batches with cu_seqlens, restarting positions and shifted labels.
#include "text/packing.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace bp {

int64_t PackedBatch::num_loss_tokens() const {
  return std::count_if(labels.begin(), labels.end(), [](int32_t l) { return l != kIgnoreLabel; });
}

void append_sequence(PackedBatch& b, const std::vector<int32_t>& tokens, const std::vector<int32_t>& labels,
                     int64_t sample_id) {
  BP_CHECK(tokens.size() == labels.size(), "[packing] sequence {} has {} tokens but {} labels", sample_id,
           tokens.size(), labels.size());
  if (b.cu_seqlens.empty()) b.cu_seqlens.push_back(0);
  b.tokens.insert(b.tokens.end(), tokens.begin(), tokens.end());
  b.labels.insert(b.labels.end(), labels.begin(), labels.end());
  for (size_t t = 0; t < tokens.size(); ++t) b.positions.push_back(static_cast<int32_t>(t));
  b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
  b.sample_ids.push_back(sample_id);
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
  std::vector<int32_t> labels;
  for (const Sample* s : samples) {
    BP_CHECK(s->ids.size() == s->loss_mask.size(), "[packing] sample {} has {} ids but {} mask entries", s->id,
             s->ids.size(), s->loss_mask.size());
    const size_t n = s->ids.size();
    labels.assign(n, kIgnoreLabel);
    for (size_t t = 0; t + 1 < n; ++t)
      if (s->loss_mask[t + 1]) labels[t] = s->ids[t + 1];
    append_sequence(b, s->ids, labels, s->id);
  }
  return b;
}

}  // namespace bp
