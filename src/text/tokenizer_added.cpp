// Added-token matching (see tokenizer_added.h).
#include "text/tokenizer_added.h"

#include <unicode/uchar.h>

#include "text/unicode.h"

namespace bp::text {

void AddedTokenMatcher::build(std::vector<std::string> patterns, std::vector<const AddedToken*> tokens) {
  patterns_ = std::move(patterns);
  tokens_ = std::move(tokens);
  children_.clear();
  terminal_.assign(1, -1);
  for (size_t p = 0; p < patterns_.size(); ++p) {
    const std::string& s = patterns_[p];
    if (s.empty()) continue;
    first_byte_[static_cast<unsigned char>(s[0])] = true;
    int32_t node = 0;
    for (unsigned char b : s) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | b;
      auto it = children_.find(key);
      if (it == children_.end()) {
        const auto child = static_cast<int32_t>(terminal_.size());
        terminal_.push_back(-1);
        it = children_.emplace(key, child).first;
      }
      node = it->second;
    }
    if (terminal_[node] < 0) terminal_[node] = static_cast<int32_t>(p);  // first definition wins
  }
}

namespace {

bool is_word_char(char32_t c) {
  return u_isalnum(static_cast<UChar32>(c)) || c == U'_';
}

char32_t code_point_before(std::string_view s, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return next_code_point(s, start);
}

}  // namespace

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t plain_start = 0;  // start of the current plain run
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      auto it = children_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[j]));
      if (it == children_.end()) break;
      node = it->second;
      if (terminal_[node] >= 0) {
        best = terminal_[node];
        best_end = j + 1;
      }
    }
    if (best >= 0 && tokens_[best]->single_word) {
      const bool left_ok = i == 0 || !is_word_char(code_point_before(text, i));
      size_t k = best_end;
      const bool right_ok = best_end == text.size() || !is_word_char(next_code_point(text, k));
      if (!left_ok || !right_ok) best = -1;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    size_t start = i, end = best_end;
    if (tokens_[best]->lstrip) {  // swallow whitespace on the left, back to the previous match
      while (start > plain_start) {
        const char32_t c = code_point_before(text, start);
        if (!is_unicode_whitespace(c)) break;
        size_t s = start - 1;
        while (s > plain_start && (static_cast<unsigned char>(text[s]) & 0xC0) == 0x80) --s;
        start = s;
      }
    }
    if (tokens_[best]->rstrip) {
      while (end < text.size()) {
        size_t k = end;
        if (!is_unicode_whitespace(next_code_point(text, k))) break;
        end = k;
      }
    }
    if (start > plain_start) out.push_back({plain_start, start, -1});
    out.push_back({start, end, best});
    plain_start = i = end;
  }
  if (plain_start < text.size()) out.push_back({plain_start, text.size(), -1});
}

}  // namespace bp::text
