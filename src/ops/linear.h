// linear: y = x·Wᵀ (+ b) (+ LoRA path scale·(dropout(x)·Aᵀ)·Bᵀ)   (DESIGN.md "Ops", "LoRA")
//
// Shapes: x [T, in], W [out, in], b [out], A [r, in], B [out, r], y [T, out]. All f32, except a
// frozen W, which may be held in its stored type (bf16, f16, q8_0, q4_K, ...: core/quant_blocks.h):
// x·Wᵀ and dy·W then dequantize W tile by tile inside the GEMM, never as a whole f32 copy.
// LoRA follows PEFT: dropout applies to the LoRA input only; scale = alpha/r (or alpha/sqrt(r)).
// Dropout is deterministic: the mask comes from `dropout_seed` (same seed -> same mask), so a
// recomputed forward (gradient checkpointing) and a resumed run see the same mask.
//
// Saved for backward (LinearSaved): xa = dropout(x)·Aᵀ [T, r] only. The caller keeps x; the
// dropped input is never kept: its mask is a hash of (seed, element index), so backward
// regenerates it from x (on CUDA inside the fused products, lora_dropout.cuh, never as a [T, in]
// buffer; on the CPU into scratch that lives for one call: lora_dropout_scratch_floats).
// Gradients: dx is overwritten (=), or accumulated (+=) with accumulate_dx (an input feeding several
// projections, q/k/v or gate/up, sums their dx in place: no temporary, no separate add); dW, db,
// dA, dB accumulate (+=). Null gradient pointers are
// skipped: frozen W gets no dW (LoRA mode), dW only when W is trainable (full mode). In full mode
// W may be the bf16 GEMM copy of a trainable f32 master (training.matmul_dtype bf16,
// model/transformer.h): x·Wᵀ and dy·W read it like a held bf16 weight, dW (f32, the master's
// gradient) is dyᵀ·x with both operands rounded to bf16 on a card (f32 on the CPU).
//
// x_bf16 (forward, and backward for dW) and dy_bf16 (backward), may be null: x (dy) already rounded
// to nearest-even bf16 by its producer (rms_norm_forward, attention_forward, swiglu_forward/backward,
// rope_backward, attention_backward, rms_norm_backward: their bf16 outputs; backward, x's copy as
// the forward kept it). A GEMM against a held W that takes bf16 inputs (a card of compute
// capability 8.0+: held_gemms_read_bf16 below) reads it instead of rounding x (dy) into workspace
// per call: one write beside the producer's instead of a pass reading the f32 tensor again, shared
// by every projection of that input (q/k/v, gate/up). Other GEMMs (an f32 W, an f16 card, the
// CPU's) read the f32 tensor; the results are the same bits either way.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/linear.h"  // LoraDropoutMember: the dropout kernels' member list
#include "core/tensor.h"

namespace bp {

struct LoraWeights {
  const Tensor* A = nullptr;  // [r, in]
  const Tensor* B = nullptr;  // [out, r]
  float scale = 1.0f;
  float dropout = 0.0f;       // probability in [0, 1)
  uint64_t dropout_seed = 0;  // per layer and per micro-batch
  bool training = true;       // dropout only when training
  // A member of a group of projections that read one x (lora_group_forward below): its xa is
  // columns [group_col, group_col + r) of the group's group_xa (forward: linear_forward reads them,
  // no GEMM of x); backward, linear_backward writes its dxa there in group_dxa and leaves dA and
  // the LoRA term of dx to lora_group_backward. Both [T, Σr]; null for a projection on its own.
  const Tensor* group_xa = nullptr;
  Tensor* group_dxa = nullptr;
  int64_t group_col = 0;
  // A fused module's member (model/lora.h: the members share A, so they share xa's columns too):
  // its dxa is added (+=) into group_dxa's columns instead of written, the sum over the members.
  bool group_dxa_accumulate = false;
  // DoRA (PEFT's use_dora; both null: plain LoRA): magnitude = m [out] (trainable), weight_norm_sq =
  // ||W_j||² [out] of the frozen base rows (constant: the caller computes it once). See "DoRA" below.
  const Tensor* magnitude = nullptr;
  const Tensor* weight_norm_sq = nullptr;
};

struct LinearSaved {
  Tensor xa;        // [T, r] = dropout(x)·Aᵀ, defined when a LoRA path exists; a group member's is
  int64_t col = 0;  // the group's [T, Σr], its columns [col, col + r)
  // DoRA only: z = x·Wᵀ + s·xa·Bᵀ [T, out], c = m/n and 1/n [out] (n = ||W + s·B·A||_row).
  Tensor dora_z, dora_c, dora_inv_n;
};

struct LinearGrads {
  Tensor* dx = nullptr;        // [T, in]  (=)
  Tensor* dW = nullptr;        // [out, in] (+=)
  Tensor* db = nullptr;        // [out]     (+=)
  Tensor* dA = nullptr;        // [r, in]   (+=)
  Tensor* dB = nullptr;        // [out, r]  (+=)
  bool accumulate_dx = false;  // dx += instead of dx =
  Tensor* dm = nullptr;        // [out]     (+=) DoRA's magnitude
};

// DoRA (Liu et al. 2024, as PEFT's DoraLinearLayer for nn.Linear): with n_j = ||W_j + s·(B·A)_j||
// (the row norms of the adapted weight, a constant for backward: PEFT detaches it) and c = m / n,
//   y = residual + b + c ⊙ z,   z = x·Wᵀ + s·(x·Aᵀ)·Bᵀ         (columns scaled by c; bias unscaled)
// n² = ||W_j||² + Σ_k B_jk·(2s·W·Aᵀ + s²·B·(A·Aᵀ))_jk: one [r, out] GEMM against W (any held type,
// as x·Wᵀ with x = A) and two of r×r, no [out, in] temporary. Backward, g = dy:
//   dm += (Σ_t g ⊙ z) / n,   then the LoRA backward above with g ⊙ c in place of g (db from g).
// DoRA with dropout (training, p > 0), as PEFT's DoraLinearVariant: the base layer runs on the
// undropped x and the DoRA term on xd = dropout(x) (the LoRA mask):
//   y = residual + b + x·Wᵀ + (c − 1) ⊙ (xd·Wᵀ) + c ⊙ s·(xd·Aᵀ)·Bᵀ = residual + b + x·Wᵀ − xd·Wᵀ + c ⊙ z,
//   z = xd·Wᵀ + s·(xd·Aᵀ)·Bᵀ;   backward dm += (Σ_t g ⊙ z)/n,
//   dx = g·W + dropout'(((c − 1) ⊙ g)·W) + dropout'(s·((g ⊙ c)·B)·A),  dA, dB from g ⊙ c.
// xd·Wᵀ and dropout'(·W) go through the LoRA dropout kernels with W as their "A" (an f32 W), or
// with an identity A making xd [T, in] for the held GEMMs (a bf16 or quantized W): one more
// product against W each way, as PEFT's extra F.linear on the dropped x.
//
// residual (forward, may be null): [T, out] f32 added to y, y = residual + x·Wᵀ (+ b) (+ LoRA), by
// the base GEMM (its beta; on a card out of place, cuBLASLt's C ≠ D): a residual connection with
// no add of its own (o_proj onto the layer's input, down_proj onto h). Read, never written.
// saved may be null (inference). bias, lora, x_bf16 and dy_bf16 may be null. linear_backward's x may
// be undefined where x_bf16 is given, W's GEMMs read bf16 (held_gemms_read_bf16) and there is no
// LoRA: the copy is all its GEMMs read of x (full fine-tuning drops the f32 xn, hn and m for it).
Tensor linear_forward(const Tensor& x, const Tensor& W, const Tensor* bias, const LoraWeights* lora, LinearSaved* saved,
                      const Tensor* x_bf16 = nullptr, const Tensor* residual = nullptr);
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& W, const LoraWeights* lora,
                     const LinearSaved* saved, const LinearGrads& grads, const Tensor* dy_bf16 = nullptr,
                     const Tensor* x_bf16 = nullptr);

