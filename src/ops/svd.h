// Thin SVD of a weight matrix on the host, in f64 (PiSSA's initialisation, model/lora.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace bp {

// W [m, n] (any dtype and device; read as f32, then f64) = U·diag(S)·Vᵀ with k = min(m, n) singular
// values, descending. U [m, k] and Vt [k, n] row-major.
struct Svd {
  int64_t m = 0, n = 0, k = 0;
  std::vector<double> U, S, Vt;
};
// Errors: INPUT_VALIDATION_FAILED for a non-finite W or one past LAPACK's int sizes;
// RUNTIME_TRAINING_FAILED when LAPACK's iteration does not converge.
Svd svd(const Tensor& W);

}  // namespace bp
