// Decoders (see tokenizer_decode.h). Invalid UTF-8 produced by byte tokens becomes U+FFFD with
// the maximal-subpart rule, like TextDecoder in @huggingface/tokenizers.
#include "text/tokenizer_decode.h"

#include <stdexcept>

#include "text/pretokenize.h"
#include "text/unicode.h"

namespace bp::text {

using nlohmann::json;

namespace {

class ByteLevelDec : public Decoder {
 public:
  explicit ByteLevelDec(std::function<bool(const std::string&)> is_added) : is_added_(std::move(is_added)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&] {
      if (!bytes.empty()) out.push_back(utf8_lossy(bytes));
      bytes.clear();
    };
    for (const auto& t : tokens) {
      if (is_added_ && is_added_(t)) {
        flush();
        out.push_back(t);
        continue;
      }
      for (size_t i = 0; i < t.size();) {
        const size_t start = i;
        const int b = unicode_to_byte(next_code_point(t, i));
        if (b >= 0) {
          bytes.push_back(static_cast<char>(b));
        } else {
          bytes.append(t, start, i - start);  // not in the alphabet: keep the character
        }
      }
    }
    flush();
    tokens.swap(out);
  }

 private:
  std::function<bool(const std::string&)> is_added_;
};

class ReplaceDec : public Decoder {
 public:
  explicit ReplaceDec(const json& spec) : pattern_(spec.at("pattern")), content_(spec.value("content", "")) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::pair<size_t, size_t>> m;
    for (auto& t : tokens) {
      m.clear();
      pattern_.find_all(t, m);
      if (m.empty()) continue;
      std::string r;
      size_t prev = 0;
      for (const auto& [s, e] : m) {
        r.append(t, prev, s - prev);
        r += content_;
        prev = e;
      }
      r.append(t, prev, std::string::npos);
      t = std::move(r);
    }
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// A token "<0xNN>" -> its byte, else -1.
int byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

class ByteFallbackDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    bool pending = false;
    for (auto& t : tokens) {
      const int b = byte_token(t);
      if (b >= 0) {
        bytes.push_back(static_cast<char>(b));
        pending = true;
        continue;
      }
      if (pending) out.push_back(utf8_lossy(bytes));
      bytes.clear();
      pending = false;
      out.push_back(std::move(t));
    }
    if (pending) out.push_back(utf8_lossy(bytes));
    tokens.swap(out);
  }
};

class FuseDec : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDec : public Decoder {
 public:
  explicit StripDec(const json& spec)
      : content_(spec.value("content", " ")), start_(spec.value("start", 0)), stop_(spec.value("stop", 0)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (content_.empty()) return;
    for (auto& t : tokens) {
      size_t begin = 0, end = t.size();
      for (int k = 0; k < start_ && t.compare(begin, content_.size(), content_) == 0; ++k) begin += content_.size();
      for (int k = 0; k < stop_ && end >= begin + content_.size() &&
                      t.compare(end - content_.size(), content_.size(), content_) == 0;
           ++k)
        end -= content_.size();
      t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  int start_, stop_;
};

class MetaspaceDec : public Decoder {
 public:
  explicit MetaspaceDec(const json& spec) {
    replacement_ = spec.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = spec.value("prepend_scheme", std::string());
    strip_first_ = scheme.empty() ? spec.value("add_prefix_space", true) : scheme != "never";
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string r;
      const std::string& t = tokens[i];
      for (size_t p = 0; p < t.size();) {
        if (t.compare(p, replacement_.size(), replacement_) == 0) {
          r.push_back(' ');
          p += replacement_.size();
        } else {
          r.push_back(t[p++]);
        }
      }
      if (i == 0 && strip_first_ && !r.empty() && r[0] == ' ') r.erase(0, 1);
      tokens[i] = std::move(r);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_ = true;
};

class SequenceDec : public Decoder {
 public:
  SequenceDec(const json& spec, const std::function<bool(const std::string&)>& is_added) {
    for (const auto& d : spec.at("decoders"))
      if (auto p = make_decoder(d, is_added)) steps_.push_back(std::move(p));
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& s : steps_) s->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& spec, std::function<bool(const std::string&)> is_added) {
  if (spec.is_null()) return nullptr;
  const std::string type = spec.at("type").get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelDec>(std::move(is_added));
  if (type == "Replace") return std::make_unique<ReplaceDec>(spec);
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDec>();
  if (type == "Fuse") return std::make_unique<FuseDec>();
  if (type == "Strip") return std::make_unique<StripDec>(spec);
  if (type == "Metaspace") return std::make_unique<MetaspaceDec>(spec);
  if (type == "Sequence") return std::make_unique<SequenceDec>(spec, is_added);
  throw std::invalid_argument("unsupported decoder type \"" + type +
                              "\" (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence)");
}

std::string clean_up_tokenization(std::string text) {
  // Same replacements, in the same order, as transformers / @huggingface/tokenizers.
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) replace_all(text, from, to);
  return text;
}

}  // namespace bp::text
