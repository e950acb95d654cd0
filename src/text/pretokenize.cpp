// Pre-tokenizers (see pretokenize.h). Split semantics follow Hugging Face tokenizers: the
// text is cut into alternating (gap, match) ranges, `invert` swaps which is the match, and the
// behaviour decides what happens to matches (kept alone, removed, glued to a neighbour).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pretokenize.h"

#include <pcre2.h>

#include <algorithm>
#include <stdexcept>

#include "text/unicode.h"
#include "text/unicode_props.h"

namespace bp::text {

using nlohmann::json;
using Ranges = std::vector<std::pair<size_t, size_t>>;

// Oniguruma (what Hugging Face compiles these patterns with) and PCRE2 disagree on a few
// escapes: Onig's \s is the White_Space property (PCRE2's also takes U+180E), \w is
// Alphabetic + marks + decimal digits + connector punctuation, \d is \p{Nd}, and \h is a hex
// digit (PCRE2: horizontal space). Rewrite them to explicit properties; everything else
// ((?i:..), lookarounds, quantifiers) means the same in both. Every property, \p{..} included,
// then takes its members from ICU (unicode_props.h): PCRE2's own tables are older.
namespace {

// A property as PCRE2 class items (inside [...]) or as a whole class (outside).
std::string property(const std::string& name, bool negated, bool in_class) {
  if (in_class) {
    std::string items = pcre2_property_items(name, negated);
    return items.empty() ? (negated ? "\\P{" : "\\p{") + name + "}" : items;
  }
  const std::string plain = "\\p{" + name + "}", items = pcre2_property_items(name, false);
  if (items.empty() || items == plain) return negated ? "\\P{" + name + "}" : plain;  // PCRE2's is ICU's
  return (negated ? "[^" : "[") + items + "]";
}

std::string word_items() {
  std::string out;
  for (const char* name : {"Alphabetic", "M", "Nd", "Pc"}) out += property(name, false, true);
  return out;
}

}  // namespace

std::string onig_to_pcre2(const std::string& p) {
  std::string out;
  out.reserve(p.size() + 32);
  int class_depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      const bool in = class_depth > 0;
      switch (e) {
        case 's': out += property("White_Space", false, in); break;
        case 'S': out += property("White_Space", true, in); break;
        case 'd': out += property("Nd", false, in); break;
        case 'D': out += property("Nd", true, in); break;
        case 'w': out += in ? word_items() : "[" + word_items() + "]"; break;
        case 'W':
          if (in) {
            out += "\\W";  // a complement inside a class has no property form; keep PCRE2's
          } else {
            out += "[^" + word_items() + "]";
          }
          break;
        case 'h': out += in ? "0-9A-Fa-f" : "[0-9A-Fa-f]"; break;
        case 'H': out += in ? "\\H" : "[^0-9A-Fa-f]"; break;
        case 'p':
        case 'P': {
          const size_t close = i + 1 < p.size() && p[i + 1] == '{' ? p.find('}', i + 2) : std::string::npos;
          if (close == std::string::npos) {  // \pL and the like: PCRE2's meaning
            out.push_back('\\');
            out.push_back(e);
            break;
          }
          std::string name = p.substr(i + 2, close - i - 2);
          bool negated = e == 'P';
          if (!name.empty() && name[0] == '^') {
            negated = !negated;
            name.erase(0, 1);
          }
          out += property(name, negated, in);
          i = close;
          break;
        }
        default: out.push_back('\\'); out.push_back(e);
      }
      continue;
    }
    if (c == '[') {
      if (class_depth > 0 && p.compare(i, 2, "[:") == 0) {  // POSIX class inside a class
        const size_t end = p.find(":]", i + 2);
        if (end != std::string::npos) {
          out.append(p, i, end + 2 - i);
          i = end + 1;
          continue;
        }
      }
      ++class_depth;
      out.push_back(c);
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out.push_back(p[++i]);
      if (i + 1 < p.size() && p[i + 1] == ']') out.push_back(p[++i]);
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out.push_back(c);
  }
  return out;
}

Regex::Regex(const std::string& onig_pattern) {
  const std::string pattern = onig_to_pcre2(onig_pattern);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                             &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw std::invalid_argument("regex /" + onig_pattern + "/ (as PCRE2: /" + pattern +
                                "/) does not compile at offset " + std::to_string(err_off) + ": " +
                                reinterpret_cast<const char*>(msg));
  }
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

