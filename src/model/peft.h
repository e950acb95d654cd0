// PEFT adapter files (DESIGN.md "LoRA"): the layout Hugging Face PEFT writes and reads, so an
// adapter trained here loads with PeftModel.from_pretrained and the other way round.
//
//   adapter_model.safetensors  base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight [r, in]
//                              base_model.model.model.layers.N.self_attn.q_proj.lora_B.weight [out, r]
//                              ...q_proj.lora_magnitude_vector [out] (DoRA: use_dora true)
//                              (names from the weight-name table), metadata {"format": "pt"}
//   adapter_config.json        peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
//                              target_modules, bias "none", use_rslora, use_dora, base_model_name_or_path, ...
//
// The text model of a multimodal checkpoint (ModelConfig::multimodal_text: Gemma3ForConditionalGeneration)
// is named as PEFT names it on the multimodal model with today's transformers
// (base_model.model.model.language_model.layers.N...; the older base_model.model.language_model.model.
// layout is read too), and target_modules is a pattern matching the text model's projections only,
// so PeftModel.from_pretrained on the full model leaves the vision tower alone.
//
// Loading checks every tensor against the model config: an adapter for another base model
// (different sizes or layer count) fails with DEP_MODEL_LOAD_FAILED naming the file, the tensor
// and both shapes. PEFT features this project does not implement (rank_pattern,
// alpha_pattern, modules_to_save, bias other than "none", LoRA on embeddings) fail clearly.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/lora.h"

namespace bp {

// adapter_config.json contents for this adapter.
nlohmann::json peft_adapter_config(const LoraAdapter& adapter);

// Writes both files into `dir` (created if needed) atomically; returns the file names. A PiSSA
// adapter is written converted (model/lora.h pissa_to_lora): a LoRA of rank 2r for the original
// base, as PEFT's save_pretrained(path_initial_model_for_weight_conversion=...) writes it.
// Errors: RUNTIME_EXPORT_FAILED / STATE_DISK_FULL.
std::vector<std::string> save_peft_adapter(const LoraAdapter& adapter, const std::string& dir);

// Reads an adapter folder for a model with config `cfg`; tensors become f32 on the CPU.
LoraAdapter load_peft_adapter(const std::string& dir, const ModelConfig& cfg);

}  // namespace bp
