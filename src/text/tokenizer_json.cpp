// SAX reader for tokenizer.json (see tokenizer_json.h).
#include "text/tokenizer_json.h"

#include <stdexcept>

namespace bp::text {

using nlohmann::json;

namespace {

class TokenizerSax {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  explicit TokenizerSax(TokenizerFile& out) : out_(out), dom_(out.root, /*allow_exceptions=*/false) {}

  bool null() { return mode_ == Mode::None ? dom_.null() : bad("null"); }
  bool boolean(bool v) { return mode_ == Mode::None ? dom_.boolean(v) : bad("a boolean"); }
  bool number_integer(number_integer_t v) {
    if (mode_ == Mode::Vocab) return v >= 0 ? vocab_entry(v) : bad("a negative id");
    return mode_ == Mode::None ? dom_.number_integer(v) : bad("a number");
  }
  bool number_unsigned(number_unsigned_t v) {
    if (mode_ == Mode::Vocab) return vocab_entry(static_cast<int64_t>(v));
    return mode_ == Mode::None ? dom_.number_unsigned(v) : bad("a number");
  }
  bool number_float(number_float_t v, const string_t& s) {
    return mode_ == Mode::None ? dom_.number_float(v, s) : bad("a float");
  }
  bool binary(binary_t& v) { return mode_ == Mode::None ? dom_.binary(v) : bad("binary"); }
  bool string(string_t& s) {
    if (mode_ == Mode::None) return dom_.string(s);
    if (mode_ == Mode::Vocab) return bad("a string value");
    if (in_pair_) {  // ["a", "b"]
      if (part_ == 0) {
        left_ = std::move(s);
      } else if (part_ == 1) {
        out_.merges.emplace_back(std::move(left_), std::move(s));
      } else {
        return bad("a merge with more than two parts");
      }
      ++part_;
      return true;
    }
    const size_t sp = s.find(' ');
    if (sp == std::string::npos) return bad("the merge \"" + s + "\" without a space");
    out_.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    return true;
  }
  bool start_object(std::size_t n) {
    if (mode_ != Mode::None) return bad("a nested object");
    if (at_model_field("vocab")) {
      mode_ = Mode::Vocab;
      out_.vocab_taken = true;
      return dom_.start_object(0);
    }
    keys_.emplace_back();
    return dom_.start_object(n);
  }
  bool key(string_t& k) {
    if (mode_ == Mode::Vocab) {
      pending_key_ = std::move(k);
      return true;
    }
    keys_.back() = k;
    return dom_.key(k);
  }
  bool end_object() {
    if (mode_ == Mode::Vocab) {
      mode_ = Mode::None;
      return dom_.end_object();
    }
    keys_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (mode_ == Mode::Vocab) return bad("an array");
    if (mode_ == Mode::Merges) {
      if (in_pair_) return bad("a nested array");
      in_pair_ = true;
      part_ = 0;
      return true;
    }
    if (at_model_field("merges")) {
      mode_ = Mode::Merges;
      out_.merges_taken = true;
      return dom_.start_array(0);
    }
    keys_.emplace_back();
    return dom_.start_array(n);
  }
  bool end_array() {
    if (mode_ == Mode::Merges) {
      if (in_pair_) {
        in_pair_ = false;
        return part_ == 2 ? true : bad("a merge with fewer than two parts");
      }
      mode_ = Mode::None;
      return dom_.end_array();
    }
    keys_.pop_back();
    return dom_.end_array();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    error_ = e.what();
    return false;
  }
  const std::string& error() const { return error_; }

 private:
  enum class Mode { None, Vocab, Merges };
  bool at_model_field(const char* name) const { return keys_.size() == 2 && keys_[0] == "model" && keys_[1] == name; }
  bool vocab_entry(int64_t id) {
    out_.vocab.emplace_back(std::move(pending_key_), id);
    return true;
  }
  bool bad(const std::string& what) {
    error_ = std::string("unexpected ") + what + " in model." + (mode_ == Mode::Vocab ? "vocab" : "merges");
    return false;
  }

  TokenizerFile& out_;
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::vector<std::string> keys_;  // last key of each open container ("" for arrays)
  Mode mode_ = Mode::None;
  std::string pending_key_, left_, error_;
  bool in_pair_ = false;
  int part_ = 0;
};

}  // namespace

TokenizerFile parse_tokenizer_json(const std::string& text) {
  TokenizerFile out;
  TokenizerSax sax(out);
  const bool ok = json::sax_parse(text, &sax, json::input_format_t::json, /*strict=*/true);
  if (!ok) throw std::invalid_argument("not valid JSON: " + (sax.error().empty() ? "parse failed" : sax.error()));
  return out;
}

}  // namespace bp::text
