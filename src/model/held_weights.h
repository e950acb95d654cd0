// Frozen base weights held in a narrower type than f32 (setting model.base_dtype, DESIGN.md
// "Frozen weights in any stored type"; QLoRA on the CPU).
//
// Held: the seven linear projections of every layer (a sparse layer's stacked experts: weights.h),
// the embedding and an untied LM head; a MoE router stays f32. Norms
// and biases stay f32 (tiny, and read element-wise). Only frozen weights are held: full
// fine-tuning trains every weight in f32, so a narrower base dtype is refused there.
//
// A block type needs rows that are whole blocks. When a row is not (SmolLM's 576 or Qwen2.5-0.5B's
// 896 columns are not multiples of q4_K's 256), the weight gets the nearest type that fits, as
// llama.cpp's quantizer does: q4_K -> q5_0 (blocks of 32), q8_0 -> bf16; the loader says so.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"
#include "model/weight_names.h"
#include "model/weights.h"

namespace bp {

// model.base_dtype: nullopt = auto (resolved by resolve_base_dtype).
// Accepts auto, f32, bf16, q8_0, q4_k; CONFIG_INVALID_SETTING otherwise.
std::optional<DType> parse_base_dtype(std::string_view s);

// model.base_dtype resolved for a LoRA run on `device` (what `train` holds and `estimate-vram`
// plans): a type, or nullopt = as stored. auto keeps a GGUF base in its stored types (nullopt) and
// holds any other base at bf16 on a CUDA card (issue 18: frozen weights in bf16, the tensor cores'
// GEMM inputs; an f16 card dequantizes them to f16 panels) and on a CPU whose held-bf16 GEMMs run
// in oneDNN's bf16 matmul (ops::cpu_gemm_info().held_bf16 "bf16-onednn": bf16 dot products and
// runtime.cpu_gemm auto|onednn, as selected when the command started; issue 41), else at f32.
// Full fine-tuning does not call this (its weights are trained, f32).
std::optional<DType> resolve_base_dtype(std::string_view setting, DeviceType device, bool gguf_base);

// Is this role held in the base dtype (linear projections and experts, embedding, LM head)?
bool role_is_held(WeightRole role);

// The type a weight with rows of `cols` values gets when `requested` is asked for (the fallbacks in
// the file comment). `note`, when given, is set to a sentence when the type differs.
DType held_dtype_for(DType requested, int64_t cols, std::string* note = nullptr);

// Bytes of every frozen weight of `cfg` held at `base` (norms and biases at f32): what the memory
// plan counts for the weights group.
size_t held_weight_bytes(const ModelConfig& cfg, DType base);
// Bytes the loaded weights really take (sum over every tensor of its dtype's bytes).
size_t resident_weight_bytes(const ModelWeights& w);

// How the frozen weights are held, for the run summary: `requested` is the setting's value
// ("auto", "f32", "q4_k", ...), followed by the types the held roles really have, in first-seen
// order: "q4_k (held as q5_0, q4_K)", "auto → f32", "auto → q4_K, q6_K" (a GGUF base), "f32".
std::string describe_held_weights(const ModelWeights& w, std::string_view requested);

// The HF names of the frozen layer projections that hold a value f16 cannot (|w| >= 65520) on a
// card whose GEMMs against frozen weights take f16 (compute capability 7.5): their GEMMs take f32
// panels (ops/held_range.h; the check runs once per weight and is cached). Empty on any other device.
// The embedding and LM head are not listed: their lookup and the fused loss read them in f32.
std::vector<std::string> frozen_weights_outside_f16(const ModelWeights& w);
// The one line the training start says about them: their count and the first few names.
std::string describe_f16_fallback(const std::vector<std::string>& names);

// `t` (any float dtype, possibly a view of a mapped file) converted to `held` row by row (quantized
// on load): always a copy from the CPU allocator.
Tensor hold_weight(const Tensor& t, DType held);

// Converts `t` (the weight of `role`) to its held type for `base` when the role is held; appends a
// note about a fallback to `notes` unless the same note is there already.
void hold_role(Tensor& t, WeightRole role, DType base, std::vector<std::string>* notes);

// Converts the held roles of an f32-loaded model to `base` in place, one tensor at a time (the
// peak is one f32 tensor more than the held model). Returns the notes about fallbacks, one per
// distinct fallback. Full-mode callers must not call this (the trainer refuses first).
std::vector<std::string> hold_weights(ModelWeights& w, DType base);

}  // namespace bp
