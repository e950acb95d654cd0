// ModelWeights: the tensors of a Llama-family model, one struct field per role. f32 in memory
// (loaded weights are converted from bf16/f16), except frozen weights held in a narrower type
// (model.base_dtype: bf16, q8_0, q4_K, ...; model/held_weights.h); owned by the CPU allocator so
// the memory plan and the allocator agree. Names per role (HF, PEFT, GGUF) live in model/weight_names.h.
//
// Linear weights are [out, in] (HF layout): q [Hq·d, D], k/v [Hkv·d, D], o [D, Hq·d],
// gate/up [F, D], down [D, F]; embed [V, D]; lm_head [V, D] (undefined when tied).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace bp {

struct LayerWeights {
  Tensor input_norm;                   // [D]   input_layernorm
  Tensor q, k, v, o;                   // attention projections
  Tensor q_bias, k_bias, v_bias;       // [Hq·d], [Hkv·d] (Qwen2 / attention_bias only)
  Tensor q_norm, k_norm;               // [d] (Qwen3 only)
  Tensor post_norm;                    // [D]   post_attention_layernorm (Gemma: on the attention output)
  Tensor gate, up, down;               // MLP projections
  Tensor pre_ffn_norm, post_ffn_norm;  // [D] Gemma (sandwich_norms): pre/post_feedforward_layernorm
};

struct ModelWeights {
  ModelConfig config;
  Tensor embed;  // [V, D]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [D]
  Tensor lm_head;     // [V, D]; undefined when tie_word_embeddings
  const Tensor& output_weight() const { return config.tie_word_embeddings ? embed : lm_head; }
};

}  // namespace bp
