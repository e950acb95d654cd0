// Thin singular value decomposition of a row-major f64 matrix through LAPACK's dgesdd (the
// OpenBLAS build the project links carries LAPACK). Host only: PiSSA's initialisation (ops/svd.h).
#pragma once

#include <cstdint>

namespace bp::cpu {

// a [m, n] row-major (overwritten) = u [m, k] · diag(s [k]) · vt [k, n], k = min(m, n), s
// descending. Returns LAPACK's info: 0 on success, > 0 when the iteration did not converge, < 0 for
// a bad argument.
int svd_f64(double* a, int64_t m, int64_t n, double* u, double* s, double* vt);

}  // namespace bp::cpu
