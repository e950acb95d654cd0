// Tokenizer loading and the encode / decode pipelines (see tokenizer.h).
//
// encode: text -> added tokens with normalized=false are cut out -> each remaining stretch is
// normalized -> added tokens with normalized=true are cut out -> pre-tokenizer -> BPE per
// piece -> post-processor (TemplateProcessing) when add_special. This is the order of Hugging
// Face tokenizers and of @huggingface/tokenizers, which the parity test holds us to.
// decode: ids -> token strings (added tokens first) -> decoder chain -> optional
// clean_up_tokenization_spaces from tokenizer_config.json.
#include "text/tokenizer.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "core/error.h"
#include "core/file_read.h"
#include "text/bpe.h"
#include "text/normalize.h"
#include "text/pretokenize.h"
#include "text/tokenizer_added.h"
#include "text/tokenizer_decode.h"
#include "text/tokenizer_json.h"
#include "text/unicode.h"

namespace bp {

using nlohmann::json;
using namespace bp::text;

namespace {

[[noreturn]] void load_error(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, "[tokenizer] " + path + ": " + what, json{{"file", path}});
}

constexpr FileReader kTokenizerReader{"tokenizer", ErrorCode::DEP_MODEL_LOAD_FAILED};

std::string read_file(const std::string& path) {
  if (!std::filesystem::exists(path)) load_error(path, "cannot open file (missing or unreadable)");
  return read_file_capped(path, FileKind::Tokenizer, kTokenizerReader);
}

json read_json_file(const std::string& path) {
  json j = read_json_file_capped(path, FileKind::Tokenizer, kTokenizerReader);
  if (j.is_discarded()) load_error(path, "not valid JSON");
  return j;
}

// bos_token / eos_token may be "text" or {"content": "text", ...}; "" when null or absent.
std::string token_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(TokenizerFile file, const std::string& path);
  void apply_config(const json& config);
  void apply_generation_config(const json& gen);

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::string id_to_token(int32_t id) const override;
  int32_t token_to_id(std::string_view token) const override;
  bool is_special(int32_t id) const override { return special_ids_.count(id) > 0; }

 private:
  void encode_section(std::string_view text, bool first_section, std::vector<int32_t>& out) const;
  void parse_post_processor(const json& spec, const std::string& path);

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  TokenMap added_by_content_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  std::unordered_set<int32_t> special_ids_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // post-processor template around sequence A
  bool clean_up_spaces_ = false;
  int64_t vocab_size_ = 0;
};

HfTokenizer::HfTokenizer(TokenizerFile file, const std::string& path) {
  const json& j = file.root;
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) load_error(path, "no \"model\" object");
  const json& m = j["model"];
  const std::string type = m.value("type", std::string(m.contains("merges") ? "BPE" : ""));
  if (type != "BPE")
    load_error(path, "unsupported tokenizer model type \"" + type +
                         "\"; supported: BPE (byte-level as in GPT-2/Llama-3/Qwen, or SentencePiece-style "
                         "with byte fallback as in Llama-2/Mistral/Gemma)");
  try {
    // The SAX reader took vocab and merges out of the DOM unless their layout was unusual.
    auto vocab = file.vocab_taken ? std::move(file.vocab) : BpeModel::vocab_from_json(m);
    auto merges = file.merges_taken ? std::move(file.merges) : BpeModel::merges_from_json(m);
    model_ = std::make_unique<BpeModel>(m, std::move(vocab), std::move(merges));
    normalizer_ = make_normalizer(j.value("normalizer", json()));
    pre_tokenizer_ = make_pre_tokenizer(j.value("pre_tokenizer", json()));
  } catch (const std::exception& e) {
    load_error(path, e.what());
  }
  vocab_size_ = model_->max_id() + 1;

  // Added tokens: content is looked up before the model vocab, in both directions. Their ids may
  // reuse the model's, follow them or leave gaps (cl100k's <|endofprompt|> is 100276): every
  // table keyed by id is a hash map, so only the id's type bounds it.
  const json added_json = j.value("added_tokens", json::array());
  for (const auto& a : added_json) {
    AddedToken t;
    t.content = a.at("content").get<std::string>();
    const int64_t id = a.at("id").get<int64_t>();
    if (id < 0 || id >= INT32_MAX)
      load_error(path, "added token \"" + t.content.substr(0, 40) + "\" has the id " + std::to_string(id) +
                           ", outside 0.." + std::to_string(INT32_MAX - 1));
    t.id = static_cast<int32_t>(id);
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.single_word = a.value("single_word", false);
    t.normalized = a.value("normalized", !t.special);
    added_.push_back(std::move(t));
  }
  std::vector<std::string> raw_patterns, norm_patterns;
  std::vector<const AddedToken*> raw_tokens, norm_tokens;
  for (size_t k = 0; k < added_.size(); ++k) {
    const AddedToken& t = added_[k];
    added_by_id_[t.id] = k;
    added_by_content_.emplace(t.content, t.id);
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{t.id} + 1);
    if (t.special) special_ids_.insert(t.id);
    if (t.normalized && normalizer_) {
      norm_patterns.push_back(normalizer_->normalize(t.content));
      norm_tokens.push_back(&t);
    } else {
      raw_patterns.push_back(t.content);
      raw_tokens.push_back(&t);
    }
  }
  raw_matcher_.build(std::move(raw_patterns), std::move(raw_tokens));
  normalized_matcher_.build(std::move(norm_patterns), std::move(norm_tokens));

  try {
    decoder_ = make_decoder(j.value("decoder", json()),
                            [this](const std::string& t) { return added_by_content_.count(t) > 0; });
  } catch (const std::exception& e) {
    load_error(path, e.what());
  }
  parse_post_processor(j.value("post_processor", json()), path);
  // Without tokenizer_config.json the BOS is the template's leading special token.
  if (!prefix_ids_.empty()) bos_id_ = prefix_ids_.front();
}

