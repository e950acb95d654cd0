// Fast reader for tokenizer.json. The file is mostly model.vocab (up to 262k entries for
// Gemma-3) and model.merges (up to 515k); building a JSON DOM for those and then copying them
// doubles the load time, so a SAX pass moves them straight into vectors and builds a DOM only
// for the rest (normalizer, pre_tokenizer, added_tokens, ...).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace bp::text {

struct TokenizerFile {
  nlohmann::json root;  // the whole file, with model.vocab = {} and model.merges = [] when taken out
  std::vector<std::pair<std::string, int64_t>> vocab;       // model.vocab when it is an object
  std::vector<std::pair<std::string, std::string>> merges;  // model.merges ("a b" or ["a", "b"])
  bool vocab_taken = false, merges_taken = false;
};

// Parses JSON text. Throws std::invalid_argument with the parser's message on malformed JSON.
TokenizerFile parse_tokenizer_json(const std::string& text);

}  // namespace bp::text
