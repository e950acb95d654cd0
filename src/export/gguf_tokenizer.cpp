// tokenizer.json -> tokenizer.ggml.* (contract and rules in export/gguf_tokenizer.h).
#include "export/gguf_tokenizer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "core/file_read.h"

namespace bp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

[[noreturn]] void fail(const std::string& msg) {
  throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, "[gguf tokenizer] " + msg);
}

json read_json(const fs::path& p, bool required) {
  std::error_code ec;
  if (!fs::exists(p, ec)) {
    if (required) fail(fmt::format("cannot read {}", p.string()));
    return json::object();
  }
  json j = read_json_file_capped(p.string(), FileKind::Tokenizer, {"gguf tokenizer", ErrorCode::DEP_MODEL_LOAD_FAILED});
  if (j.is_discarded()) fail(fmt::format("{} is not valid JSON", p.string()));
  return j;
}

// "<s>" or {"content": "<s>", ...} or null.
std::string token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

bool contains_type(const json& j, const std::string& type) {
  if (j.is_object()) {
    if (j.value("type", std::string()) == type) return true;
    for (const auto& [k, v] : j.items())
      if (contains_type(v, type)) return true;
  } else if (j.is_array()) {
    for (const auto& v : j)
      if (contains_type(v, type)) return true;
  }
  return false;
}

// A TemplateProcessing whose single-sequence template starts with a special token adds BOS.
int post_processor_adds_bos(const json& pp) {
  if (pp.is_object() && pp.value("type", std::string()) == "TemplateProcessing") {
    const auto& single = pp.value("single", json::array());
    return !single.empty() && single[0].contains("SpecialToken") ? 1 : 0;
  }
  if (pp.is_object() && pp.contains("processors"))
    for (const auto& p : pp["processors"]) {
      const int r = post_processor_adds_bos(p);
      if (r >= 0) return r;
    }
  return -1;  // unknown
}

