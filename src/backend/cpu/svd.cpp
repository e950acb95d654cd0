// dgesdd on a row-major matrix (contract: svd.h). LAPACK is column-major: the row-major a [m, n] is
// the column-major aᵀ [n, m] = U_x·S·V_xᵀ, so a = V_x·S·U_xᵀ. dgesdd's VT_x (k × m, column-major)
// read row-major is V_x [m, k], a's left vectors; its U_x (n × k, column-major) read row-major is
// U_xᵀ [k, n], a's right vectors transposed. No copies, no transposes.
#include "backend/cpu/svd.h"

#include <algorithm>
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

}  // namespace bp::cpu