void HfTokenizer::parse_post_processor(const json& spec, const std::string& path) {
  if (spec.is_null()) return;
  const std::string type = spec.value("type", std::string());
  if (type == "ByteLevel") return;  // only changes offsets
  if (type == "Sequence") {
    for (const auto& p : spec.at("processors")) parse_post_processor(p, path);
    return;
  }
  if (type == "TemplateProcessing") {
    bool seen_a = false;
    for (const auto& item : spec.at("single")) {
      if (item.contains("Sequence")) {
        seen_a = true;
        continue;
      }
      if (!item.contains("SpecialToken"))
        load_error(path, "post_processor template item " + item.dump() + " not understood");
      const std::string name = item["SpecialToken"].at("id").get<std::string>();
      const json& specials = spec.value("special_tokens", json::object());
      if (!specials.contains(name))
        load_error(path, "post_processor uses special token \"" + name + "\" it does not define");
      for (const auto& id : specials[name].at("ids")) (seen_a ? suffix_ids_ : prefix_ids_).push_back(id.get<int32_t>());
    }
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {  // [CLS] A [SEP]
    prefix_ids_.push_back(spec.at("cls").at(1).get<int32_t>());
    suffix_ids_.push_back(spec.at("sep").at(1).get<int32_t>());
    return;
  }
  load_error(path, "unsupported post_processor type \"" + type +
                       "\" (supported: TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing, Sequence)");
}

void HfTokenizer::apply_config(const json& c) {
  clean_up_spaces_ = c.value("clean_up_tokenization_spaces", true);  // transformers' historical default
  const std::string bos = token_content(c.value("bos_token", json()));
  if (c.contains("bos_token")) bos_id_ = bos.empty() ? -1 : token_to_id(bos);
  const std::string eos = token_content(c.value("eos_token", json()));
  if (!eos.empty() && token_to_id(eos) >= 0) eos_ids_ = {token_to_id(eos)};
  const std::string pad = token_content(c.value("pad_token", json()));
  pad_id_ = pad.empty() ? -1 : token_to_id(pad);
  if (c.contains("additional_special_tokens") && c["additional_special_tokens"].is_array()) {
    for (const auto& t : c["additional_special_tokens"]) {
      const int32_t id = token_to_id(token_content(t));
      if (id >= 0) special_ids_.insert(id);
    }
  }
}

void HfTokenizer::apply_generation_config(const json& g) {
  const json e = g.value("eos_token_id", json());
  auto add = [&](const json& v) {
    if (!v.is_number_integer()) return;
    const auto id = v.get<int32_t>();
    if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
  };
  if (e.is_array()) {
    for (const auto& v : e) add(v);
  } else {
    add(e);
  }
}

std::vector<int32_t> HfTokenizer::encode(std::string_view input, bool add_special) const {
  std::string lossy;
  std::string_view text = input;
  if (!is_valid_utf8(input)) {  // the regex engine and the pipeline need well-formed UTF-8
    lossy = utf8_lossy(input);
    text = lossy;
  }
  std::vector<int32_t> out;
  if (add_special) out = prefix_ids_;
  std::vector<Segment> segs;
  raw_matcher_.split(text, segs);
  for (size_t k = 0; k < segs.size(); ++k) {
    const Segment& s = segs[k];
    if (s.token >= 0) {
      out.push_back(raw_matcher_.token(s.token).id);
    } else {
      encode_section(text.substr(s.start, s.end - s.start), k == 0, out);
    }
  }
  if (add_special) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

void HfTokenizer::encode_section(std::string_view text, bool first_section, std::vector<int32_t>& out) const {
  const std::string norm = normalizer_ ? normalizer_->normalize(std::string(text)) : std::string(text);
  std::vector<Segment> segs;
  normalized_matcher_.split(norm, segs);
  std::vector<std::string> pieces;
  for (const Segment& s : segs) {
    if (s.token >= 0) {
      out.push_back(normalized_matcher_.token(s.token).id);
      continue;
    }
    pieces.assign(1, norm.substr(s.start, s.end - s.start));
    if (pre_tokenizer_) pre_tokenizer_->split(pieces, first_section);
    for (const auto& p : pieces) model_->encode(p, out);
  }
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    auto it = added_by_id_.find(id);
    if (it != added_by_id_.end()) {
      tokens.push_back(added_[it->second].content);
    } else if (const std::string* t = model_->id_to_token(id)) {
      tokens.push_back(*t);
    }  // ids outside the vocab (e.g. padded embedding rows) decode to nothing
  }
  std::string text;
  if (decoder_) {
    decoder_->decode_chain(tokens);
    for (const auto& t : tokens) text += t;
  } else {
    for (size_t k = 0; k < tokens.size(); ++k) text += (k ? " " : "") + tokens[k];
  }
  return clean_up_spaces_ ? clean_up_tokenization(std::move(text)) : text;
}

std::string HfTokenizer::id_to_token(int32_t id) const {
  auto it = added_by_id_.find(id);
  if (it != added_by_id_.end()) return added_[it->second].content;
  const std::string* t = model_->id_to_token(id);
  return t ? *t : std::string();
}

int32_t HfTokenizer::token_to_id(std::string_view token) const {
  auto it = added_by_content_.find(token);
  return it != added_by_content_.end() ? it->second : model_->token_to_id(token);
}

// Builds the tokenizer; malformed fields (wrong JSON types, missing keys) become
// DEP_MODEL_LOAD_FAILED naming the file.
std::unique_ptr<HfTokenizer> tokenizer_from_text(const std::string& text, const std::string& path) {
  // The SAX reader builds a DOM of everything but vocab and merges: bound its depth first.
  check_json_depth(text, path, "tokenizer");
  try {
    return std::make_unique<HfTokenizer>(parse_tokenizer_json(text), path);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    load_error(path, e.what());
  }
}

std::unique_ptr<HfTokenizer> load_tokenizer(const std::string& path) {
  return tokenizer_from_text(read_file(path), path);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_json_text(const std::string& text, const std::string& source) {
  return tokenizer_from_text(text, source);
}

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& path) {
  return load_tokenizer(path);
}

std::unique_ptr<Tokenizer> Tokenizer::from_dir(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const std::string tok_path = (fs::path(model_dir) / "tokenizer.json").string();
  auto tok = load_tokenizer(tok_path);
  const fs::path config = fs::path(model_dir) / "tokenizer_config.json";
  if (fs::exists(config)) {
    const json c = read_json_file(config.string());
    if (!c.is_object()) load_error(config.string(), "expected a JSON object");
    try {
      tok->apply_config(c);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      load_error(config.string(), e.what());
    }
    tok->template_source_ = read_model_chat_template(model_dir, c);
  } else {
    tok->template_source_ = read_model_chat_template(model_dir, json());
  }
  const fs::path gen = fs::path(model_dir) / "generation_config.json";
  if (fs::exists(gen)) {
    const json g = read_json_file(gen.string());
    if (g.is_object()) tok->apply_generation_config(g);
  }
  return tok;
}

namespace {
// The largest character boundary <= n in text (UTF-8 continuation bytes are not boundaries).
size_t char_boundary(std::string_view text, size_t n) {
  if (n >= text.size()) return text.size();
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return n;
}
}  // namespace

std::vector<int32_t> encode_prefix(const Tokenizer& tok, std::string_view text, bool add_special, size_t keep,
                                   bool* cut) {
  *cut = false;
  // A token spans a few bytes on average; texts up to 16 bytes per kept token are encoded whole.
  size_t bytes = std::max<size_t>(4096, keep * 16);
  if (keep == 0 || text.size() <= bytes) return tok.encode(text, add_special);
  const size_t need = keep + 1;
  for (;;) {
    const size_t end = char_boundary(text, bytes);
    if (end >= text.size()) return tok.encode(text, add_special);
    std::vector<int32_t> a = tok.encode(text.substr(0, end), add_special);
    // The last tokens of a prefix may differ from the whole text's (a word cut in two), so the
    // prefix must reach well past `need`, and a prefix twice as long must agree on the first `need`.
    if (a.size() > need + 16) {
      const size_t end2 = char_boundary(text, end * 2);
      std::vector<int32_t> b =
          end2 >= text.size() ? tok.encode(text, add_special) : tok.encode(text.substr(0, end2), add_special);
      if (b.size() >= need && std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(need), b.begin())) {
        a.resize(need);
        *cut = true;
        return a;
      }
    }
    bytes = end * 2;
  }
}

}  // namespace bp
