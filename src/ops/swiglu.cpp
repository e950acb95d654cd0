// SwiGLU front-end: shape/dtype checks and dispatch to backend/cpu/swiglu.cpp. Contract: ops/swiglu.h.
#include "ops/swiglu.h"

#include "ops/op_checks.h"

namespace bp {

namespace {
constexpr const char* kOp = "swiglu";
}

Tensor swiglu_forward(const Tensor& gate, const Tensor& up) {
  ops::require_tensor(kOp, "gate", gate, DType::F32, gate.rank());
  ops::require_shape(kOp, "up", up, gate.shape());
  ops::require_same_device(kOp, {&gate, &up});
  Tensor h = Tensor::empty(gate.shape(), DType::F32, gate.device());
  ops::kernels(gate).swiglu_forward(gate.kernel_data<float>(), up.kernel_data<float>(), h.kernel_data<float>(),
                                    gate.numel());
  return h;
}

void swiglu_backward(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup) {
  ops::require_tensor(kOp, "gate", gate, DType::F32, gate.rank());
  ops::require_shape(kOp, "up", up, gate.shape());
  ops::require_shape(kOp, "dh", dh, gate.shape());
  ops::require_shape(kOp, "dgate", dgate, gate.shape());
  ops::require_shape(kOp, "dup", dup, gate.shape());
  ops::require_same_device(kOp, {&dh, &gate, &up, &dgate, &dup});
  ops::kernels(dh).swiglu_backward(dh.kernel_data<float>(), gate.kernel_data<float>(), up.kernel_data<float>(),
                                   dgate.kernel_data<float>(), dup.kernel_data<float>(), gate.numel());
}

}  // namespace bp
