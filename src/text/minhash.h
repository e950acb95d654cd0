// Near-duplicate text detection (issue 43, `backprop data report|split`): MinHash signatures over
// word shingles and locality-sensitive hashing by bands, so that a file of a million rows is
// compared in O(rows) time, never all pairs.
//
//   shingles   the text lower-cased (ASCII letters), cut into words at every character that is
//              not a letter, digit or a byte of a multi-byte UTF-8 character; each run of
//              `shingle_words` consecutive words hashed to 64 bits (texts shorter than that: one
//              shingle of all their words). A set: repeats count once.
//   signature  for each of `num_hashes` seeded mixing functions h_i, min over the shingles of
//              h_i(shingle), kept as 32 bits. P[sig_a[i] == sig_b[i]] = Jaccard(a, b) (up to 32-bit
//              collisions), so the fraction of equal slots estimates it with standard deviation
//              sqrt(J(1 − J) / num_hashes).
//   bands      the signature cut into `bands` bands of num_hashes / bands slots; two texts become a
//              candidate pair when one band is equal: P = 1 − (1 − J^r)^b (r slots per band). With
//              64 slots in 16 bands of 4, a pair at J = 0.8 is a candidate with P > 0.9997, one at
//              0.3 with P = 0.12; candidates are then kept only when the estimate reaches the
//              threshold.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace bp {

struct MinHashOptions {
  int shingle_words = 3;
  int num_hashes = 64;
  int bands = 16;  // must divide num_hashes
  uint64_t seed = 0x9e3779b97f4a7c15ull;
};

// The shingle hashes of `text`, sorted and unique (empty for a text without words).
std::vector<uint64_t> shingle_hashes(std::string_view text, int shingle_words);

using MinHashSignature = std::vector<uint32_t>;
// All slots 0xffffffff for an empty shingle set (such texts are never anyone's near-duplicate).
MinHashSignature minhash_signature(const std::vector<uint64_t>& shingles, const MinHashOptions& o);
// The fraction of equal slots (0 when either signature is empty-text).
double estimated_jaccard(const MinHashSignature& a, const MinHashSignature& b);
// |a ∩ b| / |a ∪ b| of two sorted unique sets (0 for two empty sets).
double exact_jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b);

// Candidate pairs among `sigs` by banding: every (i, j), i < j, that share a band, at most once
// each. A bucket of more than `max_bucket` members (a text repeated thousands of times) pairs
// each member with the bucket's first only, so time stays linear.
std::vector<std::pair<int64_t, int64_t>> lsh_candidate_pairs(const std::vector<MinHashSignature>& sigs,
                                                             const MinHashOptions& o, size_t max_bucket = 32);

}  // namespace bp
