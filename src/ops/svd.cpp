// Thin SVD front-end (contract: ops/svd.h): checks, widening to f64, LAPACK through backend/cpu/svd.h.
#include "ops/svd.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/svd.h"
#include "core/error.h"

namespace bp {

namespace {

// W widened to f64 on the host, row-major, with its sizes in `r` (m, n, k = min(m, n)).
std::vector<double> host_f64(const Tensor& W, Svd& r) {
  BP_CHECK(W.rank() == 2, "[svd] needs a matrix, got {}", W.describe());
  Tensor host = W.device().type == DeviceType::CPU ? W : W.to(Device{});
  if (host.dtype() != DType::F32) host = host.to(DType::F32);
  r.m = host.dim(0);
  r.n = host.dim(1);
  r.k = std::min(r.m, r.n);
  if (r.m * r.n > std::numeric_limits<int>::max() || r.k < 1)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[svd] {} is empty or too large for LAPACK", W.describe()));
  std::vector<double> a(static_cast<size_t>(r.m * r.n));
  const float* w = host.data<float>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(w[i]))
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[svd] {} holds a non-finite value at element {}", W.describe(), i));
    a[i] = w[i];
  }
  return a;
}

void check_info(int info, const Tensor& W) {
  if (info > 0)
    throw Error(ErrorCode::RUNTIME_TRAINING_FAILED,
                fmt::format("[svd] LAPACK's dgesdd did not converge on {} (info {})", W.describe(), info));
  if (info < 0) throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[svd] dgesdd argument {} is invalid", -info));
}

}  // namespace

Svd svd(const Tensor& W) {
  Svd r;
  std::vector<double> a = host_f64(W, r);
  r.U.resize(static_cast<size_t>(r.m * r.k));
  r.S.resize(static_cast<size_t>(r.k));
  r.Vt.resize(static_cast<size_t>(r.k * r.n));
  check_info(cpu::svd_f64(a.data(), r.m, r.n, r.U.data(), r.S.data(), r.Vt.data()), W);
  return r;
}

Svd svd_lowrank(const Tensor& W, int64_t q, int niter, uint64_t seed) {
  Svd r;
  const std::vector<double> a = host_f64(W, r);
  if (q < 1 || q > r.k || niter < 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[svd] a rank-{} randomized SVD with {} power iterations of {}: the rank must be in "
                            "[1, {}] and the iterations >= 0",
                            q, niter, W.describe(), r.k));
  r.k = q;
  r.U.resize(static_cast<size_t>(r.m * q));
  r.S.resize(static_cast<size_t>(q));
  r.Vt.resize(static_cast<size_t>(q * r.n));
  check_info(cpu::svd_lowrank_f64(a.data(), r.m, r.n, q, niter, seed, r.U.data(), r.S.data(), r.Vt.data()), W);
  return r;
}

}  // namespace bp
