// Shared argument checks for op front-ends (src/ops/*.cpp). Each throws bp::Error with the op's
// "[name]" prefix and the real shapes/dtypes, so a user sees what was given and what was expected.
// Shape and dtype mismatches between an op's arguments are RUNTIME_INTERNAL: the model layer
// validates user-provided weights and configs before any op runs, so a mismatch here is a bug
// between components. Data a user controls (token ids, positions, dropout) is checked in the
// op front-ends themselves with INPUT_VALIDATION_FAILED.
// Tensors of a device without kernels are refused by the dispatch (ops/dispatch.h: require_backend).
#pragma once

#include "core/error.h"
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

}  // namespace bp::ops
