// Thin singular value decomposition of a row-major f64 matrix through LAPACK's dgesdd (the
// OpenBLAS build the project links carries LAPACK). Host only: PiSSA's initialisation (ops/svd.h).
#pragma once

#include <cstdint>

namespace bp::cpu {

// a [m, n] row-major (overwritten) = u [m, k] · diag(s [k]) · vt [k, n], k = min(m, n), s
// descending. Returns LAPACK's info: 0 on success, > 0 when the iteration did not converge, < 0 for
// a bad argument.
int svd_f64(double* a, int64_t m, int64_t n, double* u, double* s, double* vt);

// Randomized rank-q SVD (Halko, Martinsson & Tropp 2011, as torch.svd_lowrank, which PEFT's
// init_lora_weights "pissa_niter_N" calls with q = r): a Gaussian test matrix R [n, q] (seeded
// normal draws), Q = orth(a·R), then `niter` power iterations Q = orth(a·orth(aᵀ·Q)), and the thin SVD
// of the small Qᵀ·a [q, n] = Ub·S·Vt gives u = Q·Ub [m, q], s [q], vt [q, n]. a [m, n] row-major is read,
// not written. orth: Gram-Schmidt twice over (f64; a column that vanishes stays zero). Products
// by dgemm; deterministic in `seed` on a given machine and BLAS. Returns svd_f64's info.
int svd_lowrank_f64(const double* a, int64_t m, int64_t n, int64_t q, int niter, uint64_t seed, double* u, double* s,
                    double* vt);

}  // namespace bp::cpu
