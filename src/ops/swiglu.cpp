// SwiGLU front-end: shape/dtype checks and dispatch to backend/cpu/swiglu.cpp. Contract: ops/swiglu.h.
#include "ops/swiglu.h"

#include "ops/dispatch.h"
#include "ops/op_checks.h"

namespace bp {

namespace {
using ForwardKernel = ops::Kernel<decltype(cpu::swiglu_forward)> ops::Kernels::*;
using BackwardKernel = ops::Kernel<decltype(cpu::swiglu_backward)> ops::Kernels::*;

// Both gated MLPs (`op` names them in errors; `kernel` is the table's swiglu_* or geglu_* entry).
Tensor gated_forward(const char* op, ForwardKernel kernel, const Tensor& gate, const Tensor& up, Tensor* h_bf16) {
  ops::require_tensor(op, "gate", gate, DType::F32, gate.rank());
  ops::require_shape(op, "up", up, gate.shape());
  ops::require_same_device(op, {&gate, &up});
  uint16_t* h16 = ops::bf16_output(op, "h_bf16", h_bf16, gate.shape(), gate.device());
  Tensor h = Tensor::empty(gate.shape(), DType::F32, gate.device());
  (ops::kernels(gate).*kernel)(gate.kernel_data<float>(), up.kernel_data<float>(), h.kernel_data<float>(), h16,
                               gate.numel());
  return h;
}

void gated_backward(const char* op, BackwardKernel kernel, const Tensor& dh, const Tensor& gate, const Tensor& up,
                    Tensor& dgate, Tensor& dup, Tensor* dgate_bf16, Tensor* dup_bf16) {
  ops::require_tensor(op, "gate", gate, DType::F32, gate.rank());
  ops::require_shape(op, "up", up, gate.shape());
  ops::require_shape(op, "dh", dh, gate.shape());
  ops::require_shape(op, "dgate", dgate, gate.shape());
  ops::require_shape(op, "dup", dup, gate.shape());
  ops::require_same_device(op, {&dh, &gate, &up, &dgate, &dup});
  uint16_t* dgate16 = ops::bf16_output(op, "dgate_bf16", dgate_bf16, gate.shape(), dh.device());
  uint16_t* dup16 = ops::bf16_output(op, "dup_bf16", dup_bf16, gate.shape(), dh.device());
  (ops::kernels(dh).*kernel)(dh.kernel_data<float>(), gate.kernel_data<float>(), up.kernel_data<float>(),
                             dgate.kernel_data<float>(), dup.kernel_data<float>(), dgate16, dup16, gate.numel());
}
}  // namespace

Tensor swiglu_forward(const Tensor& gate, const Tensor& up, Tensor* h_bf16) {
  return gated_forward("swiglu", &ops::Kernels::swiglu_forward, gate, up, h_bf16);
}

void swiglu_backward(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup,
                     Tensor* dgate_bf16, Tensor* dup_bf16) {
  gated_backward("swiglu", &ops::Kernels::swiglu_backward, dh, gate, up, dgate, dup, dgate_bf16, dup_bf16);
}

Tensor geglu_forward(const Tensor& gate, const Tensor& up, Tensor* h_bf16) {
  return gated_forward("geglu", &ops::Kernels::geglu_forward, gate, up, h_bf16);
}

void geglu_backward(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup,
                    Tensor* dgate_bf16, Tensor* dup_bf16) {
  gated_backward("geglu", &ops::Kernels::geglu_backward, dh, gate, up, dgate, dup, dgate_bf16, dup_bf16);
}

}  // namespace bp