bool is_byte_token(const std::string& s) {
  return s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' &&
         std::isxdigit(static_cast<unsigned char>(s[3])) && std::isxdigit(static_cast<unsigned char>(s[4]));
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

GGUFTokenizer read_gguf_tokenizer(const std::string& dir, const ModelConfig& config) {
  const json tj = read_json(fs::path(dir) / "tokenizer.json", true);
  const json cj = read_json(fs::path(dir) / "tokenizer_config.json", false);
  const json& model = tj.value("model", json::object());
  if (model.value("type", std::string()) != "BPE")
    fail(
        fmt::format("{}/tokenizer.json has model type '{}'; GGUF export supports BPE tokenizers (SentencePiece-style "
                    "or byte-level)",
                    dir, model.value("type", std::string("?"))));
  GGUFTokenizer t;
  const bool byte_level = contains_type(tj.value("pre_tokenizer", json()), "ByteLevel") ||
                          contains_type(tj.value("decoder", json()), "ByteLevel");
  t.model = byte_level ? "gpt2" : "llama";

  // id -> text, from the vocab and the added tokens (which may extend past it).
  std::map<int64_t, std::string> by_id;
  const json vocab = model.value("vocab", json::object());  // a named copy: items() must not outlive it
  for (const auto& [text, id] : vocab.items()) by_id[id.get<int64_t>()] = text;
  std::unordered_map<int64_t, bool> special;  // added tokens: id -> special?
  for (const auto& a : tj.value("added_tokens", json::array())) {
    const int64_t id = a.value("id", int64_t{-1});
    by_id[id] = a.value("content", std::string());
    special[id] = a.value("special", false);
  }
  if (by_id.empty() || by_id.begin()->first < 0) fail(fmt::format("{}/tokenizer.json has no usable vocabulary", dir));
  const int64_t n_tok = by_id.rbegin()->first + 1;
  const int64_t n_vocab = std::max<int64_t>(config.vocab_size, n_tok);
  if (config.vocab_size > 0 && n_tok > config.vocab_size)
    fail(fmt::format("tokenizer has {} tokens but the model's vocab_size is {}", n_tok, config.vocab_size));

  // Merges: "a b" strings or ["a", "b"] pairs.
  std::vector<std::string> merges;
  for (const auto& m : model.value("merges", json::array())) {
    if (m.is_string())
      merges.push_back(m.get<std::string>());
    else if (m.is_array() && m.size() == 2)
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    else
      fail("tokenizer.json has a merge that is neither \"a b\" nor [a, b]");
  }
  std::unordered_map<std::string, int64_t> merge_rank;  // joined token -> best (lowest) rank
  if (t.model == "llama")
    for (size_t r = 0; r < merges.size(); ++r) {
      const auto sp = merges[r].find(' ');
      std::string joined = merges[r].substr(0, sp) + merges[r].substr(sp + 1);
      merge_rank.emplace(std::move(joined), static_cast<int64_t>(r));
    }

  std::string unk = token_text(cj.value("unk_token", json()));
  if (unk.empty() && model.value("unk_token", json()).is_string()) unk = model["unk_token"].get<std::string>();
  t.tokens.resize(static_cast<size_t>(n_vocab));
  t.scores.assign(static_cast<size_t>(n_vocab), 0.0f);
  t.token_types.assign(static_cast<size_t>(n_vocab), static_cast<int32_t>(GGUFTokenType::Normal));
  const float below_merges = -static_cast<float>(merges.size()) - 1.0f;
  for (int64_t id = 0; id < n_vocab; ++id) {
    auto& text = t.tokens[static_cast<size_t>(id)];
    auto& type = t.token_types[static_cast<size_t>(id)];
    auto& score = t.scores[static_cast<size_t>(id)];
    auto it = by_id.find(id);
    if (it == by_id.end()) {
      text = fmt::format("[PAD{}]", id);
      type = static_cast<int32_t>(GGUFTokenType::Unused);
      score = t.model == "llama" ? -1000.0f : 0.0f;
      continue;
    }
    text = it->second;
    if (auto s = special.find(id); s != special.end())
      type = static_cast<int32_t>(s->second ? GGUFTokenType::Control : GGUFTokenType::UserDefined);
    if (t.model == "llama") {
      if (!unk.empty() && text == unk)
        type = static_cast<int32_t>(GGUFTokenType::Unknown);
      else if (is_byte_token(text) && special.find(id) == special.end())
        type = static_cast<int32_t>(GGUFTokenType::Byte);
      if (auto r = merge_rank.find(text); r != merge_rank.end())
        score = -static_cast<float>(r->second);
      else if (type == static_cast<int32_t>(GGUFTokenType::Normal) && utf8_length(text) > 1)
        score = below_merges;
    }
  }
  if (t.model == "gpt2") {
    t.merges = std::move(merges);
    if (const char* pre = arch_info(config.arch).gguf_tokenizer_pre; pre[0] != '\0')
      t.pre = pre;
    else if (n_tok >= 128000 && by_id.count(128000) && by_id[128000] == "<|begin_of_text|>")
      t.pre = "llama-bpe";
    else
      t.pre = "default";
  }

  // Special ids: tokenizer_config first, config.json as the fallback.
  std::unordered_map<std::string, int32_t> id_of;
  for (const auto& [id, text] : by_id) id_of.emplace(text, static_cast<int32_t>(id));
  auto lookup = [&](const char* key) {
    const std::string s = token_text(cj.value(key, json()));
    auto it = id_of.find(s);
    return s.empty() || it == id_of.end() ? -1 : it->second;
  };
  t.bos_id = lookup("bos_token");
  t.eos_id = lookup("eos_token");
  t.pad_id = lookup("pad_token");
  t.unk_id = unk.empty() || !id_of.count(unk) ? -1 : id_of[unk];
  if (t.bos_id < 0 && config.bos_token_id >= 0 && t.model == "llama") t.bos_id = config.bos_token_id;
  if (t.eos_id < 0 && !config.eos_token_ids.empty()) t.eos_id = config.eos_token_ids.front();
  // add_bos: tokenizer_config, else the post-processor's template, else llama.cpp's own default
  // (true for SentencePiece vocabularies and for Llama-3's "llama-bpe").
  const int pp_bos = post_processor_adds_bos(tj.value("post_processor", json()));
  if (cj.contains("add_bos_token") && cj["add_bos_token"].is_boolean())
    t.add_bos = cj["add_bos_token"].get<bool>();
  else if (pp_bos >= 0)
    t.add_bos = pp_bos == 1;
  else
    t.add_bos = t.model == "llama" || t.pre == "llama-bpe";
  t.add_eos = cj.value("add_eos_token", false) && cj["add_eos_token"].is_boolean();
  if (t.bos_id < 0) t.add_bos = false;

  // The chat template is not read here: the caller passes the one text/chat_template_source.h reads
  // (the same reader training uses), so the exported model is served with what it was trained on.

  auto add_end = [&](int64_t id) {
    if (id < 0 || id >= n_vocab) return;
    const std::string& s = t.tokens[static_cast<size_t>(id)];
    if (std::find(t.end_tokens.begin(), t.end_tokens.end(), s) == t.end_tokens.end()) t.end_tokens.push_back(s);
  };
  add_end(t.eos_id);
  for (int32_t id : config.eos_token_ids) add_end(id);
  return t;
}

void add_tokenizer_metadata(GGUFWriter& w, const GGUFTokenizer& t) {
  w.set("tokenizer.ggml.model", GGUFValue::str(t.model));
  if (!t.pre.empty()) w.set("tokenizer.ggml.pre", GGUFValue::str(t.pre));
  w.set("tokenizer.ggml.tokens", GGUFValue::strings(t.tokens));
  w.set("tokenizer.ggml.scores", GGUFValue::f32s(t.scores));
  w.set("tokenizer.ggml.token_type", GGUFValue::i32s(t.token_types));
  if (!t.merges.empty()) w.set("tokenizer.ggml.merges", GGUFValue::strings(t.merges));
  if (t.bos_id >= 0) w.set("tokenizer.ggml.bos_token_id", GGUFValue::u32(static_cast<uint32_t>(t.bos_id)));
  if (t.eos_id >= 0) w.set("tokenizer.ggml.eos_token_id", GGUFValue::u32(static_cast<uint32_t>(t.eos_id)));
  if (t.unk_id >= 0) w.set("tokenizer.ggml.unknown_token_id", GGUFValue::u32(static_cast<uint32_t>(t.unk_id)));
  if (t.pad_id >= 0) w.set("tokenizer.ggml.padding_token_id", GGUFValue::u32(static_cast<uint32_t>(t.pad_id)));
  w.set("tokenizer.ggml.add_bos_token", GGUFValue::boolean(t.add_bos));
  w.set("tokenizer.ggml.add_eos_token", GGUFValue::boolean(t.add_eos));
  if (!t.chat_template.empty()) w.set("tokenizer.chat_template", GGUFValue::str(t.chat_template));
}

}  // namespace bp
