// Normalizers of tokenizer.json, applied to each stretch of text between added tokens before
// pre-tokenization. Supported: Sequence, Prepend, Replace (String or Regex pattern),
// NFC/NFD/NFKC/NFKD (ICU), Lowercase, Strip.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace bp::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string text) const = 0;
};

// nullptr for JSON null. Throws std::invalid_argument naming an unsupported type.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec);

}  // namespace bp::text