void Regex::find_all(std::string_view text, Ranges& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos <= text.size()) {
    uint32_t opts = PCRE2_NO_UTF_CHECK;
    int rc = pcre2_match(code, subject, text.size(), pos, opts, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // very long runs: fall back to the interpreter
      rc = pcre2_match(code, subject, text.size(), pos, opts | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH (or a limit): no more matches
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t start = ov[0], end = ov[1];
    if (end > start) {
      out.emplace_back(start, end);
      pos = end;
    } else {  // empty match: step over one code point
      if (start >= text.size()) break;
      pos = start + utf8_len(static_cast<unsigned char>(text[start]));
    }
  }
  pcre2_match_data_free(md);
  (void)jit_;
}

Pattern::Pattern(const json& spec) {
  if (spec.contains("Regex")) {
    regex_ = std::make_unique<Regex>(spec.at("Regex").get<std::string>());
  } else if (spec.contains("String")) {
    literal_ = spec.at("String").get<std::string>();
  } else {
    throw std::invalid_argument("pattern must have a \"String\" or \"Regex\" field: " + spec.dump());
  }
}

void Pattern::find_all(std::string_view text, Ranges& out) const {
  if (regex_) return regex_->find_all(text, out);
  if (literal_.empty()) return;
  for (size_t p = text.find(literal_); p != std::string_view::npos; p = text.find(literal_, p + literal_.size())) {
    out.emplace_back(p, p + literal_.size());
  }
}

namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string& s) {
  if (s == "Removed") return Behavior::Removed;
  if (s == "Isolated") return Behavior::Isolated;
  if (s == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::MergedWithNext;
  if (s == "Contiguous") return Behavior::Contiguous;
  throw std::invalid_argument("unknown split behavior \"" + s + "\"");
}

// Cuts `text` at the matches of `pattern` and appends the pieces to `out` (Rust's
// NormalizedString::split with the given behaviour).
void split_by(const Pattern& pattern, Behavior behavior, bool invert, const std::string& text,
              std::vector<std::string>& out) {
  Ranges matches;
  pattern.find_all(text, matches);
  struct Seg {
    size_t start, end;
    bool is_match;
  };
  std::vector<Seg> segs;
  size_t prev = 0;
  for (const auto& [s, e] : matches) {
    if (s > prev) segs.push_back({prev, s, invert});
    segs.push_back({s, e, !invert});
    prev = e;
  }
  if (prev < text.size()) segs.push_back({prev, text.size(), invert});

  std::vector<std::pair<size_t, size_t>> pieces;
  switch (behavior) {
    case Behavior::Isolated:
      for (const auto& g : segs) pieces.emplace_back(g.start, g.end);
      break;
    case Behavior::Removed:
      for (const auto& g : segs)
        if (!g.is_match) pieces.emplace_back(g.start, g.end);
      break;
    case Behavior::MergedWithPrevious: {
      bool prev_match = false;
      for (const auto& g : segs) {
        if (g.is_match && !prev_match && !pieces.empty()) {
          pieces.back().second = g.end;
        } else {
          pieces.emplace_back(g.start, g.end);
        }
        prev_match = g.is_match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev_match = false;
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_match && !prev_match && !pieces.empty()) {
          pieces.back().first = it->start;
        } else {
          pieces.emplace_back(it->start, it->end);
        }
        prev_match = it->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    }
    case Behavior::Contiguous: {
      int prev_match = -1;
      for (const auto& g : segs) {
        if (static_cast<int>(g.is_match) == prev_match && !pieces.empty()) {
          pieces.back().second = g.end;
        } else {
          pieces.emplace_back(g.start, g.end);
        }
        prev_match = g.is_match;
      }
      break;
    }
  }
  for (const auto& [s, e] : pieces)
    if (e > s) out.emplace_back(text.substr(s, e - s));
}

class SplitPre : public PreTokenizer {
 public:
  explicit SplitPre(const json& spec)
      : pattern_(spec.at("pattern")),
        behavior_(parse_behavior(spec.value("behavior", std::string("Isolated")))),
        invert_(spec.value("invert", false)) {}
  void split(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    for (const auto& p : pieces) split_by(pattern_, behavior_, invert_, p, out);
    pieces.swap(out);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex true).
const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPre : public PreTokenizer {
 public:
  explicit ByteLevelPre(const json& spec)
      : add_prefix_space_(spec.value("add_prefix_space", true)), use_regex_(spec.value("use_regex", true)) {
    if (use_regex_) regex_ = std::make_unique<Pattern>(json{{"Regex", kGpt2Regex}});
  }
  void split(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> cut;
    for (auto& p : pieces) {
      if (add_prefix_space_ && (p.empty() || p[0] != ' ')) p.insert(p.begin(), ' ');
      if (use_regex_) {
        split_by(*regex_, Behavior::Isolated, false, p, cut);
      } else {
        cut.push_back(std::move(p));
      }
    }
    const auto& table = byte_to_unicode();
    pieces.clear();
    for (const auto& c : cut) {
      std::string mapped;
      mapped.reserve(c.size() * 2);
      for (unsigned char b : c) mapped += table[b];
      pieces.push_back(std::move(mapped));
    }
  }

 private:
  bool add_prefix_space_, use_regex_;
  std::unique_ptr<Pattern> regex_;
};

class MetaspacePre : public PreTokenizer {
 public:
  explicit MetaspacePre(const json& spec) {
    replacement_ = spec.value("replacement", std::string("\xE2\x96\x81"));
    split_ = spec.value("split", true);
    std::string scheme = spec.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = spec.value("add_prefix_space", true) ? "always" : "never";
    if (scheme != "always" && scheme != "first" && scheme != "never")
      throw std::invalid_argument("unknown Metaspace prepend_scheme \"" + scheme + "\"");
    scheme_ = scheme;
    splitter_ = std::make_unique<Pattern>(json{{"String", replacement_}});
  }
  void split(std::vector<std::string>& pieces, bool first_section) const override {
    std::vector<std::string> out;
    for (size_t k = 0; k < pieces.size(); ++k) {
      std::string s;
      for (char c : pieces[k]) {
        if (c == ' ') {
          s += replacement_;
        } else {
          s.push_back(c);
        }
      }
      const bool prepend = scheme_ == "always" || (scheme_ == "first" && first_section && k == 0);
      if (prepend && s.compare(0, replacement_.size(), replacement_) != 0) s.insert(0, replacement_);
      if (split_) {
        split_by(*splitter_, Behavior::MergedWithNext, false, s, out);
      } else {
        out.push_back(std::move(s));
      }
    }
    pieces.swap(out);
  }

 private:
  std::string replacement_, scheme_;
  bool split_ = true;
  std::unique_ptr<Pattern> splitter_;
};

// A fixed regex with a fixed behaviour: Digits, Whitespace and WhitespaceSplit are all
// Split in disguise (Rust: char::is_numeric runs, \w+|[^\w\s]+ kept, whitespace removed).
class RegexPre : public PreTokenizer {
 public:
  RegexPre(const std::string& regex, Behavior behavior, bool invert)
      : pattern_(json{{"Regex", regex}}), behavior_(behavior), invert_(invert) {}
  void split(std::vector<std::string>& pieces, bool) const override {
    std::vector<std::string> out;
    for (const auto& p : pieces) split_by(pattern_, behavior_, invert_, p, out);
    pieces.swap(out);
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

class SequencePre : public PreTokenizer {
 public:
  explicit SequencePre(const json& spec) {
    for (const auto& s : spec.at("pretokenizers"))
      if (auto p = make_pre_tokenizer(s)) steps_.push_back(std::move(p));
  }
  void split(std::vector<std::string>& pieces, bool first_section) const override {
    for (const auto& s : steps_) s->split(pieces, first_section);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& spec) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.at("type").get<std::string>();
  if (type == "Sequence") return std::make_unique<SequencePre>(spec);
  if (type == "Split") return std::make_unique<SplitPre>(spec);
  if (type == "ByteLevel") return std::make_unique<ByteLevelPre>(spec);
  if (type == "Metaspace") return std::make_unique<MetaspacePre>(spec);
  if (type == "Digits") {  // SmolLM: individual_digits splits 123 into 1 2 3
    return spec.value("individual_digits", false) ? std::make_unique<RegexPre>("\\p{N}", Behavior::Isolated, false)
                                                  : std::make_unique<RegexPre>("\\p{N}+", Behavior::Isolated, false);
  }
  if (type == "Whitespace") return std::make_unique<RegexPre>("\\w+|[^\\w\\s]+", Behavior::Removed, true);
  if (type == "WhitespaceSplit") return std::make_unique<RegexPre>("\\s+", Behavior::Removed, false);
  throw std::invalid_argument("unsupported pre_tokenizer type \"" + type +
                              "\" (supported: Sequence, Split, ByteLevel, Metaspace, Digits, Whitespace, "
                              "WhitespaceSplit)");
}

}  // namespace bp::text
