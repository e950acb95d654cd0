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

std::vector<PackedBatch> pack_by_token_budget(const std::vector<const Sample*>& samples, int64_t token_budget) {
  if (token_budget < 1)
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[packing] the token budget per micro-batch must be at least 1, got {}", token_budget));
  std::vector<PackedBatch> out;
  std::vector<const Sample*> cur;
  int64_t cur_tokens = 0;
  for (const Sample* s : samples) {
    const auto n = static_cast<int64_t>(s->ids.size());
    if (!cur.empty() && cur_tokens + n > token_budget) {
      out.push_back(pack_samples(cur));
      cur.clear();
      cur_tokens = 0;
    }
    cur.push_back(s);
    cur_tokens += n;
  }
  if (!cur.empty()) out.push_back(pack_samples(cur));
  return out;
}

}  // namespace bp
