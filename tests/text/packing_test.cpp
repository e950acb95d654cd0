// Packing invariants, shuffle determinism, cursor resume equivalence and the holdout split.
#include "text/packing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "core/error.h"
#include "text/data_cursor.h"

namespace bp::test {
namespace {

std::vector<Sample> make_samples(int n, uint64_t seed) {
  std::vector<Sample> out;
  uint64_t x = seed;
  for (int i = 0; i < n; ++i) {
    Sample s;
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const size_t len = 1 + (x >> 33) % 13;
    for (size_t t = 0; t < len; ++t) {
      s.ids.push_back(static_cast<int32_t>(1000 * i + t));
      s.loss_mask.push_back(static_cast<uint8_t>(((x >> (t % 32)) & 1) || t + 1 == len));
    }
    s.id = i;
    out.push_back(s);
  }
  return out;
}

std::vector<const Sample*> ptrs(const std::vector<Sample>& v) {
  std::vector<const Sample*> p;
  for (const auto& s : v) p.push_back(&s);
  return p;
}

TEST(Packing, InvariantsOfAPackedBatch) {
  const std::vector<Sample> samples = make_samples(9, 7);
  const PackedBatch b = pack_samples(ptrs(samples));
  ASSERT_EQ(b.cu_seqlens.size(), samples.size() + 1);
  EXPECT_EQ(b.cu_seqlens.front(), 0);
  EXPECT_EQ(b.cu_seqlens.back(), b.num_tokens());
  ASSERT_EQ(b.positions.size(), b.tokens.size());
  ASSERT_EQ(b.labels.size(), b.tokens.size());
  for (size_t k = 0; k < samples.size(); ++k) {
    const Sample& s = samples[k];
    EXPECT_EQ(b.sample_ids[k], s.id);
    const int32_t begin = b.cu_seqlens[k], end = b.cu_seqlens[k + 1];
    ASSERT_EQ(end - begin, static_cast<int32_t>(s.ids.size()));
    for (int32_t t = begin; t < end; ++t) {
      const size_t local = static_cast<size_t>(t - begin);
      EXPECT_EQ(b.tokens[t], s.ids[local]);
      EXPECT_EQ(b.positions[t], static_cast<int32_t>(local));  // restarts per sample
      // label[t] = token[t+1] inside the sample when that token is a target; never across a boundary.
      if (t + 1 == end) {
        EXPECT_EQ(b.labels[t], kIgnoreLabel);
      } else if (s.loss_mask[local + 1]) {
        EXPECT_EQ(b.labels[t], b.tokens[t + 1]);
      } else {
        EXPECT_EQ(b.labels[t], kIgnoreLabel);
      }
    }
  }
  int64_t expected_loss = 0;
  for (const auto& s : samples) expected_loss += std::count(s.loss_mask.begin() + 1, s.loss_mask.end(), 1);
  EXPECT_EQ(b.num_loss_tokens(), expected_loss);
}

TEST(DataCursor, ShuffleIsDeterministicPerSeedAndEpoch) {
  const auto a = epoch_order(100, 42, 0);
  EXPECT_EQ(a, epoch_order(100, 42, 0));
  EXPECT_NE(a, epoch_order(100, 43, 0));
  EXPECT_NE(a, epoch_order(100, 42, 1));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> ident(100);
  std::iota(ident.begin(), ident.end(), 0);
  EXPECT_EQ(sorted, ident);
  EXPECT_NE(a, ident);
  EXPECT_EQ(epoch_order(100, 42, 3, false), ident);
  // Pinned: the order (SplitMix64 + Fisher-Yates) must not change between builds, standard
  // libraries or versions, or resumed runs would see other data.
  EXPECT_EQ((std::vector<int64_t>{a[0], a[1], a[2], a[3]}), (std::vector<int64_t>{33, 0, 71, 57}));
}

TEST(DataCursor, ResumeContinuesWithExactlyTheNextSample) {
  const int64_t n = 17;
  DataCursor straight(n, 9);
  std::vector<int64_t> expected;
  for (int k = 0; k < 12; ++k) {
    auto got = straight.next(5);
    expected.insert(expected.end(), got.begin(), got.end());
  }
  // Stop after every possible step, save the state through JSON, resume in a new cursor.
  for (int stop = 0; stop <= 12; ++stop) {
    DataCursor first(n, 9);
    std::vector<int64_t> seen;
    for (int k = 0; k < stop; ++k) {
      auto got = first.next(5);
      seen.insert(seen.end(), got.begin(), got.end());
    }
    const CursorState saved = CursorState::from_json(nlohmann::json::parse(first.state().to_json().dump()));
    EXPECT_EQ(saved, first.state());
    DataCursor resumed(n, 9, true, saved);
    for (int k = stop; k < 12; ++k) {
      auto got = resumed.next(5);
      seen.insert(seen.end(), got.begin(), got.end());
    }
    EXPECT_EQ(seen, expected) << "stopped after " << stop << " steps";
  }
  // Each epoch visits every sample exactly once.
  for (int64_t e = 0; e < 3; ++e) {
    std::set<int64_t> epoch(expected.begin() + e * n, expected.begin() + (e + 1) * n);
    EXPECT_EQ(static_cast<int64_t>(epoch.size()), n);
  }
  EXPECT_EQ(straight.state().epoch, 60 / n);
  EXPECT_EQ(straight.state().index, 60 % n);
}

TEST(DataCursor, RejectsBadStates) {
  EXPECT_THROW(DataCursor(0, 1), Error);
  EXPECT_THROW(DataCursor(5, 1, true, {0, 6}), Error);
  EXPECT_THROW(CursorState::from_json(nlohmann::json{{"epoch", 1}}), Error);
  EXPECT_THROW(CursorState::from_json(nlohmann::json{{"epoch", -1}, {"index", 0}}), Error);
}

TEST(DataCursor, HoldoutSplitIsSeededAndDisjoint) {
  const HoldoutSplit s = split_holdout(1000, 0.1, 5);
  EXPECT_EQ(s.eval.size(), 100u);
  EXPECT_EQ(s.train.size(), 900u);
  std::set<int64_t> all(s.train.begin(), s.train.end());
  for (int64_t e : s.eval) EXPECT_TRUE(all.insert(e).second) << e << " is in both";
  EXPECT_EQ(all.size(), 1000u);
  const HoldoutSplit again = split_holdout(1000, 0.1, 5);
  EXPECT_EQ(again.eval, s.eval);
  EXPECT_EQ(again.train, s.train);
  EXPECT_NE(split_holdout(1000, 0.1, 6).eval, s.eval);
  // Not simply the first or last rows.
  EXPECT_NE(s.eval.back(), 99);
  EXPECT_NE(s.eval.front(), 900);
  EXPECT_EQ(split_holdout(10, 0.01, 1).eval.size(), 1u);  // at least one when asked for
  EXPECT_EQ(split_holdout(2, 0.9, 1).train.size(), 1u);   // never all of them
  EXPECT_TRUE(split_holdout(10, 0.0, 1).eval.empty());
  EXPECT_THROW(split_holdout(10, 1.0, 1), Error);
  EXPECT_THROW(split_holdout(10, -0.1, 1), Error);
}

}  // namespace
}  // namespace bp::test
