// Seeded permutations (SplitMix64 + Fisher-Yates), the resumable data cursor and the holdout split.
#include "text/data_cursor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace bp {

namespace {

struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) by rejection (no modulo bias).
  uint64_t below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do r = next();
    while (r >= limit);
    return r % bound;
  }
};

std::vector<int64_t> permutation(int64_t n, uint64_t stream_seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  SplitMix64 rng{stream_seed};
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng.below(static_cast<uint64_t>(i + 1))]);
  return p;
}

uint64_t mix(uint64_t seed, uint64_t salt) {
  SplitMix64 r{seed ^ (salt * 0xD1B54A32D192ED03ull)};
  return r.next();
}

}  // namespace

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  if (!shuffle) {
    std::vector<int64_t> p(static_cast<size_t>(n));
    std::iota(p.begin(), p.end(), 0);
    return p;
  }
  return permutation(n, mix(seed, static_cast<uint64_t>(epoch) + 1));
}

nlohmann::json CursorState::to_json() const {
  return {{"epoch", epoch}, {"index", index}};
}

CursorState CursorState::from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("epoch") || !j.contains("index") || !j["epoch"].is_number_integer() ||
      !j["index"].is_number_integer())
    throw Error(ErrorCode::STATE_CHECKPOINT_INVALID,
                fmt::format("[data_cursor] data cursor must be {{\"epoch\": int, \"index\": int}}, got {}", j.dump()));
  CursorState s{j["epoch"].get<int64_t>(), j["index"].get<int64_t>()};
  if (s.epoch < 0 || s.index < 0)
    throw Error(ErrorCode::STATE_CHECKPOINT_INVALID,
                fmt::format("[data_cursor] negative data cursor (epoch {}, index {})", s.epoch, s.index));
  return s;
}

DataCursor::DataCursor(int64_t num_samples, uint64_t seed, bool shuffle, CursorState state)
    : n_(num_samples), seed_(seed), shuffle_(shuffle), state_(state) {
  if (n_ < 1) throw Error(ErrorCode::INPUT_DATASET_INVALID, "[data_cursor] the dataset has no samples");
  if (state_.epoch < 0 || state_.index < 0 || state_.index > n_)
    throw Error(ErrorCode::STATE_CHECKPOINT_INVALID,
                fmt::format("[data_cursor] cursor (epoch {}, index {}) does not fit a dataset of {} samples",
                            state_.epoch, state_.index, n_));
  order_ = epoch_order(n_, seed_, state_.epoch, shuffle_);
}

std::vector<int64_t> DataCursor::next(int64_t n) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t k = 0; k < n; ++k) {
    if (state_.index >= n_) {
      ++state_.epoch;
      state_.index = 0;
      order_ = epoch_order(n_, seed_, state_.epoch, shuffle_);
    }
    out.push_back(order_[static_cast<size_t>(state_.index++)]);
  }
  return out;
}

HoldoutSplit split_holdout(int64_t n, double fraction, uint64_t seed) {
  if (!(fraction >= 0.0 && fraction < 1.0))
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[dataset] --holdout must be in [0, 1), got {}", fraction));
  int64_t n_eval = static_cast<int64_t>(std::llround(fraction * static_cast<double>(n)));
  if (fraction > 0.0 && n >= 2) n_eval = std::clamp<int64_t>(n_eval, 1, n - 1);
  if (n < 2) n_eval = 0;
  // A separate stream from the epoch orders, so the split does not correlate with epoch 0.
  const std::vector<int64_t> p = permutation(n, mix(seed, 0x686f6c646f7574ull));
  HoldoutSplit s;
  s.eval.assign(p.begin(), p.begin() + n_eval);
  s.train.assign(p.begin() + n_eval, p.end());
  std::sort(s.eval.begin(), s.eval.end());
  std::sort(s.train.begin(), s.train.end());
  return s;
}

}  // namespace bp
