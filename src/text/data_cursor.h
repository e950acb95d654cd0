// Deterministic data order: seeded shuffling, a resumable cursor and the held-out split.
//
// Every epoch e visits all N samples in the order permutation(N, seed, e): a Fisher-Yates
// shuffle driven by SplitMix64 seeded from (seed, e). It is our own generator, not std::shuffle /
// std::uniform_int_distribution, whose results differ between standard libraries, so a run and
// its resume see the same order everywhere. The cursor state is (epoch, index into that epoch's
// order); saving it after a step and restoring it continues with exactly the next sample.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace bp {

// A permutation of 0..n-1 (identity when shuffle is false).
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle = true);

struct CursorState {
  int64_t epoch = 0;
  int64_t index = 0;  // next position in the epoch's order
  nlohmann::json to_json() const;
  // Throws STATE_CHECKPOINT_INVALID when fields are missing or negative.
  static CursorState from_json(const nlohmann::json& j);
  bool operator==(const CursorState&) const = default;
};

class DataCursor {
 public:
  // num_samples >= 1 (else INPUT_DATASET_INVALID). A state from a checkpoint must lie inside the
  // dataset (index <= num_samples), else STATE_CHECKPOINT_INVALID.
  DataCursor(int64_t num_samples, uint64_t seed, bool shuffle = true, CursorState state = {});

  // The next n sample indices, crossing into the next epoch (and its new order) when needed.
  std::vector<int64_t> next(int64_t n);
  const CursorState& state() const { return state_; }
  int64_t num_samples() const { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
  bool shuffle_;
  CursorState state_;
  std::vector<int64_t> order_;  // order of state_.epoch
};

struct HoldoutSplit {
  std::vector<int64_t> train, eval;  // disjoint, each ascending, together 0..n-1
};
// Seeded split: eval gets round(fraction * n) samples (at least 1 when fraction > 0 and n >= 2,
// and never all of them). fraction must be in [0, 1) (CONFIG_INVALID_SETTING otherwise).
HoldoutSplit split_holdout(int64_t n, double fraction, uint64_t seed);

}  // namespace bp
