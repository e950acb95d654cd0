// BPE model and merge loop (see bpe.h).
#include "text/bpe.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <queue>
#include <stdexcept>

#include "text/unicode.h"

namespace bp::text {

using nlohmann::json;

namespace {

std::string optional_string(const json& model, const char* key) {
  auto it = model.find(key);
  return it == model.end() || it->is_null() ? std::string() : it->get<std::string>();
}

}  // namespace

BpeModel::Vocab BpeModel::vocab_from_json(const json& model) {
  const json& vocab = model.at("vocab");
  if (!vocab.is_object()) throw std::invalid_argument("model.vocab must be an object of token -> id");
  BpeModel::Vocab out;
  out.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) out.emplace_back(it.key(), it.value().get<int64_t>());
  return out;
}

BpeModel::Merges BpeModel::merges_from_json(const json& model) {
  BpeModel::Merges out;
  for (const auto& m : model.at("merges")) {
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) throw std::invalid_argument("merge \"" + s + "\" has no space");
      out.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2) {
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      throw std::invalid_argument("merge " + m.dump() + " is neither \"a b\" nor [a, b]");
    }
  }
  return out;
}

BpeModel::BpeModel(const json& model, Vocab vocab, Merges merges) {
  if (model.contains("vocab") && !model["vocab"].is_object())
    throw std::invalid_argument("model.vocab must be an object of token -> id");
  vocab_.reserve(vocab.size() * 2);
  for (auto& [tok, id] : vocab) {
    if (id < 0 || id >= INT32_MAX)
      throw std::invalid_argument("model.vocab gives \"" + tok.substr(0, 40) + "\" the id " + std::to_string(id) +
                                  ", outside 0.." + std::to_string(INT32_MAX - 1));
    max_id_ = std::max(max_id_, id);
    vocab_.emplace(std::move(tok), static_cast<int32_t>(id));
  }
  vocab = Vocab();
  tokens_.reserve(vocab_.size());
  for (const auto& [tok, id] : vocab_) tokens_.emplace(id, &tok);

  continuing_prefix_ = optional_string(model, "continuing_subword_prefix");
  end_of_word_suffix_ = optional_string(model, "end_of_word_suffix");
  const std::string unk = optional_string(model, "unk_token");
  unk_id_ = unk.empty() ? -1 : token_to_id(unk);
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);
  ignore_merges_ = model.value("ignore_merges", false);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = token_to_id(name);
  }

  merges_.reserve(merges.size() * 2);
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const int32_t a = token_to_id(left), b = token_to_id(right);
    if (a < 0 || b < 0) continue;  // a merge whose parts are missing can never apply
    merged.assign(left);
    const bool prefixed =
        !continuing_prefix_.empty() && right.compare(0, continuing_prefix_.size(), continuing_prefix_) == 0;
    merged.append(right, prefixed ? continuing_prefix_.size() : 0, std::string::npos);
    const int32_t c = token_to_id(merged);
    if (c >= 0) merges_.try_emplace(pair_key(a, b), Merge{static_cast<int32_t>(rank), c});
  }
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  auto it = tokens_.find(id);
  return it == tokens_.end() ? nullptr : it->second;
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    const int32_t id = token_to_id(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(piece.size());
  bool last_unk = false;
  auto push = [&](int32_t id) {
    const int32_t n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, -1, true});
    if (n > 0) sym[n - 1].next = n;
  };
  std::string buf;
  for (size_t i = 0; i < piece.size();) {
    const size_t start = i;
    i += utf8_len(static_cast<unsigned char>(piece[i]));
    if (i > piece.size()) i = piece.size();
    const std::string_view ch = piece.substr(start, i - start);
    int32_t id;
    if (continuing_prefix_.empty() && end_of_word_suffix_.empty()) {
      id = token_to_id(ch);
    } else {
      buf.assign(start > 0 ? continuing_prefix_ : std::string());
      buf.append(ch);
      if (i == piece.size()) buf += end_of_word_suffix_;
      id = token_to_id(buf);
    }
    if (id >= 0) {
      push(id);
      last_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : ch) all = all && byte_ids_[b] >= 0;
      if (all) {
        for (unsigned char b : ch) push(byte_ids_[b]);
        last_unk = false;
        continue;
      }
    }
    if (unk_id_ < 0) continue;  // no unk token: the character is dropped (as HF does)
    if (fuse_unk_ && last_unk) continue;
    push(unk_id_);
    last_unk = true;
  }

  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t pos) {
    const int32_t nx = sym[pos].next;
    if (nx < 0) return;
    auto it = merges_.find(pair_key(sym[pos].id, sym[nx].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int32_t k = 0; k + 1 < static_cast<int32_t>(sym.size()); ++k) consider(k);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& s = sym[top.pos];
    if (!s.alive || s.next < 0) continue;
    auto it = merges_.find(pair_key(s.id, sym[s.next].id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale entry
    Symbol& r = sym[s.next];
    s.id = top.new_id;
    r.alive = false;
    s.next = r.next;
    if (r.next >= 0) sym[r.next].prev = top.pos;
    if (s.prev >= 0) consider(s.prev);
    consider(top.pos);
  }
  for (int32_t k = sym.empty() ? -1 : 0; k >= 0; k = sym[k].next) out.push_back(sym[k].id);
}

}  // namespace bp::text
