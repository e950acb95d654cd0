// Normalizers (see normalize.h), with Hugging Face tokenizers' semantics: Prepend does nothing
// to an empty string, Replace replaces every non-overlapping match left to right.
#include "text/normalize.h"

#include <stdexcept>
#include <vector>

#include "text/pretokenize.h"
#include "text/unicode.h"

namespace bp::text {

using nlohmann::json;

namespace {

class SequenceNorm : public Normalizer {
 public:
  explicit SequenceNorm(const json& spec) {
    for (const auto& s : spec.at("normalizers"))
      if (auto n = make_normalizer(s)) steps_.push_back(std::move(n));
  }
  std::string normalize(std::string text) const override {
    for (const auto& s : steps_) text = s->normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class PrependNorm : public Normalizer {
 public:
  explicit PrependNorm(const json& spec) : prefix_(spec.at("prepend").get<std::string>()) {}
  std::string normalize(std::string text) const override { return text.empty() ? text : prefix_ + text; }

 private:
  std::string prefix_;
};

class ReplaceNorm : public Normalizer {
 public:
  explicit ReplaceNorm(const json& spec) : pattern_(spec.at("pattern")), content_(spec.value("content", "")) {}
  std::string normalize(std::string text) const override {
    std::vector<std::pair<size_t, size_t>> m;
    pattern_.find_all(text, m);
    if (m.empty()) return text;
    std::string out;
    out.reserve(text.size() + m.size() * content_.size());
    size_t prev = 0;
    for (const auto& [s, e] : m) {
      out.append(text, prev, s - prev);
      out += content_;
      prev = e;
    }
    out.append(text, prev, std::string::npos);
    return out;
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class UnicodeNorm : public Normalizer {
 public:
  explicit UnicodeNorm(NormalForm form) : form_(form) {}
  std::string normalize(std::string text) const override { return normalize_unicode(text, form_); }

 private:
  NormalForm form_;
};

class LowercaseNorm : public Normalizer {
 public:
  std::string normalize(std::string text) const override { return lowercase_unicode(text); }
};

class StripNorm : public Normalizer {
 public:
  explicit StripNorm(const json& spec)
      : left_(spec.value("strip_left", true)), right_(spec.value("strip_right", true)) {}
  std::string normalize(std::string text) const override {
    // Collect code point boundaries, then trim White_Space code points at either end.
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t i = begin;
        if (!is_unicode_whitespace(next_code_point(text, i))) break;
        begin = i;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!is_unicode_whitespace(next_code_point(text, i))) break;
        end = start;
      }
    }
    return text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& spec) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.at("type").get<std::string>();
  if (type == "Sequence") return std::make_unique<SequenceNorm>(spec);
  if (type == "Prepend") return std::make_unique<PrependNorm>(spec);
  if (type == "Replace") return std::make_unique<ReplaceNorm>(spec);
  if (type == "NFC") return std::make_unique<UnicodeNorm>(NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNorm>(NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNorm>(NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNorm>(NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNorm>();
  if (type == "Strip") return std::make_unique<StripNorm>(spec);
  throw std::invalid_argument("unsupported normalizer type \"" + type +
                              "\" (supported: Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD, Lowercase, Strip)");
}

}  // namespace bp::text
