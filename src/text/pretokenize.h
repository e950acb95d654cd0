// Pre-tokenizers of tokenizer.json: they cut normalized text into pieces that BPE encodes
// one by one. Supported: Sequence, Split (Regex or String pattern, every split behaviour,
// invert), ByteLevel (GPT-2 regex when use_regex, byte -> unicode alphabet), Metaspace, Digits
// (SmolLM), Whitespace, WhitespaceSplit.
// Regexes run through PCRE2 in UTF + UCP mode (JIT when available). Hugging Face writes them
// for Oniguruma; the escapes whose meaning differs (\s \S \w \W \d \D \h \H) are rewritten to
// Oniguruma's Unicode definitions, the rest of the syntax agrees. Every Unicode property
// (\p{L}, \s, ...) takes its members from ICU, not from PCRE2's older tables (unicode_props.h).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bp::text {

// Oniguruma pattern -> PCRE2 pattern with the same meaning (see above).
std::string onig_to_pcre2(const std::string& pattern);

// A compiled PCRE2 pattern (given in Oniguruma syntax). Safe to use from several threads (match data is per call).
class Regex {
 public:
  // Throws std::invalid_argument with PCRE2's message when the pattern does not compile.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Appends the non-empty matches in `text` (valid UTF-8) as byte ranges [first, second).
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// A tokenizer.json "pattern": {"String": "..."} or {"Regex": "..."}.
class Pattern {
 public:
  explicit Pattern(const nlohmann::json& spec);
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces every piece by its sub-pieces. `first_section` is true for the text before the
  // first added token (Metaspace prepend_scheme "first").
  virtual void split(std::vector<std::string>& pieces, bool first_section) const = 0;
};

// nullptr for JSON null. Throws std::invalid_argument naming the unsupported type.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec);

}  // namespace bp::text
