// Thin SVD front-end (contract: ops/svd.h): checks, widening to f64, LAPACK through backend/cpu/svd.h.
#include "ops/svd.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/svd.h"
#include "core/error.h"

namespace bp {

Svd svd(const Tensor& W) {
  BP_CHECK(W.rank() == 2, "[svd] needs a matrix, got {}", W.describe());
  Tensor host = W.device().type == DeviceType::CPU ? W : W.to(Device{});
  if (host.dtype() != DType::F32) host = host.to(DType::F32);
  Svd r;
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
  r.U.resize(static_cast<size_t>(r.m * r.k));
  r.S.resize(static_cast<size_t>(r.k));
  r.Vt.resize(static_cast<size_t>(r.k * r.n));
  const int info = cpu::svd_f64(a.data(), r.m, r.n, r.U.data(), r.S.data(), r.Vt.data());
  if (info > 0)
    throw Error(ErrorCode::RUNTIME_TRAINING_FAILED,
                fmt::format("[svd] LAPACK's dgesdd did not converge on {} (info {})", W.describe(), info));
  if (info < 0) throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[svd] dgesdd argument {} is invalid", -info));
  return r;
}

}  // namespace bp
