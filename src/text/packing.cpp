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
  size_t total = 0, sequences = 0;
  for (const Sample* s : samples) {
    total += s->ids.size() + s->rejected_ids.size();
    sequences += s->is_pair() ? 2 : 1;
  }
  b.tokens.reserve(total);
  b.positions.reserve(total);
  b.labels.reserve(total);
  b.cu_seqlens.reserve(sequences + 1);
  b.cu_seqlens.push_back(0);
  std::vector<int32_t> labels;
  const auto append = [&](const std::vector<int32_t>& ids, const std::vector<uint8_t>& mask, int64_t id) {
    BP_CHECK(ids.size() == mask.size(), "[packing] sample {} has {} ids but {} mask entries", id, ids.size(),
             mask.size());
    const size_t n = ids.size();
    labels.assign(n, kIgnoreLabel);
    for (size_t t = 0; t + 1 < n; ++t)
      if (mask[t + 1]) labels[t] = ids[t + 1];
    append_sequence(b, ids, labels, id);
  };
  for (const Sample* s : samples) {
    append(s->ids, s->loss_mask, s->id);
    if (s->is_pair()) append(s->rejected_ids, s->rejected_loss_mask, s->id);  // the pair stays together
  }
  return b;
}

}  // namespace bp
