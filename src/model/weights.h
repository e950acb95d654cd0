// ModelWeights: the tensors of a Llama-family model, one struct field per role. f32 in memory
// (loaded weights are converted from bf16/f16), except frozen weights held in a narrower type
// (model.base_dtype: bf16, q8_0, q4_K, ...; model/held_weights.h); owned by the CPU allocator so
// the memory plan and the allocator agree. Names per role (HF, PEFT, GGUF) live in model/weight_names.h.
//
// Linear weights are [out, in] (HF layout): q [Hq·d, D], k/v [Hkv·d, D], o [D, Hq·d],
// gate/up [F, D], down [D, F]; embed [V, D]; lm_head [V, D] (undefined when tied).
//
// Mixture-of-Experts (ModelConfig::is_moe_layer): a sparse layer has no gate/up/down; it has the
// router [E, D] (f32, never held) and each projection's E experts stacked in ONE tensor, expert e's
// matrix its e-th slab (expert_matrix: a view, no copy), so a grouped GEMM reads expert e's
// [out, in] matrix directly: experts_gate / experts_up [E, Fe, D], experts_down [E, D, Fe]. Frozen
// experts are held in model.base_dtype like the dense projections (bf16, q8_0, q4_K, ...: a slab of
// whole rows is whole blocks). Hugging Face stores each expert's matrix on its own (weight_names.h
// expert_hf_name); loading stacks them, saving writes each slab back under its name.
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
  Tensor router;                       // [E, D]   MoE: mlp.gate / block_sparse_moe.gate
  Tensor experts_gate, experts_up;     // [E, Fe, D] MoE: the experts' gate and up projections, stacked
  Tensor experts_down;                 // [E, D, Fe] MoE: the experts' down projections, stacked
};

// Expert e's [out, in] matrix of a stacked [E, out, in] tensor (a view sharing its storage; works
// for held block types, whose rows are whole blocks).
inline Tensor expert_matrix(const Tensor& stacked, int64_t e) {
  return stacked.rows(e, e + 1).reshape({stacked.dim(1), stacked.dim(2)});
}

struct ModelWeights {
  ModelConfig config;
  Tensor embed;  // [V, D]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [D]
  Tensor lm_head;     // [V, D]; undefined when tie_word_embeddings
  const Tensor& output_weight() const { return config.tie_word_embeddings ? embed : lm_head; }
};

}  // namespace bp
