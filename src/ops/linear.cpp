// linear front-end: checks shapes and dtypes, allocates outputs and the LoRA workspace, and
// dispatches to the kernels of the tensors' device (ops/dispatch.h; CPU: backend/cpu/linear.cpp). Contract:
// ops/linear.h.
//
// Backward, with g = dy [T, out], s = lora.scale, xd = dropout(x) (or x), xa = xd·Aᵀ:
//   dx  = g·W + dropout'(s·(g·B)·A)       (=, or += with accumulate_dx: the base GEMM's beta)
//   dW += gᵀ·x,  db += Σ_t g              (full mode only: non-null pointers; W may then be the
//                                          bf16 GEMM copy of the f32 master: bf16 operands on a card)
//   dB += s·gᵀ·xa                          (+=)
//   dA += (s·g·B)ᵀ·xd                      (+=)
// With dropout, xd is never kept: the mask is a hash of (seed, element index), so the kernels
// regenerate it from x. lora_dropout_xa makes xa forward, lora_dropout_backward makes dA and the
// LoRA term of dx; the CUDA kernels fuse the mask into those products (no [T, in] buffer at all),
// the CPU ones write xd (and dxd) into scratch the front-end allocates for the call
// (lora_dropout_scratch_floats: 0 on CUDA) and call sgemm as the plain path does.
#include "ops/linear.h"

#include "ops/device_compute.h"
#include "ops/elementwise.h"
#include "ops/held_range.h"
#include "ops/op_checks.h"

