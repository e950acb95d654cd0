// One dispatch point per device for the ops (DESIGN.md "Ops"): every op front-end gets its kernels
// from the table of the device its tensors live on, `ops::kernels(t).rms_norm_forward(...)`, never
// from a backend namespace directly. The tables are built from the one kernel list
// ops/kernels.inc: the CPU table holds every kernel; the CUDA table holds the CUDA kernels that
// exist (none yet: the CUDA backend of the next issues fills its entries in dispatch.cpp).
//
// A device whose table is empty is refused up front by require_backend (called by the argument
// checks of ops/op_checks.h, before anything reads a tensor's memory): cuda_op_unavailable(op),
// "not built with CUDA" or "no CUDA kernel yet". A missing single entry of a present table throws
// the same error naming the kernel, never a null call.
#pragma once

#include "backend/cpu/attention.h"
#include "backend/cpu/cross_entropy.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/embedding.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/optim.h"
#include "backend/cpu/quant_gemm.h"
#include "backend/cpu/rms_norm.h"
#include "backend/cpu/rope.h"
#include "backend/cpu/swiglu.h"
#include "core/tensor.h"

namespace bp::ops {

[[noreturn]] void kernel_unavailable(DeviceType device, const char* kernel);

// A kernel entry: calls the backend's function, or throws when this backend lacks it.
template <class Fn>
struct Kernel;
template <class R, class... Args>
struct Kernel<R(Args...)> {
  R (*fn)(Args...) = nullptr;
  const char* name = "";
  DeviceType device = DeviceType::CPU;
  R operator()(Args... args) const {
    if (!fn) kernel_unavailable(device, name);
    return fn(args...);
  }
};

// One member per line of kernels.inc, typed by the CPU kernel's signature (the reference).
struct Kernels {
#define BP_KERNEL(op, name) Kernel<decltype(cpu::name)> name;
#include "ops/kernels.inc"
#undef BP_KERNEL
  int count = 0;  // kernels present
};

// The table of a device type (the CUDA table is empty in builds without CUDA).
const Kernels& kernels(DeviceType device);
// The table for `t`'s device; refuses (cuda_op_unavailable(op)) a device whose table is empty.
const Kernels& require_backend(const char* op, const Tensor& t);
inline const Kernels& kernels(const Tensor& t) {
  return kernels(t.device().type);
}

// A 2-D weight as the held-matrix view the kernels of backend/cpu/quant_gemm.h read (any float
// or block dtype; rows must be whole blocks).
inline cpu::HeldMatrix held_matrix(const Tensor& W) {
  return {W.raw(), W.dtype(), W.dim(0), W.dim(1)};
}

}  // namespace bp::ops
