// CPU kernels for RMSNorm (contract: ops/rms_norm.h). x, y, dy, dx: [N, D]; w, dw: [D]; rstd: [N].
#pragma once

#include <cstdint>

namespace bp::cpu {

// y = x·rstd·w with rstd = 1/sqrt(mean(x²) + eps); rstd may be null. y_bf16 (may be null): y
// rounded to nearest-even bf16 as well, for the bf16 GEMMs that read y (ops/rms_norm.h).
void rms_norm_forward(const float* x, const float* w, float eps, float* y, uint16_t* y_bf16, float* rstd, int64_t N,
                      int64_t D);
// dx = rstd·(w⊙dy) − x·rstd³/D·Σ(w⊙dy⊙x)   (=, or += when `accumulate`: a residual's gradient
// already in dx);  dw += Σ_n dy⊙x·rstd   (+=, skipped when null); dx_bf16 (may be null): the
// resulting dx rounded to nearest-even bf16 as well, for the bf16 GEMMs that read it as their dy.
void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx, uint16_t* dx_bf16,
                       float* dw, int64_t N, int64_t D, bool accumulate);

}  // namespace bp::cpu
