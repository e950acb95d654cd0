// RMSNorm front-end: shape/dtype checks and dispatch (ops/dispatch.h).
// Contract: ops/rms_norm.h.
#include "ops/rms_norm.h"

#include <cmath>

#include "ops/op_checks.h"

namespace bp {

namespace {
constexpr const char* kOp = "rms_norm";

void check_x_w(const Tensor& x, const Tensor& w) {
  ops::require_tensor(kOp, "x", x, DType::F32, 2);
  ops::require_tensor(kOp, "w", w, DType::F32, 1);
  BP_CHECK(w.dim(0) == x.dim(1), "[rms_norm] x has {} columns but w has {}", x.dim(1), w.dim(0));
  ops::require_same_device(kOp, {&x, &w});
}
}  // namespace

Tensor rms_norm_forward(const Tensor& x, const Tensor& w, float eps, Tensor* rstd, Tensor* y_bf16) {
  check_x_w(x, w);
  if (!(eps > 0.0f) || !std::isfinite(eps))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[rms_norm] eps must be positive but is {}", eps));
  const int64_t N = x.dim(0), D = x.dim(1);
  if (rstd) {
    if (!rstd->defined()) *rstd = Tensor::empty({N}, DType::F32, x.device());
    ops::require_shape(kOp, "rstd", *rstd, Shape{N});
  }
  uint16_t* y16 = ops::bf16_output(kOp, "y_bf16", y_bf16, Shape{N, D}, x.device());
  ops::require_same_device(kOp, {&x, rstd});
  Tensor y = Tensor::empty({N, D}, DType::F32, x.device());
  ops::kernels(x).rms_norm_forward(x.kernel_data<float>(), w.kernel_data<float>(), eps, y.kernel_data<float>(), y16,
                                   rstd ? rstd->kernel_data<float>() : nullptr, N, D);
  return y;
}

void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx, Tensor* dw,
                       bool accumulate_dx, Tensor* dx_bf16) {
  check_x_w(x, w);
  const int64_t N = x.dim(0), D = x.dim(1);
  ops::require_shape(kOp, "dy", dy, Shape{N, D});
  ops::require_shape(kOp, "rstd", rstd, Shape{N});
  ops::require_shape(kOp, "dx", dx, Shape{N, D});
  if (dw) ops::require_shape(kOp, "dw", *dw, Shape{D});
  ops::require_same_device(kOp, {&x, &dy, &rstd, &dx, dw});
  uint16_t* dx16 = ops::bf16_output(kOp, "dx_bf16", dx_bf16, Shape{N, D}, x.device());
  ops::kernels(x).rms_norm_backward(dy.kernel_data<float>(), x.kernel_data<float>(), w.kernel_data<float>(),
                                    rstd.kernel_data<float>(), dx.kernel_data<float>(), dx16,
                                    dw ? dw->kernel_data<float>() : nullptr, N, D, accumulate_dx);
}

}  // namespace bp