namespace bp {

namespace {

constexpr const char* kOp = "linear";

bool dropout_active(const LoraWeights& lora) {
  return lora.training && lora.dropout > 0.0f;
}

// Checks x, W, bias and the LoRA tensors against each other; returns r (0 without LoRA).
int64_t check_linear_args(const Tensor& x, const Tensor& W, const Tensor* bias, const LoraWeights* lora) {
  ops::require_tensor(kOp, "x", x, DType::F32, 2);
  // W is f32, or a frozen weight held in its stored type (bf16, f16, q8_0, q4_K, ...).
  ops::require_tensor(kOp, "W", W, W.dtype() == DType::I32 ? DType::F32 : W.dtype(), 2);
  const int64_t in = x.dim(1), out = W.dim(0);
  BP_CHECK(in > 0 && out > 0, "[linear] x is {} and W is {}: a linear layer needs features", x.shape().str(),
           W.shape().str());
  BP_CHECK(W.dim(1) == in, "[linear] x has {} columns but W has {} (W is {})", in, W.dim(1), W.shape().str());
  if (bias) ops::require_shape(kOp, "bias", *bias, Shape{out});
  ops::require_same_device(kOp, {&x, &W, bias});
  if (!lora) return 0;
  BP_CHECK(lora->A && lora->B, "[linear] LoRA weights given without {}", lora->A ? "B" : "A");
  ops::require_tensor(kOp, "lora A", *lora->A, DType::F32, 2);
  const int64_t r = lora->A->dim(0);
  BP_CHECK(r > 0, "[linear] LoRA rank must be positive, A is {}", lora->A->shape().str());
  BP_CHECK(lora->A->dim(1) == in, "[linear] x has {} columns but lora A has {} (A is {})", in, lora->A->dim(1),
           lora->A->shape().str());
  ops::require_shape(kOp, "lora B", *lora->B, Shape{out, r});
  ops::require_same_device(kOp, {&x, lora->A, lora->B});
  if (!(lora->dropout >= 0.0f && lora->dropout < 1.0f))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[linear] LoRA dropout must be in [0, 1) but is {}", lora->dropout));
  return r;
}

// y = x·Wᵀ (+ b) (+ residual): one sgemm for an f32 W; a held W is dequantized tile by tile inside
// the GEMM (backend/cpu/quant_gemm.h), reading x16 (x's bf16 copy, may be null) where the GEMM takes
// bf16, then the bias is added. The residual (may be null) is the GEMM's beta matrix.
void base_forward(const Tensor& x, const uint16_t* x16, const Tensor& W, const Tensor* bias, const Tensor* residual,
                  Tensor& y) {
  const int64_t T = x.dim(0), in = x.dim(1), out = W.dim(0);
  const float* res = residual ? residual->kernel_data<float>() : nullptr;
  if (W.dtype() == DType::F32) {
    ops::kernels(x).linear_base_forward(x.kernel_data<float>(), W.kernel_data<float>(),
                                        bias ? bias->kernel_data<float>() : nullptr, res, y.kernel_data<float>(), T, in,
                                        out);
    return;
  }
  ops::kernels(x).held_linear_forward(x.kernel_data<float>(), x16, ops::held_gemm_matrix(W), res ? 1.0f : 0.0f, res,
                                      y.kernel_data<float>(), T);
  if (bias) ops::kernels(x).add_bias_inplace(y.kernel_data<float>(), bias->kernel_data<float>(), T, out);
}

// The scratch a LoRA dropout kernel asks for (CPU: the dropped input, and dxd backward; CUDA: none).
Tensor dropout_scratch(const Tensor& x, int64_t T, int64_t in, bool backward) {
  return Tensor::empty({ops::kernels(x).lora_dropout_scratch_floats(T, in, backward)}, DType::F32, x.device());
}

// A group's dropout members for the kernels (null: no dropout, the plain GEMMs), checked against
// A_all's R rows: 1 to kMaxLoraDropoutMembers members of positive rows summing to R, p in [0, 1).
const LoraGroupDropout* checked_group_dropout(const LoraGroupDropout* dropout, int64_t R) {
  if (!dropout || dropout->p == 0.0f) return nullptr;
  if (!(dropout->p > 0.0f && dropout->p < 1.0f))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[linear] LoRA dropout must be in [0, 1) but is {}", dropout->p));
  const size_t n = dropout->members.size();
  BP_CHECK(n >= 1 && n <= static_cast<size_t>(cpu::kMaxLoraDropoutMembers),
           "[linear] a LoRA group with dropout has {} members (1 to {})", n, cpu::kMaxLoraDropoutMembers);
  for (const cpu::LoraDropoutMember& m : dropout->members)
    BP_CHECK(m.r > 0, "[linear] a LoRA group member has {} rows of the group's A", m.r);
  const int64_t rows = cpu::lora_dropout_rank(dropout->members.data(), static_cast<int>(n));
  BP_CHECK(rows == R, "[linear] the LoRA group's members have {} rows but its A has {}", rows, R);
  return dropout;
}

// The LoRA part of linear_backward (see the file comment): dB, dA and the LoRA term of dx,
// which is added to the dx the base GEMM already wrote.
void lora_backward(const float* g, const Tensor& x, const LoraWeights& lora, const LinearSaved* saved,
                   const LinearGrads& grads, int64_t T, int64_t in, int64_t out, int64_t r) {
  BP_CHECK(saved && saved->xa.defined(), "[linear] LoRA backward needs the xa saved by linear_forward");
  ops::require_tensor(kOp, "saved xa", saved->xa, DType::F32, 2);
  const int64_t ld_xa = saved->xa.dim(1);
  BP_CHECK(saved->xa.dim(0) == T && saved->col >= 0 && saved->col + r <= ld_xa,
           "[linear] saved xa {} has no columns [{}, {}) of {} rows", saved->xa.shape().str(), saved->col,
           saved->col + r, T);
  const bool dropped = dropout_active(lora);
  const float* A = lora.A->kernel_data<float>();
  const float* B = lora.B->kernel_data<float>();
  const float s = lora.scale;

  if (grads.dB)
    ops::kernels(x).sgemm(true, false, out, r, T, s, g, out, saved->xa.kernel_data<float>() + saved->col, ld_xa, 1.0f,
                          grads.dB->kernel_data<float>(), r);
  if (lora.group_dxa) {  // a group member: its dxa columns; dA and dx's LoRA term are lora_group_backward's
    BP_CHECK(!grads.dA, "[linear] a LoRA group member's dA is the group's (lora_group_backward)");
    Tensor& dxa = *lora.group_dxa;
    BP_CHECK(dxa.rank() == 2 && dxa.dim(0) == T && lora.group_col >= 0 && lora.group_col + r <= dxa.dim(1),
             "[linear] group dxa {} has no columns [{}, {}) of {} rows", dxa.shape().str(), lora.group_col,
             lora.group_col + r, T);
    ops::require_same_device(kOp, {&x, &dxa});
    ops::kernels(x).sgemm(false, false, T, r, out, s, g, out, B, r, lora.group_dxa_accumulate ? 1.0f : 0.0f,
                          dxa.kernel_data<float>() + lora.group_col, dxa.dim(1));
    return;
  }
  if (!grads.dA && !grads.dx) return;
  // dxa = s·g·B  [T, r]
  Tensor dxa = Tensor::empty({T, r}, DType::F32, x.device());
  ops::kernels(x).sgemm(false, false, T, r, out, s, g, out, B, r, 0.0f, dxa.kernel_data<float>(), r);
  if (dropped) {
    // dA and the LoRA term of dx through the regenerated mask: no saved xd, no dxd on the card.
    Tensor scratch = dropout_scratch(x, T, in, true);
    const cpu::LoraDropoutMember one{r, lora.dropout_seed};
    ops::kernels(x).lora_dropout_backward(dxa.kernel_data<float>(), x.kernel_data<float>(), A, lora.dropout, &one, 1,
                                          scratch.kernel_data<float>(),
                                          grads.dA ? grads.dA->kernel_data<float>() : nullptr,
                                          grads.dx ? grads.dx->kernel_data<float>() : nullptr, T, in);
    return;
  }
  if (grads.dA)
    ops::kernels(x).sgemm(true, false, r, in, T, 1.0f, dxa.kernel_data<float>(), r, x.kernel_data<float>(), in, 1.0f,
                          grads.dA->kernel_data<float>(), in);
  // dx += dxa·A straight into dx.
  if (grads.dx)
    ops::kernels(x).sgemm(false, false, T, in, r, 1.0f, dxa.kernel_data<float>(), r, A, in, 1.0f,
                          grads.dx->kernel_data<float>(), in);
}

}  // namespace

namespace {

// y = residual + x·Wᵀ + b + s·xd·Aᵀ·Bᵀ (plain LoRA; DoRA calls it for z, without bias and residual):
// saves xa (or the group's columns) in `saved`.
void lora_linear_into(const Tensor& x, const uint16_t* x16, const Tensor& W, const Tensor* bias, const Tensor* residual,
                      const LoraWeights* lora, int64_t r, LinearSaved* saved, Tensor& y) {
  const int64_t T = x.dim(0), in = x.dim(1), out = W.dim(0);
  if (lora->group_xa) {  // a group member: xa is the group's columns (lora_group_forward), no GEMM of x
    const Tensor& xa = *lora->group_xa;
    ops::require_tensor(kOp, "group xa", xa, DType::F32, 2);
    BP_CHECK(xa.dim(0) == T && lora->group_col >= 0 && lora->group_col + r <= xa.dim(1),
             "[linear] group xa {} has no columns [{}, {}) of {} rows", xa.shape().str(), lora->group_col,
             lora->group_col + r, T);
    ops::require_same_device(kOp, {&x, &xa});
    base_forward(x, x16, W, bias, residual, y);
    if (T > 0)
      ops::kernels(x).sgemm(false, true, T, out, r, lora->scale, xa.kernel_data<float>() + lora->group_col, xa.dim(1),
                            lora->B->kernel_data<float>(), r, 1.0f, y.kernel_data<float>(), out);
    if (saved) saved->xa = xa, saved->col = lora->group_col;
    return;
  }
  Tensor xa = Tensor::empty({T, r}, DType::F32, x.device());
  if (!dropout_active(*lora)) {
    base_forward(x, x16, W, bias, residual, y);
    ops::kernels(x).lora_forward(x.kernel_data<float>(), lora->A->kernel_data<float>(), lora->B->kernel_data<float>(),
                                 lora->scale, xa.kernel_data<float>(), y.kernel_data<float>(), T, in, out, r);
  } else {
    // xa = dropout(x)·Aᵀ before the base GEMM, so the CPU kernel's mask loop comes first and the
    // three GEMMs run back to back (OpenBLAS's worker threads keep spinning after a call, and an
    // OpenMP loop squeezed between two calls competes with them); then y += s·xa·Bᵀ.
    {
      Tensor scratch = dropout_scratch(x, T, in, false);
      const cpu::LoraDropoutMember one{r, lora->dropout_seed};
      ops::kernels(x).lora_dropout_xa(x.kernel_data<float>(), lora->A->kernel_data<float>(), lora->dropout, &one, 1,
                                      scratch.kernel_data<float>(), xa.kernel_data<float>(), T, in);
    }
    base_forward(x, x16, W, bias, residual, y);
    ops::kernels(x).sgemm(false, true, T, out, r, lora->scale, xa.kernel_data<float>(), r,
                          lora->B->kernel_data<float>(), r, 1.0f, y.kernel_data<float>(), out);
  }
  if (saved) saved->xa = std::move(xa), saved->col = 0;
}

// DoRA's column scale c = m/n and 1/n, n_j = ||W_j + s·(B·A)_j|| (see ops/linear.h "DoRA").
void dora_scale(const Tensor& W, const LoraWeights& lora, int64_t r, Tensor& c, Tensor& inv_n) {
  const Tensor& A = *lora.A;
  const Tensor& m = *lora.magnitude;
  const int64_t in = A.dim(1), out = W.dim(0);
  ops::require_shape(kOp, "DoRA magnitude", m, Shape{out});
  ops::require_shape(kOp, "DoRA weight norms", *lora.weight_norm_sq, Shape{out});
  ops::require_same_device(kOp, {&W, &m, lora.weight_norm_sq});
  const float s = lora.scale;
  const Device dev = A.device();
  Tensor Mt = Tensor::empty({r, out}, DType::F32, dev);  // 2s·A·Wᵀ + s²·(A·Aᵀ)·Bᵀ
  base_forward(A, nullptr, W, nullptr, nullptr, Mt);
  Tensor AAt = Tensor::empty({r, r}, DType::F32, dev);
  ops::kernels(A).sgemm(false, true, r, r, in, 1.0f, A.kernel_data<float>(), in, A.kernel_data<float>(), in, 0.0f,
                        AAt.kernel_data<float>(), r);
  ops::kernels(A).sgemm(false, true, r, out, r, s * s, AAt.kernel_data<float>(), r, lora.B->kernel_data<float>(), r,
                        2.0f * s, Mt.kernel_data<float>(), out);
  Tensor eye = Tensor::zeros({r, r});
  for (int64_t i = 0; i < r; ++i) eye.data<float>()[i * r + i] = 1.0f;
  if (dev.type != DeviceType::CPU) eye = eye.to(dev);
  Tensor Bt = Tensor::empty({r, out}, DType::F32, dev);  // Bᵀ = I·Bᵀ
  ops::kernels(A).sgemm(false, true, r, out, r, 1.0f, eye.kernel_data<float>(), r, lora.B->kernel_data<float>(), r,
                        0.0f, Bt.kernel_data<float>(), out);
  Tensor nsq = Tensor::empty({out}, DType::F32, dev);
  nsq.copy_from(*lora.weight_norm_sq);
  column_dot_accumulate(Bt, Mt, nullptr, nsq);
  c = Tensor::empty({out}, DType::F32, dev);
  inv_n = Tensor::empty({out}, DType::F32, dev);
  dora_column_scale(m, nsq, c, inv_n);
}

// DoRA with dropout reads W against the dropped input xd: xd·Wᵀ forward, dropout'(g·W) backward.
// An f32 W goes through the LoRA dropout kernels as a "LoRA A" of `out` rows with the
// projection's mask (same seed: the bits of xa's xd); a held W (bf16, quantized) is multiplied by
// xd made by those kernels with an identity A (xd·Iᵀ, [T, in]), then by the held GEMMs.
Tensor identity(int64_t n, Device dev) {
  Tensor eye = Tensor::zeros({n, n});
  for (int64_t i = 0; i < n; ++i) eye.data<float>()[i * n + i] = 1.0f;
  return dev.type == DeviceType::CPU ? eye : eye.to(dev);
}

Tensor dropped_base_forward(const Tensor& x, const Tensor& W, const LoraWeights& lora) {
  const int64_t T = x.dim(0), in = x.dim(1), out = W.dim(0);
  Tensor scratch = dropout_scratch(x, T, in, false);
  auto dropped_times = [&](const Tensor& M, Tensor& into) {  // into = xd·Mᵀ
    const cpu::LoraDropoutMember one{M.dim(0), lora.dropout_seed};
    ops::kernels(x).lora_dropout_xa(x.kernel_data<float>(), M.kernel_data<float>(), lora.dropout, &one, 1,
                                    scratch.kernel_data<float>(), into.kernel_data<float>(), T, in);
  };
  Tensor z = Tensor::empty({T, out}, DType::F32, x.device());
  if (W.dtype() == DType::F32) {
    dropped_times(W, z);
    return z;
  }
  Tensor xd = Tensor::empty({T, in}, DType::F32, x.device());
  dropped_times(identity(in, x.device()), xd);
  base_forward(xd, nullptr, W, nullptr, nullptr, z);
  return z;
}

// dx += dropout'(g·W) for g [T, out] (the mask of dropped_base_forward).
void dropped_base_dx(const Tensor& g, const Tensor& x, const Tensor& W, const LoraWeights& lora, Tensor& dx) {
  const int64_t T = x.dim(0), in = x.dim(1);
  Tensor scratch = dropout_scratch(x, T, in, true);
  auto dropped_back = [&](const Tensor& d, const Tensor& M) {  // dx += dropout'(d·M)
    const cpu::LoraDropoutMember one{M.dim(0), lora.dropout_seed};
    ops::kernels(x).lora_dropout_backward(d.kernel_data<float>(), x.kernel_data<float>(), M.kernel_data<float>(),
                                          lora.dropout, &one, 1, scratch.kernel_data<float>(), nullptr,
                                          dx.kernel_data<float>(), T, in);
  };
  if (W.dtype() == DType::F32) {
    dropped_back(g, W);
    return;
  }
  Tensor gW = Tensor::empty({T, in}, DType::F32, x.device());
  ops::kernels(x).held_linear_backward(g.kernel_data<float>(), nullptr, nullptr, nullptr, ops::held_gemm_matrix(W),
                                       0.0f, gW.kernel_data<float>(), nullptr, T);
  dropped_back(gW, identity(in, x.device()));
}

// DoRA's z with dropout (PEFT's DoraLinearVariant while training with dropout): z = xd·Wᵀ +
// s·xd·Aᵀ·Bᵀ, and y (already residual + b + x·Wᵀ, the base layer on the undropped x) −= xd·Wᵀ, so
// that y + c ⊙ z = residual + b + x·Wᵀ + (c − 1) ⊙ (xd·Wᵀ) + c ⊙ s·xd·Aᵀ·Bᵀ. Saves xa like
// lora_linear_into.
Tensor dora_dropout_z(const Tensor& x, const Tensor& W, const LoraWeights& lora, int64_t r, LinearSaved* saved,
                      Tensor& y) {
  const int64_t T = x.dim(0), in = x.dim(1), out = W.dim(0);
  Tensor z = dropped_base_forward(x, W, lora);
  axpy_inplace(y, -1.0f, z);
  Tensor xa;
  int64_t col = 0;
  if (lora.group_xa) {  // a group member: the group's dropped xa columns (lora_group_forward)
    const Tensor& g = *lora.group_xa;
    ops::require_tensor(kOp, "group xa", g, DType::F32, 2);
    BP_CHECK(g.dim(0) == T && lora.group_col >= 0 && lora.group_col + r <= g.dim(1),
             "[linear] group xa {} has no columns [{}, {}) of {} rows", g.shape().str(), lora.group_col,
             lora.group_col + r, T);
    xa = g, col = lora.group_col;
  } else {
    xa = Tensor::empty({T, r}, DType::F32, x.device());
    Tensor scratch = dropout_scratch(x, T, in, false);
    const cpu::LoraDropoutMember one{r, lora.dropout_seed};
    ops::kernels(x).lora_dropout_xa(x.kernel_data<float>(), lora.A->kernel_data<float>(), lora.dropout, &one, 1,
                                    scratch.kernel_data<float>(), xa.kernel_data<float>(), T, in);
  }
  if (T > 0)
    ops::kernels(x).sgemm(false, true, T, out, r, lora.scale, xa.kernel_data<float>() + col, xa.dim(1),
                          lora.B->kernel_data<float>(), r, 1.0f, z.kernel_data<float>(), out);
  if (saved) saved->xa = std::move(xa), saved->col = col;
  return z;
}

}  // namespace

Tensor linear_forward(const Tensor& x, const Tensor& W, const Tensor* bias, const LoraWeights* lora, LinearSaved* saved,
                      const Tensor* x_bf16, const Tensor* residual) {
  const int64_t r = check_linear_args(x, W, bias, lora);
  const int64_t T = x.dim(0), out = W.dim(0);
  const uint16_t* x16 = ops::bf16_input(kOp, "x_bf16", x_bf16, x);
  if (residual) {
    ops::require_shape(kOp, "residual", *residual, Shape{T, out});
    ops::require_same_device(kOp, {&x, residual});
  }
  Tensor y = Tensor::empty({T, out}, DType::F32, x.device());
  if (saved) *saved = LinearSaved{};  // drop anything from an earlier call
  if (!lora) {
    base_forward(x, x16, W, bias, residual, y);
    return y;
  }
  if (!lora->magnitude) {
    lora_linear_into(x, x16, W, bias, residual, lora, r, saved, y);
    return y;
  }
  // DoRA: y = residual + b + c ⊙ z (with dropout: + x·Wᵀ − xd·Wᵀ, z on xd: dora_dropout_z)
  Tensor c, inv_n;
  dora_scale(W, *lora, r, c, inv_n);
  Tensor z;
  if (dropout_active(*lora)) {
    base_forward(x, x16, W, bias, residual, y);
    z = dora_dropout_z(x, W, *lora, r, saved, y);
  } else {
    z = Tensor::empty({T, out}, DType::F32, x.device());
    lora_linear_into(x, x16, W, nullptr, nullptr, lora, r, saved, z);
    if (residual)
      y.copy_from(*residual);
    else
      y.zero();
    if (bias) add_bias_inplace(y, *bias);
  }
  column_scale_add(y, c, z);
  if (saved) {
    saved->dora_z = std::move(z);
    saved->dora_c = std::move(c);
    saved->dora_inv_n = std::move(inv_n);
  }
  return y;
}

void linear_backward(const Tensor& dy, const Tensor& x_f32, const Tensor& W, const LoraWeights* lora,
                     const LinearSaved* saved, const LinearGrads& grads, const Tensor* dy_bf16, const Tensor* x_bf16) {
  // x's bf16 copy alone (x undefined) serves GEMMs that read bf16 and nothing else: no LoRA (its
  // products read f32 x), W held or a GEMM copy on a bf16 card (held_gemms_read_bf16).
  const bool x_as_copy = !x_f32.defined();
  if (x_as_copy && !(x_bf16 && !lora && held_gemms_read_bf16(W)))
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[linear] backward without x needs x_bf16, no LoRA and a weight whose GEMMs read bf16 "
                            "(x_bf16 {}, LoRA {}, W {})",
                            x_bf16 ? "given" : "missing", lora ? "given" : "none", W.describe()));
  const Tensor& x = x_as_copy ? *x_bf16 : x_f32;  // shapes and device; read as f32 only when defined
  int64_t r = 0;
  if (x_as_copy) {
    ops::require_tensor(kOp, "x_bf16", x, DType::BF16, 2);
    BP_CHECK(W.dim(1) == x.dim(1), "[linear] x_bf16 has {} columns but W has {} (W is {})", x.dim(1), W.dim(1),
             W.shape().str());
    ops::require_same_device(kOp, {&x, &W});
  } else {
    r = check_linear_args(x, W, nullptr, lora);
  }
  const int64_t T = x.dim(0), in = x.dim(1), out = W.dim(0);
  ops::require_shape(kOp, "dy", dy, Shape{T, out});
  const uint16_t* dy16 = ops::bf16_input(kOp, "dy_bf16", dy_bf16, dy);
  BP_CHECK(!grads.dm || (lora && lora->magnitude), "[linear] dm requested but no DoRA magnitude was given");
  // DoRA: dm += (Σ_t g ⊙ z)/n, and the base and LoRA products take g ⊙ c (ops/linear.h "DoRA");
  // with dropout the base product takes g and the dropped one (c − 1) ⊙ g (dora_dropped_g).
  Tensor dy_scaled, dora_dropped_g;
  const bool dora_dropout = lora && lora->magnitude && dropout_active(*lora);
  if (lora && lora->magnitude) {
    BP_CHECK(!grads.dW, "[linear] DoRA adapts a frozen weight: no dW");
    BP_CHECK(saved && saved->dora_z.defined() && saved->dora_c.defined() && saved->dora_inv_n.defined(),
             "[linear] DoRA backward needs z, c and 1/n saved by linear_forward");
    ops::require_shape(kOp, "saved DoRA z", saved->dora_z, Shape{T, out});
    if (grads.dm) {
      ops::require_shape(kOp, "dm", *grads.dm, Shape{out});
      column_dot_accumulate(dy, saved->dora_z, &saved->dora_inv_n, *grads.dm);
    }
    dy_scaled = Tensor::zeros({T, out}, DType::F32, dy.device());
    column_scale_add(dy_scaled, saved->dora_c, dy);
    if (dora_dropout && grads.dx) {
      dora_dropped_g = dy_scaled.clone();
      axpy_inplace(dora_dropped_g, -1.0f, dy);
    } else {
      dy16 = nullptr;  // dy's bf16 copy is not g ⊙ c's
    }
  }
  const uint16_t* x16 = ops::bf16_input(kOp, "x_bf16", x_bf16, x);
  if (grads.dx) ops::require_shape(kOp, "dx", *grads.dx, Shape{T, in});
  if (grads.dW) ops::require_shape(kOp, "dW", *grads.dW, Shape{out, in});
  if (grads.db) ops::require_shape(kOp, "db", *grads.db, Shape{out});
  if (!lora) {
    BP_CHECK(!grads.dA && !grads.dB, "[linear] dA/dB requested but no LoRA weights were given");
  } else {
    if (grads.dA) ops::require_shape(kOp, "dA", *grads.dA, Shape{r, in});
    if (grads.dB) ops::require_shape(kOp, "dB", *grads.dB, Shape{out, r});
  }

  ops::require_same_device(kOp, {&x, &dy, grads.dx, grads.dW, grads.db, grads.dA, grads.dB});
  // The GEMMs back to back, the OpenMP loops (db) last: OpenBLAS's workers keep spinning after a
  // call and would compete with an OpenMP loop placed between two calls. (With dropout the CPU's
  // backward kernel regenerates xd between the dxa GEMM and its own two: within noise, measured.)
  // g: what the base products read (g ⊙ c under DoRA without dropout), g_lora the LoRA's.
  const float* g_lora = dy_scaled.defined() ? dy_scaled.kernel_data<float>() : dy.kernel_data<float>();
  const float* g = dora_dropout ? dy.kernel_data<float>() : g_lora;
  // dW is asked for an f32 weight, or for the bf16 GEMM copy of a trainable f32 master (full
  // fine-tuning with training.matmul_dtype bf16: model/transformer.h); held frozen types get none.
  BP_CHECK(!grads.dW || W.dtype() == DType::F32 || W.dtype() == DType::BF16,
           "[linear] dW asked for a frozen {} weight (held weights get no gradient)", W.describe());
  const float dx_beta = grads.accumulate_dx ? 1.0f : 0.0f;
  if (grads.dx && W.dtype() == DType::F32)
    ops::kernels(x).linear_dx(g, W.kernel_data<float>(), dx_beta, grads.dx->kernel_data<float>(), T, in, out);
  if ((grads.dx || grads.dW) && W.dtype() != DType::F32)  // dW: W is a bf16 GEMM copy (full fine-tuning)
    ops::kernels(x).held_linear_backward(
        g, dy16, x_as_copy ? nullptr : x.kernel_data<float>(), x16, ops::held_gemm_matrix(W), dx_beta,
        grads.dx ? grads.dx->kernel_data<float>() : nullptr, grads.dW ? grads.dW->kernel_data<float>() : nullptr, T);
  if (grads.dW && W.dtype() == DType::F32)
    ops::kernels(x).linear_dW_accumulate(g, x.kernel_data<float>(), grads.dW->kernel_data<float>(), T, in, out);
  if (dora_dropped_g.defined() && T > 0) dropped_base_dx(dora_dropped_g, x, W, *lora, *grads.dx);
  if (lora && T > 0 && (grads.dx || grads.dA || grads.dB || lora->group_dxa))
    lora_backward(g_lora, x, *lora, saved, grads, T, in, out, r);
  if (grads.db) ops::kernels(x).bias_grad_accumulate(dy.kernel_data<float>(), grads.db->kernel_data<float>(), T, out);
}

