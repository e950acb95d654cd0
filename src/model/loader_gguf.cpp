// GGUF weights into ModelWeights (see loader_gguf.h).
#include "model/loader_gguf.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <span>

#include "core/error.h"
#include "io/gguf_reader.h"
#include "model/held_weights.h"
#include "model/weight_names.h"

namespace bp {

int64_t gguf_unpermuted_row(int64_t gguf_row, int64_t head_dim) {
  // llama.cpp's order within a head is Meta's interleaved one: row 2i + j holds HF row j·d/2 + i.
  const int64_t h = gguf_row / head_dim, r = gguf_row % head_dim;
  return h * head_dim + (r % 2) * (head_dim / 2) + r / 2;
}

namespace {

// Rows of `rows` x `row_bytes` bytes from GGUF (llama.cpp's q/k row order when `permuted`) into
// `dst` in HF order. Works on stored bytes, so it serves f32 values and held blocks alike.
void copy_rows_unpermuted(const uint8_t* src, uint8_t* dst, int64_t rows, size_t row_bytes, bool permuted,
                          int64_t head_dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t to = permuted ? gguf_unpermuted_row(r, head_dim) : r;
    std::copy_n(src + static_cast<size_t>(r) * row_bytes, row_bytes, dst + static_cast<size_t>(to) * row_bytes);
  }
}

}  // namespace

ModelWeights load_gguf_weights(const ModelConfig& cfg, const std::string& gguf_path, std::optional<DType> base,
                               std::vector<std::string>* notes) {
  GGUFReader reader(gguf_path);
  std::string arch;
  if (const GGUFValue* a = reader.find("general.architecture"); a && a->value.is_string())
    arch = a->value.get<std::string>();
  // llama.cpp's llama and smollm3 keep q/k rows in Meta's interleaved order (convert_hf_to_gguf's LlamaModel).
  const bool permuted = arch_info(cfg.arch).gguf_permute_qk && arch == arch_info(cfg.arch).gguf_arch;
  ModelWeights w;
  w.config = cfg;
  // The weights are in memory now: a config saved from them (a merged export) must not send the
  // next load back to the GGUF file.
  if (w.config.raw.is_object()) w.config.raw.erase(kGGUFSourceKey);
  w.layers.resize(static_cast<size_t>(cfg.num_layers));
  for (const auto& [role, layer] : model_roles(cfg)) {
    // A fused tensor (phi3's attn_qkv, ffn_up = gate and up rows): each member reads its rows.
    const FusedProjection* fused = fused_projection_of(cfg, role);
    const std::string name = fused ? fmt::format(fmt::runtime(fused->gguf), layer) : gguf_name(cfg, role, layer);
    const GGUFTensorInfo* t = reader.find_tensor(name);
    if (!t)
      throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                  fmt::format("[model] {}: tensor '{}' is missing; {} with {} layers needs it", gguf_path, name,
                              cfg.architecture_name, cfg.num_layers));
    const Shape shape = role_shape(cfg, role);
    const Shape file_shape = fused ? fused_shape(cfg, *fused) : shape;
    const int64_t row0 = fused ? fused_rows(cfg, role).first : 0;  // the member's first row in the file
    // A router or stacked experts must agree with the expert metadata dimension by dimension (a
    // transposed or wrongly counted stack has the same number of values).
    if (is_moe_role(role) && t->shape != shape.vec())
      throw Error(
          ErrorCode::DEP_MODEL_LOAD_FAILED,
          fmt::format("[model] {}: tensor '{}' has shape [{}]; {}.expert_count = {}{} with embedding_length {} "
                      "need [{}]",
                      gguf_path, name, fmt::join(t->shape, ", "), arch, cfg.num_experts,
                      role == WeightRole::Router ? std::string()
                                                 : fmt::format(" and an expert width of {}", cfg.moe_intermediate_size),
                      cfg.hidden_size, fmt::join(shape.vec(), ", ")));
    if (t->numel() != file_shape.numel())
      throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                  fmt::format("[model] {}: tensor '{}' has {} values, the config needs {} ({})", gguf_path, name,
                              t->numel(), file_shape.numel(), file_shape.str()));
    const bool qk =
        role == WeightRole::Q || role == WeightRole::K || role == WeightRole::QBias || role == WeightRole::KBias;
    const int64_t rows = shape[0], cols = shape.numel() / rows;
    // The stored type is kept when it is what model.base_dtype asks for (auto: whatever it is).
    const std::optional<DType> stored = dtype_of_ggml(t->type);
    const bool keep = role_is_held(role) && stored && *stored != DType::F32 && (!base || *base == *stored) &&
                      dtype_bytes(*stored, file_shape.numel()) == t->nbytes;
    if (keep) {
      Tensor held = Tensor::empty(shape, *stored);
      const size_t row_bytes = dtype_bytes(*stored, cols);
      copy_rows_unpermuted(t->data + static_cast<size_t>(row0) * row_bytes, static_cast<uint8_t*>(held.raw()), rows,
                           row_bytes, permuted && qk, cfg.head_dim);
      weight_ref(w, role, layer) = std::move(held);
      continue;
    }
    const std::vector<float> v = reader.dequantize(*t);
    Tensor f32 = Tensor::empty(shape);
    copy_rows_unpermuted(reinterpret_cast<const uint8_t*>(v.data() + row0 * cols), static_cast<uint8_t*>(f32.raw()),
                         rows, static_cast<size_t>(cols) * sizeof(float), permuted && qk, cfg.head_dim);
    // llama.cpp's converter stores Gemma's norms with the +1 of their (1 + w) added (norm_shift).
    if (cfg.norm_weight_offset != 0.0f && is_norm_role(role))
      for (float& x : std::span(f32.data<float>(), static_cast<size_t>(f32.numel()))) x -= cfg.norm_weight_offset;
    if (base && *base != DType::F32) hold_role(f32, role, *base, notes);
    weight_ref(w, role, layer) = std::move(f32);
  }
  return w;
}

}  // namespace bp
