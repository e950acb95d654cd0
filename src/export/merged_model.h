// A merged model folder: a LoRA adapter folded into its base (model/merge.h) and saved as a Hugging
// Face folder that loads anywhere transformers does, with the base's tokenizer files.
#pragma once

#include <string>
#include <vector>

#include "model/lora.h"
#include "model/merge.h"
#include "model/weights.h"

namespace bp {

// merge_lora + save_hf_model, copying tokenizer files from base_dir; the written config keeps the
// base's torch_dtype unless options.dtype says otherwise.
std::vector<std::string> export_merged_model(const ModelWeights& base, const LoraAdapter& adapter,
                                             const std::string& base_dir, const std::string& out_dir,
                                             SaveModelOptions options = {});

}  // namespace bp