Tensor lora_group_forward(const Tensor& x, const Tensor& A_all, const LoraGroupDropout* dropout) {
  ops::require_tensor(kOp, "x", x, DType::F32, 2);
  ops::require_tensor(kOp, "group A", A_all, DType::F32, 2);
  const int64_t T = x.dim(0), in = x.dim(1), R = A_all.dim(0);
  BP_CHECK(A_all.dim(1) == in, "[linear] x has {} columns but the group's A is {}", in, A_all.shape().str());
  ops::require_same_device(kOp, {&x, &A_all});
  const LoraGroupDropout* dropped = checked_group_dropout(dropout, R);
  Tensor xa = Tensor::empty({T, R}, DType::F32, x.device());
  if (T == 0 || R == 0) return xa;
  if (dropped) {
    Tensor scratch = dropout_scratch(x, T, in, false);
    ops::kernels(x).lora_dropout_xa(x.kernel_data<float>(), A_all.kernel_data<float>(), dropped->p,
                                    dropped->members.data(), static_cast<int>(dropped->members.size()),
                                    scratch.kernel_data<float>(), xa.kernel_data<float>(), T, in);
    return xa;
  }
  ops::kernels(x).sgemm(false, true, T, R, in, 1.0f, x.kernel_data<float>(), in, A_all.kernel_data<float>(), in, 0.0f,
                        xa.kernel_data<float>(), R);
  return xa;
}

