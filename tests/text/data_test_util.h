// Header-only helpers for the chat-template and dataset tests:
//  - FakeTokenizer: byte-level ids (0..255) plus whole special tokens (ids 256+), so tests of
//    loss masks, datasets and packing do not depend on the real BPE tokenizer.
//  - masked_spans: the decoded runs of trained tokens of a tokenized conversation.
//  - render_with_oracle: renders templates with @huggingface/jinja through
//    tests/oracles/render_template.mjs. A missing node or package makes the calling test FAIL.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace bp::test {

class FakeTokenizer : public Tokenizer {
 public:
  explicit FakeTokenizer(std::vector<std::string> specials = {}, std::string chat_template = "", int bos = -1,
                         int eos = -1)
      : specials_(std::move(specials)) {
    if (!chat_template.empty())
      template_source_ = {ChatTemplateSource::Kind::ModelConfigKey, std::move(chat_template), "(test)"};
    bos_id_ = bos >= 0 ? 256 + bos : -1;
    if (eos >= 0) eos_ids_ = {256 + eos};
  }
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const override {
    std::vector<int32_t> ids;
    if (add_special && bos_id_ >= 0) ids.push_back(bos_id_);
    size_t i = 0;
    while (i < text.size()) {
      bool matched = false;
      for (size_t s = 0; s < specials_.size(); ++s)
        if (!specials_[s].empty() && text.substr(i, specials_[s].size()) == specials_[s]) {
          ids.push_back(static_cast<int32_t>(256 + s));
          i += specials_[s].size();
          matched = true;
          break;
        }
      if (!matched) ids.push_back(static_cast<unsigned char>(text[i++]));
    }
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const override {
    std::string s;
    for (int32_t id : ids) s += id_to_token(id);
    return s;
  }
  int64_t vocab_size() const override { return 256 + static_cast<int64_t>(specials_.size()); }
  std::string id_to_token(int32_t id) const override {
    return id < 256 ? std::string(1, static_cast<char>(id)) : specials_.at(static_cast<size_t>(id - 256));
  }
  int32_t token_to_id(std::string_view token) const override {
    for (size_t s = 0; s < specials_.size(); ++s)
      if (specials_[s] == token) return static_cast<int32_t>(256 + s);
    return token.size() == 1 ? static_cast<unsigned char>(token[0]) : -1;
  }
  bool is_special(int32_t id) const override { return id >= 256; }

 private:
  std::vector<std::string> specials_;
};

inline std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::string template_path(const std::string& name) {
  return source_dir() + "/tests/text/data/templates/" + name + ".jinja";
}

// request: {"template":..., "contexts":[...]} or {"cases":[...]}. Returns the oracle's result
// array; on a missing oracle it records a test failure with the reason and returns [].
inline nlohmann::ordered_json render_with_oracle(const nlohmann::ordered_json& request) {
  TempDir dir;
  const std::string req = dir.path + "/request.json";
  std::ofstream(req) << request.dump();
  const std::string oracles = source_dir() + "/tests/oracles";
  std::string out;
  const int rc = run_command("cd '" + oracles + "' && node render_template.mjs '" + req + "' 2>&1", &out);
  if (rc != 0) {
    ADD_FAILURE() << "Jinja oracle failed (needs `node` and @huggingface/jinja in tests/oracles/node_modules; "
                     "run `npm ci` there). Exit code "
                  << rc << ", output:\n"
                  << out;
    return nlohmann::ordered_json::array();
  }
  return nlohmann::ordered_json::parse(out);
}

// Writes `content` to dir/name byte for byte; returns the path.
inline std::string write_file(const TempDir& dir, const std::string& name, const std::string& content) {
  const std::string path = dir.path + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

// The decoded text of each maximal run of loss-masked tokens.
inline std::vector<std::string> masked_spans(const Tokenizer& tok, const TokenizedConversation& tc) {
  std::vector<std::string> spans;
  std::vector<int32_t> cur;
  for (size_t t = 0; t <= tc.ids.size(); ++t) {
    if (t < tc.ids.size() && tc.loss_mask[t]) {
      cur.push_back(tc.ids[t]);
    } else if (!cur.empty()) {
      spans.push_back(tok.decode(cur));
      cur.clear();
    }
  }
  return spans;
}

// The issues of `ds`, in file order, are exactly these (line, problem) pairs, each with a message.
inline void expect_issues(const LoadedDataset& ds, const std::vector<std::pair<int64_t, RowProblem>>& expected) {
  ASSERT_EQ(ds.issues.size(), expected.size());
  for (size_t k = 0; k < expected.size(); ++k) {
    SCOPED_TRACE(ds.issues[k].message);
    EXPECT_EQ(ds.issues[k].line, expected[k].first);
    EXPECT_EQ(ds.issues[k].problem, expected[k].second);
    EXPECT_FALSE(ds.issues[k].message.empty());
  }
}

}  // namespace bp::test
