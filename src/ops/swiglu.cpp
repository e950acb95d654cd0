// SwiGLU front-end: shape/dtype checks and dispatch to backend/cpu/swiglu.cpp. Contract: ops/swiglu.h.
#include "ops/swiglu.h"

#include "ops/op_checks.h"

namespace bp {

namespace {
constexpr const char* kOp = "swiglu";
constexpr const char* kGeOp = "geglu";

// The checks of both gated MLPs' forward (`op` names them in errors).
uint16_t* check_forward(const char* op, const Tensor& gate, const Tensor& up, Tensor* h_bf16) {
  ops::require_tensor(op, "gate", gate, DType::F32, gate.rank());
  ops::require_shape(op, "up", up, gate.shape());
  ops::require_same_device(op, {&gate, &up});
  return ops::bf16_output(op, "h_bf16", h_bf16, gate.shape(), gate.device());
}

struct BackwardCopies {
  uint16_t* dgate16;
  uint16_t* dup16;
};
BackwardCopies check_backward(const char* op, const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate,
                              Tensor& dup, Tensor* dgate_bf16, Tensor* dup_bf16) {
  ops::require_tensor(op, "gate", gate, DType::F32, gate.rank());
  ops::require_shape(op, "up", up, gate.shape());
  ops::require_shape(op, "dh", dh, gate.shape());
  ops::require_shape(op, "dgate", dgate, gate.shape());
  ops::require_shape(op, "dup", dup, gate.shape());
  ops::require_same_device(op, {&dh, &gate, &up, &dgate, &dup});
  return {ops::bf16_output(op, "dgate_bf16", dgate_bf16, gate.shape(), dh.device()),
          ops::bf16_output(op, "dup_bf16", dup_bf16, gate.shape(), dh.device())};
}
}  // namespace

Tensor swiglu_forward(const Tensor& gate, const Tensor& up, Tensor* h_bf16) {
  uint16_t* h16 = check_forward(kOp, gate, up, h_bf16);
  Tensor h = Tensor::empty(gate.shape(), DType::F32, gate.device());
  ops::kernels(gate).swiglu_forward(gate.kernel_data<float>(), up.kernel_data<float>(), h.kernel_data<float>(), h16,
                                    gate.numel());
  return h;
}

void swiglu_backward(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup,
                     Tensor* dgate_bf16, Tensor* dup_bf16) {
  const BackwardCopies c = check_backward(kOp, dh, gate, up, dgate, dup, dgate_bf16, dup_bf16);
  ops::kernels(dh).swiglu_backward(dh.kernel_data<float>(), gate.kernel_data<float>(), up.kernel_data<float>(),
                                   dgate.kernel_data<float>(), dup.kernel_data<float>(), c.dgate16, c.dup16,
                                   gate.numel());
}

Tensor geglu_forward(const Tensor& gate, const Tensor& up, Tensor* h_bf16) {
  uint16_t* h16 = check_forward(kGeOp, gate, up, h_bf16);
  Tensor h = Tensor::empty(gate.shape(), DType::F32, gate.device());
  ops::kernels(gate).geglu_forward(gate.kernel_data<float>(), up.kernel_data<float>(), h.kernel_data<float>(), h16,
                                   gate.numel());
  return h;
}

void geglu_backward(const Tensor& dh, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup,
                    Tensor* dgate_bf16, Tensor* dup_bf16) {
  const BackwardCopies c = check_backward(kGeOp, dh, gate, up, dgate, dup, dgate_bf16, dup_bf16);
  ops::kernels(dh).geglu_backward(dh.kernel_data<float>(), gate.kernel_data<float>(), up.kernel_data<float>(),
                                  dgate.kernel_data<float>(), dup.kernel_data<float>(), c.dgate16, c.dup16,
                                  gate.numel());
}

}  // namespace bp
