// A merged model folder (see merged_model.h).
#include "export/merged_model.h"

namespace bp {

std::vector<std::string> export_merged_model(const ModelWeights& base, const LoraAdapter& adapter,
                                             const std::string& base_dir, const std::string& out_dir,
                                             SaveModelOptions options) {
  if (options.copy_files_from.empty()) options.copy_files_from = base_dir;
  return save_hf_model(merge_lora(base, adapter), out_dir, options);
}

}  // namespace bp
