// SwiGLU front-end: shape/dtype checks and dispatch to backend/cpu/swiglu.cpp. Contract: ops/swiglu.h.
#include "ops/swiglu.h"

#include "ops/op_checks.h"

namespace bp {

namespace {
constexpr const char* kOp = "swiglu";
}

Tensor swiglu_forward(const Tensor& gate, const Tensor& up, Tensor* h_bf16) {
  ops::require_tensor(kOp, "gate", gate, DType::F32, gate.rank());
  ops::require_shape(kOp, "up", up, gate.shape());
  ops::require_same_device(kOp, {&gate, &up});
  uint16_t* h16 = ops::bf16_output(kOp, "h_bf16", h_bf16, gate.shape(), gate.device());
  Tensor h = Tensor::empty(gate.shape(), DType::F32, gate.device());
  ops::kernels(gate).swiglu_forward(gate.kernel_data<float>(), up.kernel_data<float>(), h.kernel_data<float>(), h16,
                                    gate.numel());
  return h;
}

void swiglu_backward(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup,
                     Tensor* dgate_bf16, Tensor* dup_bf16) {
  ops::require_tensor(kOp, "gate", gate, DType::F32, gate.rank());
  ops::require_shape(kOp, "up", up, gate.shape());
  ops::require_shape(kOp, "dh", dh, gate.shape());
  ops::require_shape(kOp, "dgate", dgate, gate.shape());
  ops::require_shape(kOp, "dup", dup, gate.shape());
  ops::require_same_device(kOp, {&dh, &gate, &up, &dgate, &dup});
  uint16_t* dg16 = ops::bf16_output(kOp, "dgate_bf16", dgate_bf16, gate.shape(), dh.device());
  uint16_t* du16 = ops::bf16_output(kOp, "dup_bf16", dup_bf16, gate.shape(), dh.device());
  ops::kernels(dh).swiglu_backward(dh.kernel_data<float>(), gate.kernel_data<float>(), up.kernel_data<float>(),
                                   dgate.kernel_data<float>(), dup.kernel_data<float>(), dg16, du16, gate.numel());
}

}  // namespace bp
