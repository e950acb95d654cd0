// Frozen weights held in a narrower type (see held_weights.h).
#include "model/held_weights.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/cpu_kernels.h"
#include "ops/held_range.h"

namespace bp {

std::optional<DType> parse_base_dtype(std::string_view s) {
  if (s == "auto") return std::nullopt;
  if (s == "f32") return DType::F32;
  if (s == "bf16") return DType::BF16;
  if (s == "q8_0") return DType::Q8_0;
  if (s == "q4_k" || s == "q4_K") return DType::Q4_K;
  throw Error(ErrorCode::CONFIG_INVALID_SETTING,
              fmt::format("[model] base dtype '{}' is not one of auto, f32, bf16, q8_0, q4_k", s));
}

std::optional<DType> resolve_base_dtype(std::string_view setting, DeviceType device, bool gguf_base) {
  if (std::optional<DType> t = parse_base_dtype(setting)) return t;
  if (gguf_base) return std::nullopt;
  if (device == DeviceType::CUDA) return DType::BF16;
  // The CPU: bf16 where its GEMMs against bf16-held weights run as bf16 products in oneDNN (the CPU
  // has bf16 dot products and runtime.cpu_gemm resolved to it): half the bytes and the faster path
  // (issue 41). Elsewhere a bf16 weight would only be widened back to f32 for sgemm, so f32.
  return ops::cpu_gemm_info().held_bf16 == "bf16-onednn" ? DType::BF16 : DType::F32;
}

bool role_is_held(WeightRole role) {
  switch (role) {
    case WeightRole::Embed:
    case WeightRole::LmHead:
    case WeightRole::Q:
    case WeightRole::K:
    case WeightRole::V:
    case WeightRole::O:
    case WeightRole::Gate:
    case WeightRole::Up:
    case WeightRole::Down:
    case WeightRole::ExpertGate:
    case WeightRole::ExpertUp:
    case WeightRole::ExpertDown: return true;
    default: return false;
  }
}

DType held_dtype_for(DType requested, int64_t cols, std::string* note) {
  if (!dtype_is_block(requested) || cols % dtype_block_size(requested) == 0) return requested;
  DType fallback = DType::BF16;
  if (requested == DType::Q4_K && cols % dtype_block_size(DType::Q5_0) == 0) fallback = DType::Q5_0;
  if (note)
    *note = fmt::format("rows of {} values are not whole {} blocks of {}: those weights are held as {}", cols,
                        dtype_name(requested), dtype_block_size(requested), dtype_name(fallback));
  return fallback;
}

size_t held_weight_bytes(const ModelConfig& cfg, DType base) {
  size_t bytes = 0;
  for (const auto& [role, layer] : model_roles(cfg)) {
    const Shape shape = role_shape(cfg, role);
    const DType t = role_is_held(role) ? held_dtype_for(base, shape[shape.rank - 1]) : DType::F32;
    bytes += dtype_bytes(t, shape.numel());
  }
  return bytes;
}

std::vector<std::string> frozen_weights_outside_f16(const ModelWeights& w) {
  std::vector<std::string> names;
  for (const auto& [role, layer] : model_roles(w.config))
    if (role_is_held(role) && role != WeightRole::Embed && role != WeightRole::LmHead &&
        ops::held_outside_f16(weight_ref(w, role, layer)))
      names.push_back(moe_aware_name(w.config, role, layer));
  return names;
}

std::string describe_f16_fallback(const std::vector<std::string>& names) {
  constexpr size_t kNamed = 3;
  std::string list;
  for (size_t i = 0; i < std::min(names.size(), kNamed); ++i) list += (i ? ", " : "") + names[i];
  if (names.size() > kNamed) list += fmt::format(" and {} more", names.size() - kNamed);
  return fmt::format(
      "{} frozen weight{} hold values beyond f16's range (|w| >= 65520) and take f32 GEMMs "
      "(exact, slower) instead of this card's f16 ones: {}",
      names.size(), names.size() == 1 ? "" : "s", list);
}

size_t resident_weight_bytes(const ModelWeights& w) {
  size_t bytes = 0;
  for (const auto& [role, layer] : model_roles(w.config)) bytes += weight_ref(w, role, layer).nbytes();
  return bytes;
}

std::string describe_held_weights(const ModelWeights& w, std::string_view requested) {
  std::string held;
  std::vector<DType> seen;
  for (const auto& [role, layer] : model_roles(w.config)) {
    if (!role_is_held(role)) continue;
    const DType t = weight_ref(w, role, layer).dtype();
    if (std::find(seen.begin(), seen.end(), t) != seen.end()) continue;
    seen.push_back(t);
    held += (held.empty() ? "" : ", ") + std::string(dtype_name(t));
  }
  if (requested == "auto") return "auto → " + held;
  std::string lower = held;  // the setting spells q4_k, the type q4_K
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == requested) return held;
  return std::string(requested) + " (held as " + held + ")";
}

Tensor hold_weight(const Tensor& t, DType held) {
  Tensor out = Tensor::empty(t.shape(), held, t.device());
  if (t.dtype() == held) {
    std::memcpy(out.raw(), t.raw(), t.nbytes());
    return out;
  }
  const int64_t cols = t.dim(t.rank() - 1), rows = t.numel() / cols;
  const DType src = t.dtype();
  // Row by row in parallel (each row is whole blocks, so rows are independent), through one f32
  // row per thread: the source may be bf16/f16 (a mapped file), never converted whole.
#pragma omp parallel if (t.numel() >= (int64_t{1} << 18))
  {
    std::vector<float> row(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const auto* in = static_cast<const uint8_t*>(t.raw()) + dtype_bytes(src, r * cols);
      const float* f = reinterpret_cast<const float*>(in);
      if (src != DType::F32) {
        convert(in, src, row.data(), DType::F32, static_cast<size_t>(cols));
        f = row.data();
      }
      convert(f, DType::F32, static_cast<uint8_t*>(out.raw()) + dtype_bytes(held, r * cols), held,
              static_cast<size_t>(cols));
    }
  }
  return out;
}

void hold_role(Tensor& t, WeightRole role, DType base, std::vector<std::string>* notes) {
  if (!role_is_held(role)) return;
  std::string note;
  const DType held = held_dtype_for(base, t.dim(t.rank() - 1), &note);
  if (notes && !note.empty() && std::find(notes->begin(), notes->end(), note) == notes->end()) notes->push_back(note);
  if (t.dtype() != held) t = hold_weight(t, held);
}

std::vector<std::string> hold_weights(ModelWeights& w, DType base) {
  std::vector<std::string> notes;
  for (const auto& [role, layer] : model_roles(w.config)) hold_role(weight_ref(w, role, layer), role, base, &notes);
  return notes;
}

}  // namespace bp
