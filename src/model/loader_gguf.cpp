// GGUF weights into ModelWeights (see loader_gguf.h).
#include "model/loader_gguf.h"

#include <algorithm>

#include "core/error.h"
#include "io/gguf_reader.h"
#include "model/weight_names.h"

namespace bp {

int64_t gguf_unpermuted_row(int64_t gguf_row, int64_t head_dim) {
  // llama.cpp's order within a head is Meta's interleaved one: row 2i + j holds HF row j·d/2 + i.
  const int64_t h = gguf_row / head_dim, r = gguf_row % head_dim;
  return h * head_dim + (r % 2) * (head_dim / 2) + r / 2;
}

ModelWeights load_gguf_weights(const ModelConfig& cfg, const std::string& gguf_path) {
  GGUFReader reader(gguf_path);
  std::string arch;
  if (const GGUFValue* a = reader.find("general.architecture"); a && a->value.is_string())
    arch = a->value.get<std::string>();
  const bool permuted = arch == "llama";
  ModelWeights w;
  w.config = cfg;
  // The weights are in memory now: a config saved from them (a merged export) must not send the
  // next load back to the GGUF file.
  if (w.config.raw.is_object()) w.config.raw.erase(kGGUFSourceKey);
  w.layers.resize(static_cast<size_t>(cfg.num_layers));
  for (const auto& [role, layer] : model_roles(cfg)) {
    const std::string name = gguf_name(role, layer);
    const GGUFTensorInfo* t = reader.find_tensor(name);
    if (!t)
      throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                  fmt::format("[model] {}: tensor '{}' is missing; {} with {} layers needs it", gguf_path, name,
                              cfg.architecture_name, cfg.num_layers));
    const Shape shape = role_shape(cfg, role);
    if (t->numel() != shape.numel())
      throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                  fmt::format("[model] {}: tensor '{}' has {} values, the config needs {} ({})", gguf_path, name,
                              t->numel(), shape.numel(), shape.str()));
    std::vector<float> v = reader.dequantize(*t);
    const bool qk =
        role == WeightRole::Q || role == WeightRole::K || role == WeightRole::QBias || role == WeightRole::KBias;
    if (permuted && qk) {
      const int64_t rows = shape[0], n = shape.numel() / rows, d = cfg.head_dim;
      std::vector<float> hf(v.size());
      for (int64_t r = 0; r < rows; ++r) std::copy_n(v.begin() + r * n, n, hf.begin() + gguf_unpermuted_row(r, d) * n);
      v.swap(hf);
    }
    weight_ref(w, role, layer) = Tensor::from_vector(v, shape);
  }
  return w;
}

}  // namespace bp