// Projections that read one x with LoRA (q/k/v, gate/up), whose A matrices are consecutive rows of
// one tensor A_all [Σr, in] (Tensor::joined_rows; Model::attach_lora lays them out so): the LoRA
// products that read x run once for the group instead of once per projection.
//   lora_group_forward:  xa_all = x·A_allᵀ [T, Σr]; each member's linear_forward then reads its
//                        columns (LoraWeights::group_xa) and saves them.
//   lora_group_backward: after every member's linear_backward wrote its dxa = s·g·B into its columns
//                        of dxa_all [T, Σr] (LoraWeights::group_dxa), dA_all += dxa_allᵀ·x and
//                        dx += dxa_all·A_all (each skipped when null).
// q/k/v: 2 GEMMs fewer forward and 4 backward; gate/up 1 and 2. The same sums as per projection,
// up to the GEMMs' summation order.
// With dropout (training, p > 0; `dropout` non-null) each member keeps its own mask (PEFT's: one
// dropout module per projection): member m's columns are dropout_m(x)·A_mᵀ, its dA rows
// dxa_mᵀ·dropout_m(x), its dx term dropout_m'(dxa_m·A_m), the masks those of the member's
// LoraWeights::dropout_seed (the bits of linear_forward on that projection alone). One call of the
// dropout kernels for the group (lora_dropout.cuh: one launch per product on a card, x read where
// the masks are made) instead of one per projection; on the CPU each member's dropped input is
// made in turn in one scratch buffer. members: each member's rows of A_all and seed, in order (1 to
// 3 of them, summing to A_all's rows; RUNTIME_INTERNAL otherwise; p out of [0, 1):
// INPUT_VALIDATION_FAILED).
struct LoraGroupDropout {
  float p = 0.0f;
  std::vector<cpu::LoraDropoutMember> members;  // {rows of A_all, mask seed} each, in order
};
Tensor lora_group_forward(const Tensor& x, const Tensor& A_all, const LoraGroupDropout* dropout = nullptr);
void lora_group_backward(const Tensor& x, const Tensor& A_all, const Tensor& dxa_all, Tensor* dA_all, Tensor* dx,
                         const LoraGroupDropout* dropout = nullptr);

// Whether a GEMM of `device` against W reads a bf16 copy of its activation operand (W held
// narrower than f32, or a bf16 GEMM copy, on a card whose GEMMs take bf16): where producers'
// bf16 outputs (x_bf16, dy_bf16 above) save a rounding pass. False on the CPU and on an f16 card.
bool held_gemms_read_bf16(const Tensor& W);

// Floats of scratch one LoRA-dropout call allocates on `device` (forward: linear_forward; backward:
// linear_backward), freed when the call returns: the CPU writes the dropped input (and its
// gradient) there, CUDA needs none. For the memory plan (train/memory_plan.cpp).
int64_t lora_dropout_scratch_floats(DeviceType device, int64_t T, int64_t in, bool backward);

// C += alpha·A·B for A [M, K], B [K, N], C [M, N], all f32 (merging LoRA into a weight:
// W += scale·B·A, model/merge.cpp).
void matmul_accumulate(Tensor& C, float alpha, const Tensor& A, const Tensor& B);

}  // namespace bp