void lora_group_backward(const Tensor& x, const Tensor& A_all, const Tensor& dxa_all, Tensor* dA_all, Tensor* dx,
                         const LoraGroupDropout* dropout) {
  ops::require_tensor(kOp, "x", x, DType::F32, 2);
  ops::require_tensor(kOp, "group A", A_all, DType::F32, 2);
  const int64_t T = x.dim(0), in = x.dim(1), R = A_all.dim(0);
  BP_CHECK(A_all.dim(1) == in, "[linear] x has {} columns but the group's A is {}", in, A_all.shape().str());
  ops::require_shape(kOp, "group dxa", dxa_all, Shape{T, R});
  if (dA_all) ops::require_shape(kOp, "group dA", *dA_all, Shape{R, in});
  if (dx) ops::require_shape(kOp, "dx", *dx, Shape{T, in});
  ops::require_same_device(kOp, {&x, &A_all, &dxa_all, dA_all, dx});
  const LoraGroupDropout* dropped = checked_group_dropout(dropout, R);
  if (T == 0 || R == 0 || (!dA_all && !dx)) return;
  const float* dxa = dxa_all.kernel_data<float>();
  if (dropped) {
    Tensor scratch = dropout_scratch(x, T, in, true);
    ops::kernels(x).lora_dropout_backward(dxa, x.kernel_data<float>(), A_all.kernel_data<float>(), dropped->p,
                                          dropped->members.data(), static_cast<int>(dropped->members.size()),
                                          scratch.kernel_data<float>(), dA_all ? dA_all->kernel_data<float>() : nullptr,
                                          dx ? dx->kernel_data<float>() : nullptr, T, in);
    return;
  }
  if (dA_all)
    ops::kernels(x).sgemm(true, false, R, in, T, 1.0f, dxa, R, x.kernel_data<float>(), in, 1.0f,
                          dA_all->kernel_data<float>(), in);
  if (dx)
    ops::kernels(x).sgemm(false, false, T, in, R, 1.0f, dxa, R, A_all.kernel_data<float>(), in, 1.0f,
                          dx->kernel_data<float>(), in);
}

bool held_gemms_read_bf16(const Tensor& W) {
  return W.dtype() != DType::F32 && W.device().type == DeviceType::CUDA && !ops::cuda_frozen_gemms_in_f16();
}

int64_t lora_dropout_scratch_floats(DeviceType device, int64_t T, int64_t in, bool backward) {
  return ops::kernels(device).lora_dropout_scratch_floats(T, in, backward);
}

void matmul_accumulate(Tensor& C, float alpha, const Tensor& A, const Tensor& B) {
  constexpr const char* op = "matmul";
  ops::require_tensor(op, "A", A, DType::F32, 2);
  const int64_t M = A.dim(0), K = A.dim(1);
  ops::require_tensor(op, "B", B, DType::F32, 2);
  const int64_t N = B.dim(1);
  ops::require_shape(op, "B", B, Shape{K, N});
  ops::require_shape(op, "C", C, Shape{M, N});
  ops::require_same_device(op, {&C, &A, &B});
  ops::kernels(C).sgemm(false, false, M, N, K, alpha, A.kernel_data<float>(), K, B.kernel_data<float>(), N, 1.0f,
                        C.kernel_data<float>(), N);
}

}  // namespace bp
