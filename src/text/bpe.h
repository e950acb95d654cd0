// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}): vocab, ranked merges, and the
// merge loop that turns one pre-token into ids. Options honoured: unk_token, fuse_unk,
// byte_fallback (<0xNN> tokens for characters missing from the vocab), ignore_merges (a
// pre-token that is itself in the vocab is emitted whole, as Llama-3 does),
// continuing_subword_prefix and end_of_word_suffix. Merges may be "a b" strings or ["a", "b"].
//
// Algorithm: the piece starts as one symbol per code point in a doubly linked list; a min-heap
// holds candidate merges ordered by (rank, position). Popping a merge whose symbols changed
// since it was queued is skipped. O(n log n) per piece instead of the quadratic rescan.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace bp::text {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  using Vocab = std::vector<std::pair<std::string, int64_t>>;
  using Merges = std::vector<std::pair<std::string, std::string>>;
  // `model` gives the options (unk_token, byte_fallback, ...); vocab and merges come separately
  // (see tokenizer_json.h). Throws std::invalid_argument on malformed input.
  BpeModel(const nlohmann::json& model, Vocab vocab, Merges merges);
  // Readers for vocab / merges left inside the model object.
  static Vocab vocab_from_json(const nlohmann::json& model);
  static Merges merges_from_json(const nlohmann::json& model);

  // Appends the ids of one pre-token (text already normalized and pre-tokenized).
  void encode(std::string_view piece, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  // nullptr when the id has no token in the model vocab.
  const std::string* id_to_token(int32_t id) const;
  int32_t unk_id() const { return unk_id_; }
  // The largest id in the vocab (-1 when empty). Ids need not be contiguous: a vocab with gaps
  // (cl100k leaves 100256 and 100261..100275 unused) is accepted as Hugging Face accepts it.
  int64_t max_id() const { return max_id_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  TokenMap vocab_;
  // id -> its token (a key of vocab_, whose nodes never move). A map, not an id-indexed table:
  // ids may have gaps, and an id of 1e9 in a 3-entry vocab must not allocate 1e9 slots.
  std::unordered_map<int32_t, const std::string*> tokens_;
  int64_t max_id_ = -1;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};  // id of <0xNN>, -1 when absent
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  std::string continuing_prefix_, end_of_word_suffix_;
};

}  // namespace bp::text
