// `--model FILE.gguf`: a GGUF file as a model. The loaders read Hugging Face folders, so this
// writes a small folder that stands for the GGUF file (no weights in it):
//
//   config.json            architecture and hyper-parameters from <arch>.* metadata, bos/eos ids,
//                          tie_word_embeddings (no output.weight), and "backprop_gguf_file": the
//                          GGUF path, from which load_model reads the weights (model/loader_gguf.h)
//   tokenizer.json         rebuilt from tokenizer.ggml.*: model "gpt2" = byte-level BPE with the
//                          pre-tokenizer regex `tokenizer.ggml.pre` names (llama-bpe, qwen2, default);
//                          model "llama" = SentencePiece BPE (metaspace, byte fallback) whose merges
//                          are derived from the scores as transformers' SentencePieceExtractor does
//   tokenizer_config.json  bos/eos, add_bos_token, add_eos_token, chat_template
//
// The folder lives under <derived_dir>/<hash of path, size and mtime>/ and is rewritten when the
// file changes (or this layout does: the key has a version). Architectures: llama (Llama, Mistral), qwen2, qwen3.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "io/gguf_reader.h"

namespace bp::hub {

// True for an existing regular file whose first four bytes are "GGUF".
bool is_gguf_file(const std::string& path);

// For a regular file given as a model that is not a GGUF file: returns when it may be a config.json
// (the name does not end in .gguf and its first non-blank byte is '{'; estimate-vram reads those);
// otherwise DEP_MODEL_LOAD_FAILED "not a GGUF file (magic ...)" with the bytes found, instead of
// treating the file as a folder.
void check_non_gguf_model_file(const std::string& path);

// The three files of that folder, from an open reader (`path` names the file in messages and is
// config.json's backprop_gguf_file); nothing is written. Every metadata value is type-checked and
// every size checked before use: a bad file is DEP_MODEL_LOAD_FAILED naming the key. The fuzz
// target tests/fuzz/gguf_model_fuzz.cpp runs this on images in memory.
struct GGUFModelFiles {
  nlohmann::json config, tokenizer, tokenizer_config;
};
GGUFModelFiles gguf_model_files(const GGUFReader& r, const std::string& path);

// The folder standing for `gguf_path` (written on first use). DEP_MODEL_LOAD_FAILED for an
// architecture or tokenizer model we do not read.
std::string gguf_model_folder(const std::string& gguf_path, const std::string& derived_dir);

}  // namespace bp::hub
