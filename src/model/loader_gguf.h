// Weights of a GGUF file for `--model FILE.gguf` (hub/gguf_source.h writes the small folder of
// config.json and tokenizer files that names the GGUF file; load_model reads the weights here).
//
// Every tensor the config calls for is found by its GGUF name (model/weight_names.h), dequantized
// from its stored type (f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_K, q5_K, q6_K) to f32, and for the
// llama architecture the q/k rows (and biases) that llama.cpp's converter permuted into Meta's
// interleaved rotary order are put back in Hugging Face's rotate_half order.
// Frozen weights (model/held_weights.h) keep their stored bytes when `base` asks for the stored type
// or is auto (nullopt); otherwise they are dequantized and held at `base`.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "model/weights.h"

namespace bp {

// The config key (in config.json) naming the GGUF file that holds the weights.
inline constexpr const char* kGGUFSourceKey = "backprop_gguf_file";

// DEP_MODEL_LOAD_FAILED when a tensor is missing or its shape disagrees with the config.
ModelWeights load_gguf_weights(const ModelConfig& cfg, const std::string& gguf_path,
                               std::optional<DType> base = DType::F32, std::vector<std::string>* notes = nullptr);

// Row `r` of a llama.cpp-permuted q/k tensor holds HF row gguf_unpermuted_row(r, head_dim).
int64_t gguf_unpermuted_row(int64_t gguf_row, int64_t head_dim);

}  // namespace bp
