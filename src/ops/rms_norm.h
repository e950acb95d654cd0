// RMSNorm: y = x / sqrt(mean(x²) + eps) · w   over the last dimension.
// x [N, D], w [D], y [N, D]; Qwen3's per-head q/k norm uses x viewed as [T·heads, head_dim].
// Saved for backward: x (kept by the caller) and rstd [N] = 1/sqrt(mean(x²)+eps).
// y_bf16 (an output like rstd, may be null; allocated when undefined): y also rounded to
// nearest-even bf16 [N, D], by the same kernel: the operand of the bf16 GEMMs that read y
// (ops/linear.h x_bf16), so they need not round y again each.
// Gradients: dx (=; += with accumulate_dx, for a residual's gradient already in dx), dw (+=, may be
// null when w is frozen); dx_bf16 (an output, may be null; allocated when undefined): the
// resulting dx also rounded to nearest-even bf16, the dy of the bf16 GEMMs that read it.
#pragma once

#include "core/tensor.h"

namespace bp {

Tensor rms_norm_forward(const Tensor& x, const Tensor& w, float eps, Tensor* rstd /* out [N], may be null */,
                        Tensor* y_bf16 = nullptr);
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx, Tensor* dw,
                       bool accumulate_dx = false, Tensor* dx_bf16 = nullptr);

}  // namespace bp
