// Whether a frozen weight fits the 16-bit type of the device's GEMMs against it. On a compute
// capability 7.5 card those GEMMs take f16 (backend/cuda/kernel_wrappers.h), whose largest value is
// 65504: a weight held as bf16 (or quantized with large scales) can hold values that f16 rounds to
// Inf (every |w| >= 65520, the midpoint above 65504), and the run would die on the NaN guard. Such a
// weight is found once, by a reduction of max |w| over its dequantized values on the card (the
// held_abs_max kernel), and its GEMMs then read it through f32 panels (HeldMatrix::f32_panels): the
// CPU's f32 arithmetic for that tensor, slower, exact. Every other weight keeps the f16 path.
// The result is cached per tensor memory (Tensor::storage_token: the contract is that a weight held
// narrower than f32 is frozen, never written once on the device), so a step pays one map lookup per
// GEMM. bf16 cards (bf16 spans f32's range) and f32 weights are never checked. The one kind of bf16
// tensor that is rewritten, full fine-tuning's GEMM copies (model/transformer.h), is made only on
// bf16 cards, so the cache never sees it.
#pragma once

#include <string>
#include <vector>

#include "backend/cpu/quant_gemm.h"
#include "core/tensor.h"

namespace bp::ops {

// The smallest magnitude f16 rounds to Inf (round to nearest even: 65520 lies halfway between
// 65504 and 2^16, and ties go to the even 2^16, which is Inf).
inline constexpr float kF16OverflowThreshold = 65520.0f;

// max |w| over W's dequantized values (its device's held_abs_max kernel; cached for device weights).
float held_abs_max(const Tensor& W);

// Whether W's GEMMs on its device take f32 panels: W is held narrower than f32 on a CUDA card whose
// GEMMs against frozen weights take f16, and max |w| >= kF16OverflowThreshold (or is Inf/NaN).
bool held_outside_f16(const Tensor& W);

// held_matrix(W) for a GEMM: f32_panels set as held_outside_f16 says.
cpu::HeldMatrix held_gemm_matrix(const Tensor& W);

}  // namespace bp::ops
