// Tokenizer from a Hugging Face tokenizer.json (DESIGN.md "text & data").
// Two BPE flavours: byte-level (GPT-2, Llama-3, Qwen, SmolLM: pre-tokenizer regex via PCRE2)
// and SentencePiece style (Llama-2, Mistral, TinyLlama, Gemma: ▁ metaspace, byte fallback).
// Added/special tokens are matched before BPE and never split. Ids equal the reference
// implementation (tested against @huggingface/tokenizers). encode/decode are const and keep no
// mutable state, so one Tokenizer may be shared by several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template_source.h"

namespace bp {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Loads <dir>/tokenizer.json (+ tokenizer_config.json for bos/eos/add_bos, and the chat
  // template from read_model_chat_template). Errors: DEP_MODEL_LOAD_FAILED naming the file.
  static std::unique_ptr<Tokenizer> from_dir(const std::string& model_dir);
  static std::unique_ptr<Tokenizer> from_file(const std::string& tokenizer_json_path);
  // The contents of a tokenizer.json (`source` names it in errors); used by the fuzz targets.
  static std::unique_ptr<Tokenizer> from_json_text(const std::string& text, const std::string& source);

  // add_special: apply the post-processor (e.g. BOS for Llama-2/3) as HF's encode() does.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special = false) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;
  virtual int32_t token_to_id(std::string_view token) const = 0;  // -1 when absent
  virtual bool is_special(int32_t id) const = 0;

  int32_t bos_id() const { return bos_id_; }  // -1 when none
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  int32_t pad_id() const { return pad_id_; }
  const std::string& chat_template() const { return template_source_.text; }  // "" when none
  // Where chat_template() came from (text/chat_template_source.h); ChatMLDefault when none.
  const ChatTemplateSource& chat_template_source() const { return template_source_; }

 protected:
  int32_t bos_id_ = -1;
  int32_t pad_id_ = -1;
  std::vector<int32_t> eos_ids_;
  ChatTemplateSource template_source_;
};

// The first tokens of tok.encode(text, add_special) without encoding all of a long text (issue 13:
// a 50 MB row with --max-seq-length 64 must not be tokenized whole). keep == 0 or a text short
// enough: exactly encode(text), cut = false. Otherwise encodes growing prefixes of the text (cut at
// a character boundary) until two of them, one twice as long, agree on their first keep + 1 tokens,
// and returns those keep + 1 tokens with cut = true. Cost: linear in the bytes those tokens span.
std::vector<int32_t> encode_prefix(const Tokenizer& tok, std::string_view text, bool add_special, size_t keep,
                                   bool* cut);

}  // namespace bp
