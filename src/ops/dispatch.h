// One dispatch point per device for the ops (DESIGN.md "Ops"): every op front-end gets its kernels
// from the table of the device its tensors live on, `ops::kernels(t).rms_norm_forward(...)`, never
// from a backend namespace directly. The tables are built from the one kernel list
// ops/kernels.inc: the CPU table holds every kernel; the CUDA table holds the CUDA kernels that
// exist: in CUDA builds, the wrappers of backend/cuda/kernel_wrappers.h over the bp::cuda launchers
// (cuda::KernelWrappers); test_cuda installs the same wrappers over the simulated kernels
// (sim::KernelWrappers) with install_kernels. An entry a backend lacks is null (the CUDA gaps:
// backend/cuda/kernel_gaps.h, empty today).
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
#include "backend/cpu/moe.h"
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
// Replaces the table of `device` (CUDA only) until the next call: the simulated CUDA device of the
// tests. Not thread-safe against ops running at the same time.
void install_kernels(DeviceType device, const Kernels& table);
// The CUDA table as built by this build (empty without CUDA): what install_kernels replaced.
Kernels builtin_cuda_kernels();

// A table from a struct of static functions named like the kernels (backend/cuda/kernel_wrappers.h);
// a member that is nullptr (std::nullptr_t) leaves its entry empty.
template <class Wrappers>
Kernels kernels_from(DeviceType device) {
  Kernels k;
#define BP_KERNEL(op, name)                 \
  k.name = {Wrappers::name, #name, device}; \
  k.count += k.name.fn != nullptr ? 1 : 0;
#include "ops/kernels.inc"
#undef BP_KERNEL
  return k;
}
// The table for `t`'s device; refuses (cuda_op_unavailable(op)) a device whose table is empty.
const Kernels& require_backend(const char* op, const Tensor& t);
inline const Kernels& kernels(const Tensor& t) {
  return kernels(t.device().type);
}

// A 2-D weight as the held-matrix view the kernels of backend/cpu/quant_gemm.h read (any float
// or block dtype; rows must be whole blocks).
inline cpu::HeldMatrix held_matrix(const Tensor& W) {
  return {W.kernel_raw(), W.dtype(), W.dim(0), W.dim(1)};
}

}  // namespace bp::ops
