#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/kernel_variants.h"

namespace bp::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
              static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C, static_cast<blasint>(ldc));
}

bool few_rows_path(int64_t M, int64_t N, int64_t K) {
  return M >= kFewRowsMin && M <= kFewRowsMax && N * K >= kFewRowsMinWeight;
}

void sgemm_weight_nt(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                     int64_t ldb, float beta, float* C, int64_t ldc) {
  if (!few_rows_path(M, N, K)) {
    sgemm(false, true, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const KernelTable& kt = cpu_kernels();
  // Each thread a range of B's rows in multiples of the kernel's 6-row tiles, at least 48 rows.
  const int64_t tiles = (N + 5) / 6;
  const int threads =
      omp_in_parallel() ? 1 : static_cast<int>(std::clamp<int64_t>(tiles / 8, 1, omp_get_max_threads()));
  const size_t scratch = static_cast<size_t>(few_rows_scratch_floats(M, K));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    // The transposed panels of A (a thread's own copy: M·K floats against its N/threads rows of B).
    thread_local std::vector<float> buf;
    if (buf.size() < scratch) buf.resize(scratch);
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t f0 = std::min(N, tiles * t / nt * 6), f1 = std::min(N, tiles * (t + 1) / nt * 6);
    kt.gemm_nt_few_rows(A, lda, M, K, B, ldb, f0, f1, alpha, beta, C, ldc, buf.data());
  }
}

}  // namespace bp::cpu
