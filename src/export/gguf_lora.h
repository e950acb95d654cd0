// A LoRA adapter as a GGUF LoRA file: what llama.cpp loads with `--lora FILE` and Ollama with
// `ADAPTER FILE` (the format of llama.cpp's convert_lora_to_gguf.py, checked by llama-adapter.cpp).
//
//   metadata  general.architecture = the base's GGUF architecture (llama.cpp refuses a mismatch),
//             general.type = "adapter", adapter.type = "lora", adapter.lora.alpha (f32),
//             general.name, general.file_type (0 f32, 1 f16)
//   tensors   for every adapted projection W of block N, named after the base tensor
//             (blk.N.attn_q.weight, ...): "<name>.lora_a" = PEFT's lora_A [r, in] (ne = {in, r}) and
//             "<name>.lora_b" = lora_B [out, r] (ne = {r, out}), in f32 or f16; a Mixture-of-Experts
//             layer's expert LoRA on the stacked experts (blk.N.ffn_{gate,up,down}_exps.weight):
//             every expert's A and B stacked, [E, r, in] and [E, out, r] (ne {in, r, E}, {r, out, E}),
//             which llama.cpp applies to each token's routed experts (build_lora_mm_id).
// llama.cpp scales the product by alpha / r (r = lora_a's ne[1]); an rsLoRA adapter (scale
// alpha / sqrt(r)) is written with alpha·sqrt(r) so the scale is the same. For the llama
// architecture the base export permutes q/k rows into Meta's interleaved rotary order
// (export/gguf_export.h); lora_b of q and k gets the same row permutation, so B·A lines up with the
// permuted base rows.
#pragma once

#include <cstdint>
#include <string>

#include "io/quantize.h"
#include "model/config.h"
#include "model/lora.h"

namespace bp {

struct GGUFLoraResult {
  std::string path;
  uint64_t bytes = 0;
  int64_t tensor_count = 0;  // lora_a + lora_b tensors
  float alpha = 0;           // adapter.lora.alpha as written
  GGMLType type = GGMLType::F32;
};

// Writes `path` atomically (io/gguf_writer.h). `type` is F32 or F16 (INPUT_VALIDATION_FAILED
// otherwise); `base` is the config of the model the adapter was trained on. A DoRA adapter has no
// GGUF LoRA form (RUNTIME_GGUF_EXPORT_FAILED: llama.cpp holds no magnitudes; export it merged).
GGUFLoraResult export_gguf_lora(const LoraAdapter& adapter, const ModelConfig& base, GGMLType type,
                                const std::string& path, const std::string& name = "");

// The GGUF file a model folder stands for (hub/gguf_source.h writes its path into config.json as
// kGGUFSourceKey), or "" for any other folder.
std::string gguf_base_file(const std::string& model_dir);

// Training from a GGUF base writes the adapter beside the PEFT one: <run>/<kGGUFAdapterFile>, f32.
inline constexpr const char* kGGUFAdapterFile = "adapter.gguf";

}  // namespace bp
