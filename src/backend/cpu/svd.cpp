// dgesdd on a row-major matrix (contract: svd.h). LAPACK is column-major: the row-major a [m, n] is
// the column-major aᵀ [n, m] = U_x·S·V_xᵀ, so a = V_x·S·U_xᵀ. dgesdd's VT_x (k × m, column-major)
// read row-major is V_x [m, k], a's left vectors; its U_x (n × k, column-major) read row-major is
// U_xᵀ [k, n], a's right vectors transposed. No copies, no transposes.
#include "backend/cpu/svd.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

extern "C" void dgesdd_(const char* jobz, const int* m, const int* n, double* a, const int* lda, double* s, double* u,
                        const int* ldu, double* vt, const int* ldvt, double* work, const int* lwork, int* iwork,
                        int* info);

namespace bp::cpu {

int svd_f64(double* a, int64_t m, int64_t n, double* u, double* s, double* vt) {
  // Column-major view: M = n rows, N = m columns.
  const int M = static_cast<int>(n), N = static_cast<int>(m), k = std::min(M, N);
  const int lda = M, ldu = M, ldvt = k;
  std::vector<int> iwork(static_cast<size_t>(8) * static_cast<size_t>(k));
  int info = 0, lwork = -1;
  double query = 0.0;
  // U_x (ldu × k) goes to vt, VT_x (k × N) to u: see the file comment.
  dgesdd_("S", &M, &N, a, &lda, s, vt, &ldu, u, &ldvt, &query, &lwork, iwork.data(), &info);
  if (info != 0) return info;
  lwork = static_cast<int>(query) + 1;
  std::vector<double> work(static_cast<size_t>(lwork));
  dgesdd_("S", &M, &N, a, &lda, s, vt, &ldu, u, &ldvt, work.data(), &lwork, iwork.data(), &info);
  return info;
}

namespace {

// C [M, N] = op(A)·op(B), row-major f64.
void dgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double* A, const double* B, double* C) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
              static_cast<blasint>(N), static_cast<blasint>(K), 1.0, A, static_cast<blasint>(ta ? M : K), B,
              static_cast<blasint>(tb ? K : N), 0.0, C, static_cast<blasint>(N));
}

// The columns of x [rows, q] (row-major) made orthonormal in place: classical Gram-Schmidt, each
// column projected out twice ("twice is enough"), a column whose norm vanishes set to zero.
void orthonormalize(double* x, int64_t rows, int64_t q) {
  std::vector<double> dots(static_cast<size_t>(q));
  for (int64_t j = 0; j < q; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t i = 0; i < j; ++i) {
        double d = 0;
        for (int64_t t = 0; t < rows; ++t) d += x[t * q + i] * x[t * q + j];
        dots[static_cast<size_t>(i)] = d;
      }
      for (int64_t t = 0; t < rows; ++t) {
        double v = x[t * q + j];
        for (int64_t i = 0; i < j; ++i) v -= dots[static_cast<size_t>(i)] * x[t * q + i];
        x[t * q + j] = v;
      }
    }
    double norm = 0;
    for (int64_t t = 0; t < rows; ++t) norm += x[t * q + j] * x[t * q + j];
    norm = std::sqrt(norm);
    const double inv = norm > 0 ? 1.0 / norm : 0.0;
    for (int64_t t = 0; t < rows; ++t) x[t * q + j] *= inv;
  }
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Standard normal draws (Box-Muller on a splitmix64 stream): portable, unlike std's distributions.
void fill_normal(std::vector<double>& v, uint64_t seed) {
  uint64_t state = seed;
  for (size_t i = 0; i < v.size(); i += 2) {
    const double u1 = (static_cast<double>(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)), th = 2.0 * M_PI * u2;
    v[i] = r * std::cos(th);
    if (i + 1 < v.size()) v[i + 1] = r * std::sin(th);
  }
}

}  // namespace

int svd_lowrank_f64(const double* a, int64_t m, int64_t n, int64_t q, int niter, uint64_t seed, double* u, double* s,
                    double* vt) {
  std::vector<double> R(static_cast<size_t>(n * q)), Q(static_cast<size_t>(m * q)), P(static_cast<size_t>(n * q));
  fill_normal(R, seed);
  dgemm(false, false, m, q, n, a, R.data(), Q.data());  // Q = orth(a·R)
  orthonormalize(Q.data(), m, q);
  for (int it = 0; it < niter; ++it) {
    dgemm(true, false, n, q, m, a, Q.data(), P.data());  // P = orth(aᵀ·Q)
    orthonormalize(P.data(), n, q);
    dgemm(false, false, m, q, n, a, P.data(), Q.data());  // Q = orth(a·P)
    orthonormalize(Q.data(), m, q);
  }
  std::vector<double> small(static_cast<size_t>(q * n)), ub(static_cast<size_t>(q * q));
  dgemm(true, false, q, n, m, Q.data(), a, small.data());  // Qᵀ·a [q, n]
  const int info = svd_f64(small.data(), q, n, ub.data(), s, vt);
  if (info != 0) return info;
  dgemm(false, false, m, q, q, Q.data(), ub.data(), u);  // u = Q·Ub
  return 0;
}

}  // namespace bp::cpu
