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

// The rank-q randomized SVD of W (backend/cpu/svd.h svd_lowrank_f64: torch.svd_lowrank's algorithm,
// PEFT's "pissa_niter_N"): k = q values and vectors, approximating the top q of svd(W) the closer
// the larger niter and the faster W's spectrum decays. Deterministic in `seed`. Errors as svd(), and
// INPUT_VALIDATION_FAILED for q outside [1, min(m, n)] or niter < 0.
Svd svd_lowrank(const Tensor& W, int64_t q, int niter, uint64_t seed);

}  // namespace bp
