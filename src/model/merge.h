// Saving a model as a Hugging Face folder, and merging a LoRA adapter into base weights.
//
// save_hf_model writes config.json (torch_dtype = the dtype written), the weights as safetensors
// in that dtype (the base model's torch_dtype by default), sharded above max_shard_bytes with
// model.safetensors.index.json, and copies the tokenizer/generation files of a source folder.
// The folder loads again with load_model (identical weights for f32, the dtype's rounding else).
//
// Merging follows PEFT's merge_and_unload: W ← W + scale · B·A for every adapted projection,
// computed in f32; a DoRA adapter then scales each row: W ← (m / ||W||_row) ⊙ W. Biases, norms and
// embeddings are untouched. Exporting a merged model folder:
// export/merged_model.h.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "model/lora.h"
#include "model/weights.h"

namespace bp {

struct SaveModelOptions {
  std::optional<DType> dtype;              // default: config.torch_dtype
  size_t max_shard_bytes = 5'000'000'000;  // transformers' default "5GB"; 0 = one file
  std::string copy_files_from;             // a folder whose tokenizer files are copied; "" = none
};

// The files copied by save_hf_model when present in copy_files_from.
const std::vector<std::string>& tokenizer_file_names();

// Returns the names of the files written. Errors: RUNTIME_EXPORT_FAILED / STATE_DISK_FULL.
std::vector<std::string> save_hf_model(const ModelWeights& w, const std::string& dir,
                                       const SaveModelOptions& options = {});

// W += scale·B·A in place. Throws RUNTIME_EXPORT_FAILED when the adapter does not fit the model
// (layer count, A/B shapes), naming the layer, projection and shapes.
void merge_lora_into(ModelWeights& w, const LoraAdapter& adapter);
// A merged copy: adapted weights are new f32 tensors (a base held narrower is widened first),
// everything else is shared with `base`.
ModelWeights merge_lora(const ModelWeights& base, const LoraAdapter& adapter);

}  // namespace bp
