// export_gguf: a Llama-family model (ModelWeights + its tokenizer folder) -> one GGUF file that
// llama.cpp and Ollama load, for the llama (Llama, Mistral), qwen2 and qwen3 architectures.
//
// Metadata: general.* (architecture, name, file_type, quantization_version 2, alignment 32);
// <arch>.* hyper-parameters; tokenizer.ggml.* (export/gguf_tokenizer.h). Tensor names are llama.cpp's
// (from model/weight_names.h: token_embd,
// blk.N.attn_norm/attn_q/attn_k/attn_v/attn_output/attn_q_norm/attn_k_norm/ffn_norm/ ffn_gate/ffn_up/ffn_down,
// output_norm, output, rope_freqs for Llama-3 rope scaling). For the llama architecture the q/k rows are permuted back
// to Meta's interleaved rotary layout, as llama.cpp's converter does: rows of each head [2, d/2] -> [d/2, 2].
// Mixture-of-Experts (qwen3moe; Mixtral as llama): {arch}.expert_count, {arch}.expert_used_count
// (qwen3moe also expert_feed_forward_length), the router blk.N.ffn_gate_inp.weight (always f32, as
// llama.cpp keeps it) and the experts stacked as blk.N.ffn_{gate,up,down}_exps.weight, shape
// [E, out, in] (ne [in, out, E]). llama.cpp has no dense layers in these and always renormalises the
// top-k weights: a model with dense layers or norm_topk_prob false is RUNTIME_GGUF_EXPORT_FAILED.
//
// Quantization (--quantization): f32, f16, bf16 store every matrix in that type; q8_0, q4_0, q6_k,
// q4_k_m and q5_k_m follow llama.cpp's llama-quantize mixtures (see gguf_tensor_type). 1-D tensors
// (norms, biases, rope_freqs) always stay f32.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "export/gguf_tokenizer.h"
#include "io/gguf_writer.h"
#include "model/weights.h"

namespace bp {

enum class GGUFQuant { F32, F16, BF16, Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K };

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k" (case-insensitive);
// INPUT_VALIDATION_FAILED listing these otherwise.
GGUFQuant parse_gguf_quant(std::string_view name);
const char* gguf_quant_name(GGUFQuant q);
uint32_t gguf_file_type(GGUFQuant q);  // llama_ftype: 0, 1, 32, 7, 2, 15, 17, 18
const char* gguf_arch_name(Arch a);    // arch_info(a).gguf_arch: "llama", "qwen2", "qwen3"

// The ggml type llama.cpp's mixture gives a tensor. `name` is the GGUF name, `row_length` its ne[0],
// `n_dims` its rank, `layer`/`n_layers` its block (or -1), `tied` whether output shares token_embd.
//   default: the ftype's base type (q4_k_m -> Q4_K, q5_k_m -> Q5_K, q6_k -> Q6_K, q8_0, q4_0);
//   output.weight (token_embd.weight when tied): Q6_K unless the base is Q8_0 (Q8_0 when the row
//     length is not a multiple of the base block);
//   attn_v.weight and ffn_down(_exps).weight (q4_k_m, q5_k_m): Q6_K in the layers use_more_bits picks
//     (first and last eighth, and every third in between);
//   ffn_gate_inp.weight (a MoE router): F32;
//   rows not a multiple of the block: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16.
GGMLType gguf_tensor_type(GGUFQuant q, const std::string& name, int64_t row_length, int n_dims, int layer, int n_layers,
                          bool tied);

// An f32 matrix [rows, n] stored as `type` with its rows in llama.cpp's q/k order (Meta's
// interleaved rotary layout, per head of `head_dim` rows). Shared with the GGUF LoRA adapter's
// lora_b of q/k (export/gguf_lora.h), so both files agree on the row order.
GGUFTensorSpec gguf_permuted_rows_spec(const std::string& name, const Tensor& t, GGMLType type, int64_t head_dim);

// Adds every tensor and the model metadata (not the tokenizer) to `w`. Tensors are shared with
// `weights` (no copy); q/k permutation and quantization happen while the file is written.
void add_model_to_gguf(GGUFWriter& w, const ModelWeights& weights, GGUFQuant q, const std::string& model_name);

struct GGUFExportResult {
  std::string path;
  uint64_t bytes = 0;
  std::string file_type;                                          // e.g. "q4_k_m"
  std::vector<std::pair<std::string, std::string>> tensor_types;  // name, ggml type name
  double seconds = 0;
  // From the tokenizer, for the Ollama Modelfile (export/ollama.h: ollama_template_from_jinja).
  std::string chat_template;
  std::vector<std::string> end_tokens;
  int64_t context_length = 0;  // max_position_embeddings, a default for num_ctx
};

// Writes `output_path` atomically (io/gguf_writer.h). model_name defaults to the output file's stem.
// chat_template: the Jinja text to ship (text/chat_template_source.h reads it; "" = none).
GGUFExportResult export_gguf(const ModelWeights& weights, const std::string& tokenizer_dir, GGUFQuant quant,
                             const std::string& output_path, const std::string& model_name = "",
                             const std::string& chat_template = "");

}  // namespace bp
