// Tokenizer metadata for GGUF (tokenizer.ggml.*), read directly from a Hugging Face tokenizer.json
// and tokenizer_config.json (and chat_template.jinja when present).
//
//   model "llama": SentencePiece-style BPE (byte_fallback, "▁" spaces; Llama-2, Mistral, Gemma).
//                  scores: llama.cpp's SPM tokenizer merges the adjacent pair whose joined token has
//                  the highest score, so the token produced by merge rank r scores −r (the same
//                  order HF's BPE applies); other tokens score 0 (single pieces) or below every merge.
//                  token_type: 2 unknown, 3 control (special added tokens), 6 byte (<0xNN>), 1 normal.
//   model "gpt2":  byte-level BPE (Llama-3, Qwen2/3): merges "a b" in rank order; scores 0;
//                  pre: the architecture row's gguf_tokenizer_pre (model/config.h: "qwen2" for
//                  Qwen2/Qwen3), else "llama-bpe" (Llama-3 vocab), else "default".
// Vocabularies shorter than the model's vocab_size are padded with "[PAD<id>]" (type 5, unused) as
// llama.cpp's converter does; a longer one is an error (DEP_MODEL_LOAD_FAILED).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/gguf_writer.h"
#include "model/config.h"

namespace bp {

enum class GGUFTokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

struct GGUFTokenizer {
  std::string model;  // "llama" or "gpt2"
  std::string pre;    // gpt2 only
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> token_types;
  std::vector<std::string> merges;  // gpt2 only
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = false, add_eos = false;
  std::string chat_template;  // set by the caller (text/chat_template_source.h), not read here
  // Strings of every end-of-turn / end-of-sequence token (eos_token and config eos ids), for stops.
  std::vector<std::string> end_tokens;
};

// Reads `dir`/tokenizer.json (+ tokenizer_config.json). `config` supplies the
// vocab size to pad to, the architecture (for `pre`) and fallback bos/eos ids.
GGUFTokenizer read_gguf_tokenizer(const std::string& dir, const ModelConfig& config);

// Sets every tokenizer.ggml.* key (and tokenizer.chat_template when present).
void add_tokenizer_metadata(GGUFWriter& w, const GGUFTokenizer& tok);

}  // namespace bp
