// A small PCRE2 wrapper for `backprop doctor` (8-bit, no UTF checks: logs may hold any bytes).
// Patterns come from data/troubleshooting.json; a pattern that does not compile is a defect of the
// data file and throws RUNTIME_INTERNAL naming the pattern and PCRE2's message.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bp::cli::doctor {

struct RegexMatch {
  size_t begin = 0, end = 0;                            // of the whole match
  std::vector<std::optional<std::string_view>> groups;  // capture groups 1..n (unset -> nullopt)
  // The first capture group that took part in the match (number regexes use alternatives).
  std::optional<std::string_view> first_group() const {
    for (const auto& g : groups)
      if (g) return g;
    return std::nullopt;
  }
};

class Regex {
 public:
  explicit Regex(const std::string& pattern);
  // First match at or after `start`.
  std::optional<RegexMatch> find(std::string_view text, size_t start = 0) const;
  // Every non-overlapping match.
  std::vector<RegexMatch> find_all(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Free {
    void operator()(pcre2_code* c) const { pcre2_code_free(c); }
  };
  std::string pattern_;
  std::shared_ptr<pcre2_code> code_;
};

}  // namespace bp::cli::doctor
