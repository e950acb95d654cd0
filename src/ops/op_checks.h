// Shared argument checks for op front-ends (src/ops/*.cpp). Each throws bp::Error with the op's
// "[name]" prefix and the real shapes/dtypes, so a user sees what was given and what was expected.
// Shape and dtype mismatches between an op's arguments are RUNTIME_INTERNAL: the model layer
// validates user-provided weights and configs before any op runs, so a mismatch here is a bug
// between components. Data a user controls (token ids, positions, dropout) is checked in the
// op front-ends themselves with INPUT_VALIDATION_FAILED.
// Tensors of a device without kernels are refused by the dispatch (ops/dispatch.h: require_backend).
#pragma once

#include <initializer_list>
#include <vector>

#include "core/error.h"
#include "core/host_mirror.h"
#include "core/tensor.h"
#include "ops/dispatch.h"

namespace bp::ops {

// Throws RUNTIME_NOT_BUILT_WITH_CUDA (via the dispatch, ops/dispatch.h) when t's device has no kernels.
inline void require_cpu(const char* op, const Tensor& t) {
  require_backend(op, t);
}

// t must be defined, on the CPU, of dtype `dtype` and rank `rank`.
inline void require_tensor(const char* op, const char* name, const Tensor& t, DType dtype, int rank) {
  if (!t.defined()) throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[{}] {} is an undefined tensor", op, name));
  require_cpu(op, t);
  if (t.dtype() != dtype)
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[{}] {} must be {} but is {}", op, name, dtype_name(dtype), t.describe()));
  if (t.rank() != rank)
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[{}] {} must have rank {} but has shape {}", op, name, rank, t.shape().str()));
}

// t must have exactly `shape` (after require_tensor-style dtype check).
inline void require_shape(const char* op, const char* name, const Tensor& t, const Shape& shape,
                          DType dtype = DType::F32) {
  require_tensor(op, name, t, dtype, shape.rank);
  if (!(t.shape() == shape))
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[{}] {} has shape {} but {} is expected", op, name, t.shape().str(), shape.str()));
}

// All the (defined) tensors of one op live on one device: a kernel reads every pointer it gets in
// its own device's memory, so a CPU tensor given to a CUDA op (or the reverse) is refused here.
inline void require_same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t || !t->defined()) continue;
    if (!first) first = t;
    if (!(t->device() == first->device()))
      throw Error(ErrorCode::RUNTIME_INTERNAL,
                  fmt::format("[{}] tensors on different devices: {} and {}", op, first->describe(), t->describe()));
  }
}

// An op's optional bf16 output (its f32 output also rounded to nearest even, for the bf16 GEMMs
// that read it: ops/rms_norm.h, swiglu.h): null when not asked for; allocated with `shape` on
// `device` when undefined, else it must be a bf16 tensor of `shape` there.
inline uint16_t* bf16_output(const char* op, const char* name, Tensor* t, const Shape& shape, Device device) {
  if (!t) return nullptr;
  if (!t->defined()) *t = Tensor::empty(shape, DType::BF16, device);
  require_shape(op, name, *t, shape, DType::BF16);
  if (!(t->device() == device))
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[{}] {} is {}, on another device than the op's tensors", op, name, t->describe()));
  return t->kernel_data<uint16_t>();
}

// An op's optional bf16 input: `of` rounded to nearest-even bf16 by its producer (ops/linear.h
// x_bf16, dy_bf16), of `of`'s shape and device; null when not given.
inline const uint16_t* bf16_input(const char* op, const char* name, const Tensor* t, const Tensor& of) {
  if (!t) return nullptr;
  require_shape(op, name, *t, of.shape(), DType::BF16);
  require_same_device(op, {t, &of});
  return t->kernel_data<uint16_t>();
}

// The i32 values of `t` readable by host code (argument checks of token ids, labels, positions):
// t's own memory on the CPU; for a device tensor the host copy it was uploaded from when the
// uploader keeps one (core/host_mirror.h: the model's batch, so a training step's checks never
// wait for the card), else a copy into `staging` through the device's explicit copy.
inline const int32_t* host_ints(const Tensor& t, std::vector<int32_t>& staging) {
  if (t.device().type == DeviceType::CPU) return t.data<int32_t>();
  if (const void* mirrored = host_mirror(t.kernel_raw(), t.nbytes())) return static_cast<const int32_t*>(mirrored);
  staging.resize(static_cast<size_t>(t.numel()));
  device_copy(t.device().type, staging.data(), t.kernel_data<int32_t>(), t.nbytes(), CopyKind::DeviceToHost);
  return staging.data();
}

}  // namespace bp::ops
