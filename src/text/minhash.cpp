// MinHash and LSH banding (contract and parameters: text/minhash.h).
#include "text/minhash.h"

#include <algorithm>
#include <limits>

namespace bp {

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser: a bijection with full avalanche
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(std::string_view s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

bool word_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
}

}  // namespace

std::vector<uint64_t> shingle_hashes(std::string_view text, int shingle_words) {
  std::vector<uint64_t> words;
  std::string w;
  for (size_t i = 0; i <= text.size(); ++i) {
    const unsigned char c = i < text.size() ? static_cast<unsigned char>(text[i]) : ' ';
    if (word_byte(c)) {
      w += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    } else if (!w.empty()) {
      words.push_back(fnv1a(w));
      w.clear();
    }
  }
  std::vector<uint64_t> out;
  if (words.empty()) return out;
  const size_t k = std::max<size_t>(1, static_cast<size_t>(shingle_words));
  const size_t n = words.size() >= k ? words.size() - k + 1 : 1;
  for (size_t i = 0; i < n; ++i) {
    uint64_t h = 0x2545f4914f6cdd1dull;
    for (size_t j = i; j < std::min(words.size(), i + k); ++j) h = mix64(h ^ words[j]);
    out.push_back(h);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

MinHashSignature minhash_signature(const std::vector<uint64_t>& shingles, const MinHashOptions& o) {
  MinHashSignature sig(static_cast<size_t>(o.num_hashes), std::numeric_limits<uint32_t>::max());
  for (int i = 0; i < o.num_hashes; ++i) {
    const uint64_t salt = mix64(o.seed + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull);
    uint32_t m = std::numeric_limits<uint32_t>::max();
    for (uint64_t s : shingles) m = std::min(m, static_cast<uint32_t>(mix64(s ^ salt) >> 32));
    sig[static_cast<size_t>(i)] = m;
  }
  return sig;
}

namespace {
bool empty_text(const MinHashSignature& s) {
  return std::all_of(s.begin(), s.end(), [](uint32_t v) { return v == std::numeric_limits<uint32_t>::max(); });
}
}  // namespace

double estimated_jaccard(const MinHashSignature& a, const MinHashSignature& b) {
  if (a.size() != b.size() || a.empty() || empty_text(a) || empty_text(b)) return 0.0;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(a.size());
}

double exact_jaccard(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  size_t i = 0, j = 0, both = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j]) {
      ++both;
      ++i;
      ++j;
    } else if (a[i] < b[j]) {
      ++i;
    } else {
      ++j;
    }
  }
  const size_t either = a.size() + b.size() - both;
  return either ? static_cast<double>(both) / static_cast<double>(either) : 0.0;
}

std::vector<std::pair<int64_t, int64_t>> lsh_candidate_pairs(const std::vector<MinHashSignature>& sigs,
                                                             const MinHashOptions& o, size_t max_bucket) {
  const int rows = o.num_hashes / std::max(1, o.bands);
  std::vector<std::pair<int64_t, int64_t>> pairs;
  std::vector<std::pair<uint64_t, int64_t>> keys;  // one band at a time: bounded memory
  keys.reserve(sigs.size());
  for (int b = 0; b < o.bands; ++b) {
    keys.clear();
    for (size_t i = 0; i < sigs.size(); ++i) {
      if (sigs[i].empty() || empty_text(sigs[i])) continue;
      uint64_t h = mix64(static_cast<uint64_t>(b) + 1);
      for (int r = 0; r < rows; ++r) h = mix64(h ^ sigs[i][static_cast<size_t>(b * rows + r)]);
      keys.emplace_back(h, static_cast<int64_t>(i));
    }
    std::sort(keys.begin(), keys.end());
    for (size_t s = 0; s < keys.size();) {
      size_t e = s + 1;
      while (e < keys.size() && keys[e].first == keys[s].first) ++e;
      if (e - s <= max_bucket) {
        for (size_t x = s; x < e; ++x)
          for (size_t y = x + 1; y < e; ++y) pairs.emplace_back(keys[x].second, keys[y].second);
      } else {
        for (size_t y = s + 1; y < e; ++y) pairs.emplace_back(keys[s].second, keys[y].second);
      }
      s = e;
    }
  }
  std::sort(pairs.begin(), pairs.end());
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  return pairs;
}

}  // namespace bp
