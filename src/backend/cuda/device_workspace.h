// Device memory the CUDA wrappers (kernel_wrappers.h) take from the CUDA allocator for themselves,
// in bytes: cuBLASLt's workspace, held across calls, and what they take inside one call. What a
// memory plan for the device adds to the tensors the op front-ends allocate
// (src/train/memory_plan.cpp reaches it through ops/device_compute.h). Plain C++ (no CUDA header);
// tests/cuda/linear_bf16_cuda_test.cpp holds each function to the bytes the simulated card's
// allocator measures.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "backend/cpu/quant_gemm.h"
#include "backend/cuda/gemm_desc.h"
#include "backend/cuda/lora_dropout_split.h"  // lora_dropout_dA_bytes: the LoRA dropout dA's partials
#include "core/dtype.h"

namespace bp::cuda_workspace {

// cuBLASLt's workspace, which every GEMM of the wrappers gets (kernel_wrappers.h gemm_workspace):
// the size NVIDIA recommends for the card's compute capability. The cuBLAS documentation
// (cublasSetWorkspace, https://docs.nvidia.com/cuda/cublas/index.html#cublassetworkspace)
// recommends 32 MiB on Hopper (CC 9.x) and 4 MiB on the other architectures; PyTorch sizes its
// cuBLASLt workspace the same way for CC >= 9 (pytorch/pytorch#120925), and so do we for the cards
// after Hopper. Less narrows cuBLASLt's heuristic: without a workspace it skips every algorithm that
// needs one (split-K with a reduction buffer among them).
// One workspace per device, held from the first GEMM on: a fixed term of the device memory plan
// (memory_plan.h gemm_workspace).
inline constexpr size_t kGemmWorkspaceBytesHopper = size_t{32} << 20;
inline constexpr size_t kGemmWorkspaceBytesOther = size_t{4} << 20;
// The largest recommendation: what a plan counts when the card is not known.
inline constexpr size_t kGemmWorkspaceBytesMax = kGemmWorkspaceBytesHopper;
inline constexpr size_t gemm_workspace_bytes(int cc_major) {
  return cc_major >= 9 ? kGemmWorkspaceBytesHopper : kGemmWorkspaceBytesOther;
}

// Values per dequantized panel of a held weight on the card: 2^23, 16 MiB as bf16 or f16 (32 MiB as
// the f32 panels of the f16-range fallback and of a held LM head), one panel live at a time. The
// CPU's tiles (cpu::kHeldTileFloats, 2^17) are sized for its L2 cache; a card wants few, large
// GEMMs, and each panel costs a dequantize launch and a GEMM launch of a few µs. At 2^17 a
// Qwen2.5-0.5B MLP weight [4864, 896] took 34 panels of 0.5 GFLOP at T = 2048: ~120 panels, ~240
// launches per layer and pass for a QLoRA step (forward, recompute and backward: ~700). At 2^23 every
// weight of that layer is one panel, Qwen2.5-1.5B's MLP weights [8960, 1536] two, a 7B's
// [18944, 3584] nine (3 GFLOP each at T = 2048): launch-bound no longer. bitsandbytes' QLoRA makes a
// whole bf16 copy of each weight it multiplies; this bounds the copy instead.
inline constexpr int64_t kDefaultHeldPanelValues = int64_t{1} << 23;
namespace detail {
inline std::atomic<int64_t> held_panel_values{kDefaultHeldPanelValues};
}  // namespace detail
inline int64_t held_panel_values() {
  return detail::held_panel_values.load(std::memory_order_relaxed);
}
// Tests on the simulated card lower it so small weights split into several panels (returns the
// previous value, which they restore). Nothing else sets it: the memory plan and the wrappers must
// see the same value.
inline int64_t exchange_held_panel_values(int64_t values) {
  return detail::held_panel_values.exchange(std::max<int64_t>(1, values));
}

// Rows of a held weight [rows, cols] per dequantized panel: at most held_panel_values() values, at
// least one row, never more rows than the weight has, and a multiple of 8 when a panel holds 8 rows
// or more. A panel starting at row r0 makes the GEMM's other operands start r0 elements in (the
// f32 output `y + r0`, the 16-bit activation `dy + r0`): with r0 a multiple of 8 both stay 16-byte
// aligned, as cuBLASLt's tensor-core kernels want (146 rows of Qwen's 896 columns would leave them
// 4- and 8-byte aligned: slower kernels, or none). The wrappers' panel loops and the byte counts
// below both use it.
inline int64_t held_panel_rows(int64_t rows, int64_t cols) {
  const int64_t fit = std::max<int64_t>(1, held_panel_values() / std::max<int64_t>(1, cols));
  if (fit >= rows) return rows;
  return fit >= 8 ? fit - fit % 8 : fit;
}

// `f16_card` below: a card whose GEMMs against frozen weights take f16 (compute capability 7.5,
// gemm::narrow_type), not bf16.

// Whether the GEMMs (and the fused loss) read a weight held as `held` as stored: f32, and bf16 on a
// bf16 card. Every other held type goes through 16-bit panels (f32 panels in the fused loss). The
// wrappers' choice of path and the byte counts below both use it.
inline bool read_as_stored(DType held, bool f16_card) {
  return held == DType::F32 || (held == DType::BF16 && !f16_card);
}

// The 16-bit copy of n activation values (ActivationOperand in kernel_wrappers.h): 2 bytes each;
// an f16 copy also holds, 4-byte aligned after the values, its scale (gemm::F16OperandScale: the
// max|x| its reduction writes, 2^s and the GEMMs' (alpha, beta) pairs, all made on the device).
inline size_t f16_scale_scratch_offset(int64_t n) {
  return (static_cast<size_t>(n) * 2 + 3) / 4 * 4;
}
inline size_t narrow_operand_bytes(bool f16_card, int64_t n) {
  return f16_card ? f16_scale_scratch_offset(n) + sizeof(gemm::F16OperandScale) : static_cast<size_t>(n) * 2;
}

// A GEMM against a weight held as `held` with the f32 activation operand [rows, cols] (x [T, in]
// for y = x·Wᵀ, dy [T, out] for dx = dy·W): rounded into a 16-bit copy unless the weight is f32.
inline size_t held_gemm_operand_bytes(DType held, int64_t rows, int64_t cols, bool f16_card = false) {
  return held == DType::F32 ? 0 : narrow_operand_bytes(f16_card, rows * cols);
}

// The backward of a matrix trained through a bf16 GEMM copy (full fine-tuning, training.matmul_dtype
// bf16: held_linear_backward): dy [T, out] rounded to bf16 once for dx and dW (unless dy's producer
// gave its bf16 copy: dy_given), and x [T, in] for dW (unless the forward kept its producer's copy:
// x_given), both live for the dW GEMM.
inline size_t narrow_dW_operand_bytes(int64_t T, int64_t in, int64_t out, bool dy_given = false, bool x_given = false) {
  return (x_given ? 0 : narrow_operand_bytes(false, T * in)) + (dy_given ? 0 : narrow_operand_bytes(false, T * out));
}

// A GEMM against a weight [rows, cols] held as `held`: f16 and the block types (and bf16 on an
// f16 card) are dequantized to the 16-bit type into one reused panel of at most held_panel_values()
// values (at least one row); bf16 weights on a bf16 card and f32 weights are read as stored.
inline size_t held_gemm_panel_bytes(DType held, int64_t rows, int64_t cols, bool f16_card = false) {
  if (read_as_stored(held, f16_card)) return 0;
  return static_cast<size_t>(held_panel_rows(rows, cols) * cols) * 2;
}

// A GEMM against a held weight [rows, cols] with a value outside f16's range on an f16 card
// (HeldMatrix::f32_panels, ops/held_range.h): an f32 GEMM over one reused f32 panel of at most
// held_panel_values() values, and no 16-bit copy of the activation operand (read as it is).
inline size_t held_gemm_f32_panel_bytes(int64_t rows, int64_t cols) {
  return static_cast<size_t>(held_panel_rows(rows, cols) * cols) * sizeof(float);
}

// The fused LM head + loss over x [T, D] and a head [V, D] held as `head` (f32 or bf16), in
// windows of c = min(chunk, T) rows: logits [c, V] f32, their gradient [c, V] in the GEMMs' input
// type, the row losses [c] f32 and their double total, 8-byte aligned (cross_entropy_workspace_bytes
// in cross_entropy.cuh); for a bf16
// head also x rounded to bf16 and, when dx is asked for, dx as bf16 before it is widened. All live
// for the whole call.
inline size_t cross_entropy_bytes(DType head, int64_t T, int64_t D, int64_t V, int64_t chunk, bool with_dx) {
  if (T == 0) return 0;
  const int64_t c = std::min(chunk, T);
  const size_t grad_bytes = head == DType::F32 ? 4 : 2;
  const size_t rows = static_cast<size_t>(c * V) * (4 + grad_bytes) + static_cast<size_t>(c) * 4;
  return (rows + 7) / 8 * 8 + sizeof(double) + held_gemm_operand_bytes(head, T, D) * (with_dx ? 2 : 1);
}

// The fused loss over a head held in f16 or a block type (linear_cross_entropy_held): the f32
// workspace above plus one f32 panel of the head, at most held_panel_values() values (at least one
// row): cross_entropy_held_workspace_bytes in cross_entropy.cuh.
inline size_t cross_entropy_held_bytes(int64_t T, int64_t D, int64_t V, int64_t chunk) {
  if (T == 0) return 0;
  return cross_entropy_bytes(DType::F32, T, D, V, chunk, true) +
         static_cast<size_t>(held_panel_rows(V, D) * D) * sizeof(float);
}

// The fused loss over a head held as `head`, whichever of the two paths the wrappers take: an f32
// head, or a bf16 one on a bf16 card, cross_entropy_bytes; any other held head (a bf16 one on an
// f16 card included) the f32 panels of cross_entropy_held_bytes.
inline size_t cross_entropy_head_bytes(DType head, bool f16_card, int64_t T, int64_t D, int64_t V, int64_t chunk,
                                       bool with_dx) {
  if (read_as_stored(head, f16_card)) return cross_entropy_bytes(head, T, D, V, chunk, with_dx);
  return cross_entropy_held_bytes(T, D, V, chunk);
}

// moe_aux_accumulate (moe.cuh): each token's softmax max and 1/Σexp, 2·T floats, for the call.
inline size_t moe_aux_accumulate_bytes(int64_t T) {
  return static_cast<size_t>(std::max<int64_t>(2 * T, 1)) * sizeof(float);
}

}  // namespace bp::cuda_workspace
