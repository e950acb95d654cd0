// Decoders of tokenizer.json: turn token strings back into text. Supported: ByteLevel,
// Replace, ByteFallback, Fuse, Strip, Metaspace and Sequence of them. Each works on the list of
// token strings (decode_chain), as in Hugging Face tokenizers; the text is the concatenation.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace bp::text {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// `is_added(token)` tells the ByteLevel decoder which tokens are added tokens: those are copied
// verbatim instead of being mapped back through the byte alphabet. nullptr for JSON null.
// Throws std::invalid_argument naming an unsupported type.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& spec, std::function<bool(const std::string&)> is_added);

// transformers' clean_up_tokenization: " ." -> "." and friends (applied when
// tokenizer_config.json asks for clean_up_tokenization_spaces).
std::string clean_up_tokenization(std::string text);

}  // namespace bp::text
