// Added tokens (tokenizer.json "added_tokens"): matched in the text before normalization
// (normalized=false) or after it (normalized=true), leftmost-longest, and never split by BPE.
// lstrip / rstrip swallow the whitespace on that side of a match; single_word only matches
// when no word character touches the token.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace bp::text {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, normalized = false, single_word = false;
};

// A run of text [start, end) of the input, or an added token when token >= 0.
struct Segment {
  size_t start, end;
  int32_t token;  // index into the matcher's token list, -1 for plain text
};

class AddedTokenMatcher {
 public:
  // `patterns[i]` is what to look for; `tokens[i]` carries its flags.
  void build(std::vector<std::string> patterns, std::vector<const AddedToken*> tokens);
  bool empty() const { return patterns_.empty(); }
  // Splits `text` (valid UTF-8) into plain runs and matches; plain runs may be empty-free.
  void split(std::string_view text, std::vector<Segment>& out) const;
  const AddedToken& token(int32_t index) const { return *tokens_[index]; }

 private:
  std::vector<std::string> patterns_;
  std::vector<const AddedToken*> tokens_;
  // Byte trie: child of (node, byte) in one hash map; terminal[node] = pattern index or -1.
  std::unordered_map<uint64_t, int32_t> children_;
  std::vector<int32_t> terminal_;
  bool first_byte_[256] = {};
};

}  // namespace bp::text
