// MinHash and LSH banding (text/minhash.h) against plain references: the estimate against exact
// Jaccard on a sample of text pairs at every similarity, banding's candidates against every pair
// compared exactly, and the shingling rules.
#include "text/minhash.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <string>

namespace bp {
namespace {

// n words drawn from a vocabulary of 500, then a copy with `changed` of them replaced.
std::pair<std::string, std::string> text_pair(std::mt19937_64& rng, int n, int changed) {
  std::uniform_int_distribution<int> word(0, 499), pos(0, n - 1);
  std::vector<std::string> a;
  for (int i = 0; i < n; ++i) a.push_back("w" + std::to_string(word(rng)));
  std::vector<std::string> b = a;
  for (int i = 0; i < changed; ++i) b[static_cast<size_t>(pos(rng))] = "x" + std::to_string(word(rng));
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& w : v) s += w + " ";
    return s;
  };
  return {join(a), join(b)};
}

TEST(MinHash, ShinglesAreCaseAndPunctuationBlindSets) {
  EXPECT_EQ(shingle_hashes("The cat sat.", 3), shingle_hashes("the  CAT, sat!", 3));
  EXPECT_EQ(shingle_hashes("a b c a b c", 3).size(), 3u);  // "a b c", "b c a", "c a b": repeats count once
  EXPECT_EQ(shingle_hashes("two words", 3).size(), 1u);    // shorter than a shingle: one of all its words
  EXPECT_TRUE(shingle_hashes(" ,.; ", 3).empty());
  EXPECT_NE(shingle_hashes("a b c", 3), shingle_hashes("a c b", 3));  // order matters
  EXPECT_EQ(shingle_hashes("café crème", 1).size(), 2u);              // UTF-8 bytes are word bytes
}

// The estimate's error is binomial: sd = sqrt(J(1−J)/64) <= 0.0625. Over 300 pairs spread over
// every similarity, the mean error must be near 0 (|mean| < 0.02, 5 standard errors) and no single
// error beyond 5 sd (0.32): a wrong hash family or a biased minimum fails both.
TEST(MinHash, EstimateFollowsExactJaccard) {
  std::mt19937_64 rng(7);
  MinHashOptions o;
  double sum = 0;
  int n = 0;
  for (int changed = 0; changed <= 60; changed += 2) {
    for (int k = 0; k < 10; ++k) {
      auto [a, b] = text_pair(rng, 60, changed);
      const auto sa = shingle_hashes(a, 3), sb = shingle_hashes(b, 3);
      const double exact = exact_jaccard(sa, sb);
      const double est = estimated_jaccard(minhash_signature(sa, o), minhash_signature(sb, o));
      EXPECT_LE(std::fabs(est - exact), 5 * std::sqrt(exact * (1 - exact) / 64) + 1e-9)
          << "changed " << changed << " exact " << exact << " est " << est;
      sum += est - exact;
      ++n;
    }
  }
  EXPECT_LT(std::fabs(sum / n), 0.02) << "mean error " << sum / n;
  // Identical texts: exactly 1; disjoint: near 0; empty: 0.
  const auto s = minhash_signature(shingle_hashes("alpha beta gamma delta", 3), o);
  EXPECT_EQ(estimated_jaccard(s, s), 1.0);
  EXPECT_EQ(estimated_jaccard(minhash_signature({}, o), minhash_signature({}, o)), 0.0);
}

// Banding against all pairs compared exactly: every pair above 0.8 is a candidate (P > 0.9997 each),
// far fewer pairs than all are produced, and every candidate pair is distinct and ordered.
TEST(MinHash, LshCandidatesHoldEverySimilarPair) {
  std::mt19937_64 rng(11);
  MinHashOptions o;
  std::vector<std::string> texts;
  for (int g = 0; g < 60; ++g) {  // 60 groups of 3 variants at 0-2 changed words of 40
    auto [a, b] = text_pair(rng, 40, 1);
    auto [c, d] = text_pair(rng, 40, 0);
    texts.push_back(a);
    texts.push_back(b);
    texts.push_back(c);
    (void)d;
  }
  std::vector<std::vector<uint64_t>> sh;
  std::vector<MinHashSignature> sigs;
  for (const auto& t : texts) {
    sh.push_back(shingle_hashes(t, 3));
    sigs.push_back(minhash_signature(sh.back(), o));
  }
  const auto pairs = lsh_candidate_pairs(sigs, o);
  const std::set<std::pair<int64_t, int64_t>> cand(pairs.begin(), pairs.end());
  EXPECT_EQ(cand.size(), pairs.size()) << "a pair twice";
  for (const auto& [a, b] : pairs) EXPECT_LT(a, b);
  size_t similar = 0;
  for (size_t i = 0; i < texts.size(); ++i)
    for (size_t j = i + 1; j < texts.size(); ++j)
      if (exact_jaccard(sh[i], sh[j]) >= 0.8) {
        ++similar;
        EXPECT_TRUE(cand.count({static_cast<int64_t>(i), static_cast<int64_t>(j)})) << i << " " << j;
      }
  EXPECT_GE(similar, 60u);
  EXPECT_LT(pairs.size(), texts.size() * (texts.size() - 1) / 2 / 20) << "banding compared almost all pairs";
}

}  // namespace
}  // namespace bp
