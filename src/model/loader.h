// Loading a Hugging Face model folder into ModelWeights, and random initialisation.
//
// A model folder has config.json (ModelConfig), model.safetensors or a sharded
// model.safetensors.index.json, and tokenizer files. Every weight the config calls for is read
// through the weight-name table (model/weight_names.h), shape-checked against the config, and
// converted to f32 in memory from the CPU allocator (so the memory plan and the allocator agree).
// Extra tensors in the file are ignored (e.g. lm_head.weight of a tied model, rotary tables).
//
// The loader reads local folders only: the commands turn hub names and GGUF files into folders
// first (hub/model_source.h). A config.json naming a GGUF file (model/loader_gguf.h) has its
// weights read from that file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace bp {

// Throws DEP_MODEL_LOAD_FAILED unless `dir` is an existing folder with a config.json. The message
// for a missing path that looks like a hub name (org/name) explains local folders and
// `huggingface-cli download`.
void check_model_dir(const std::string& dir);

// Is `s` shaped like a Hugging Face hub id ("org/name", no leading '.', '/' or '~')?
bool looks_like_hub_name(const std::string& s);

// config.json of the folder; eos_token_id falls back to generation_config.json when config.json
// has none; torch_dtype, when config.json lacks it, comes from the stored embedding's dtype.
ModelConfig load_model_config(const std::string& dir);

// base: how frozen weights are held (model/held_weights.h): f32 (the default), bf16 or a block type
// (quantized on load), or nullopt = auto (a GGUF file's stored types, f32 otherwise). `notes`
// receives sentences about types that differ from the one asked for.
ModelWeights load_model(const std::string& dir, std::optional<DType> base = DType::F32,
                        std::vector<std::string>* notes = nullptr);

// HF-style initialisation for training from scratch and for tests: linear and embedding weights
// ~ normal(0, initializer_range) (config.json's, default 0.02), norms = 1, biases = 0.
// Deterministic in `seed`; each tensor draws from its own stream.
ModelWeights init_random_weights(const ModelConfig& cfg, uint64_t seed);

}  // namespace bp
