// The simulation's tensor-core fragments (src/backend/cuda/sim/sim_wmma.h): a wmma GEMM kernel in
// every layout (A and B row- or column-major with padded leading dimensions, C loaded and stored
// row- or column-major) against a plain f64 GEMM of the same bf16/f16 inputs; element-wise work on
// x[]; and the misuses a GPU punishes (hang, garbage or a fault) reported as errors: a call made by
// only some lanes of a warp, lanes meeting with different pointers, a partial warp, a misaligned
// pointer, lane-dependent fragment contents.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_wmma.cuh"

namespace bp::sim {
namespace {

namespace wmma = nvcuda::wmma;

// C[M×N] (ldc; layout c_layout) = alpha·(A·B) (+ C when accumulate), M, N, K multiples of 16. A is
// [M×K] stored row-major (A[m·lda + k]) or column-major (A[k·lda + m]); B is [K×N] row-major
// (B[k·ldb + n]) or column-major (B[n·ldb + k]). Warp w of the block computes output tiles w, w +
// warps, ...; A and B are staged in dynamic shared memory first (32-byte aligned tiles, as the
// attention kernels keep them), C is read and written in place.
template <class T, class LayoutA, class LayoutB>
__global__ void wmma_gemm_kernel(const T* A, int lda, const T* B, int ldb, float* C, int ldc, int M, int N, int K,
                                 bool c_row_major, bool accumulate, float alpha) {
  BP_DYNAMIC_SHARED(T, smem);
  constexpr bool a_rows = std::is_same_v<LayoutA, wmma::row_major>, b_rows = std::is_same_v<LayoutB, wmma::row_major>;
  const int a_size = (a_rows ? M : K) * lda, b_size = (b_rows ? K : N) * ldb;
  T* As = smem;
  T* Bs = smem + (a_size + 15) / 16 * 16;
  for (int i = threadIdx.x; i < a_size; i += blockDim.x) As[i] = A[i];
  for (int i = threadIdx.x; i < b_size; i += blockDim.x) Bs[i] = B[i];
  __syncthreads();
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32, tiles_n = N / 16;
  const wmma::layout_t c_layout = c_row_major ? wmma::mem_row_major : wmma::mem_col_major;
  for (int t = warp; t < M / 16 * tiles_n; t += warps) {
    const int m0 = t / tiles_n * 16, n0 = t % tiles_n * 16;
    float* c_tile = C + (c_row_major ? m0 * ldc + n0 : n0 * ldc + m0);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k0 = 0; k0 < K; k0 += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> b;
      wmma::load_matrix_sync(a, As + (a_rows ? m0 * lda + k0 : k0 * lda + m0), lda);
      wmma::load_matrix_sync(b, Bs + (b_rows ? k0 * ldb + n0 : n0 * ldb + k0), ldb);
      wmma::mma_sync(acc, a, b, acc);
    }
    for (int i = 0; i < acc.num_elements; ++i) acc.x[i] *= alpha;  // uniform element-wise work
    if (accumulate) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> old;
      wmma::load_matrix_sync(old, c_tile, ldc, c_layout);
      for (int i = 0; i < acc.num_elements; ++i) acc.x[i] += old.x[i];
    }
    wmma::store_matrix_sync(c_tile, acc, ldc, c_layout);
  }
}

// The first 32-byte aligned element of v (which holds 32 bytes more than the caller uses).
template <class T>
T* aligned32(std::vector<T>& v) {
  T* p = v.data();
  while (reinterpret_cast<uintptr_t>(p) % 32 != 0) ++p;
  return p;
}

// 16-bit storage T of random values in ±1 and their exact f32 values.
template <class T>
std::vector<T> random_16bit(size_t n, uint32_t seed, std::vector<float>& exact) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<T> out(n);
  exact.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, bf16>) {
      out[i] = __float2bfloat16(d(rng));
      exact[i] = __bfloat162float(out[i]);
    } else {
      out[i] = __float2half(d(rng));
      exact[i] = __half2float(out[i]);
    }
  }
  return out;
}

template <class T, class LayoutA, class LayoutB>
void check_gemm(int M, int N, int K, int pad, bool c_row_major, bool accumulate) {
  constexpr bool a_rows = std::is_same_v<LayoutA, wmma::row_major>, b_rows = std::is_same_v<LayoutB, wmma::row_major>;
  const int lda = (a_rows ? K : M) + pad, ldb = (b_rows ? N : K) + pad, ldc = (c_row_major ? N : M) + 4;
  std::vector<float> a_exact, b_exact, c_init;
  const auto A = random_16bit<T>(size_t((a_rows ? M : K) * lda), 1, a_exact);
  const auto B = random_16bit<T>(size_t((b_rows ? K : N) * ldb), 2, b_exact);
  random_16bit<T>(size_t((c_row_major ? M : N) * ldc), 3, c_init);
  std::vector<float> C_storage(c_init.size() + 8);
  float* C = aligned32(C_storage);
  std::copy(c_init.begin(), c_init.end(), C);
  const float alpha = 0.5f;
  const size_t shared = (A.size() + 16 + B.size()) * sizeof(T);
  BP_LAUNCH(1, 96, shared, nullptr, wmma_gemm_kernel<T, LayoutA, LayoutB>)
  (A.data(), lda, B.data(), ldb, C, ldc, M, N, K, c_row_major, accumulate, alpha);
  const std::string at = "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                         (a_rows ? " A row" : " A col") + (b_rows ? " B row" : " B col") +
                         (c_row_major ? " C row" : " C col") + (accumulate ? " +=" : "");
  int bad = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0;
      for (int k = 0; k < K; ++k)
        ref += double(a_exact[a_rows ? m * lda + k : k * lda + m]) * b_exact[b_rows ? k * ldb + n : n * ldb + k];
      const size_t ci = c_row_major ? size_t(m * ldc + n) : size_t(n * ldc + m);
      ref = alpha * ref + (accumulate ? c_init[ci] : 0.0);
      if (!(std::abs(C[ci] - ref) <= 1e-5 + 1e-5 * std::abs(ref)) && ++bad <= 3)
        ADD_FAILURE() << at << " (" << m << "," << n << "): got " << C[ci] << ", reference " << ref;
    }
  EXPECT_EQ(bad, 0) << at;
  // Padding columns of C were not written.
  const int c_cols = c_row_major ? N : M;
  for (int row = 0; row < (c_row_major ? M : N); ++row)
    for (int col = c_cols; col < ldc; ++col) EXPECT_EQ(C[row * ldc + col], c_init[row * ldc + col]) << at;
}

TEST(SimWmma, GemmInEveryLayoutMatchesAPlainGemm) {
  const uint64_t before = wmma_mma_count();
  check_gemm<bf16, wmma::row_major, wmma::row_major>(32, 48, 32, 8, true, false);
  check_gemm<bf16, wmma::row_major, wmma::col_major>(48, 16, 64, 8, true, true);
  check_gemm<bf16, wmma::col_major, wmma::row_major>(16, 32, 48, 16, false, false);
  check_gemm<bf16, wmma::col_major, wmma::col_major>(32, 32, 16, 0, false, true);
  check_gemm<f16, wmma::row_major, wmma::col_major>(16, 48, 32, 8, true, true);
  // One mma per warp (not per lane) and per 16×16×16 step.
  const uint64_t expected = 2 * 3 * 2 + 3 * 1 * 4 + 1 * 2 * 3 + 2 * 2 * 1 + 1 * 3 * 2;
  EXPECT_EQ(wmma_mma_count() - before, expected);
}

// The misuses: each kernel below is wrong on a GPU; the simulation must say so.
__global__ void some_lanes_load_kernel(const bf16* p, unsigned lanes) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
  if (threadIdx.x < lanes) wmma::load_matrix_sync(a, p, 16);  // lanes < 32: the others never arrive
}
__global__ void split_warp_load_kernel(const bf16* p) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
  wmma::load_matrix_sync(a, threadIdx.x < 16 ? p : p + 256, 16);  // two tiles, one call each half
}
__global__ void fill_kernel(const bf16*) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::fill_fragment(c, 1.0f);
}
__global__ void lane_dependent_fragment_kernel(const bf16* p) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
  wmma::load_matrix_sync(a, p, 16);
  wmma::load_matrix_sync(b, p, 16);
  wmma::fill_fragment(c, 0.0f);
  a.x[0] = __float2bfloat16(static_cast<float>(threadIdx.x));  // which (row, col) x[0] is: unspecified
  wmma::mma_sync(c, a, b, c);
}

std::string error_of(const std::function<void()>& launch) {
  try {
    launch();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(SimWmma, MisusesAreReported) {
  std::vector<float> exact;
  auto data = random_16bit<bf16>(1024, 4, exact);
  bf16* aligned = aligned32(data);  // 1024 elements leave room for two tiles

  EXPECT_NE(error_of([&] {
              BP_LAUNCH(1, 64, 0, nullptr, some_lanes_load_kernel)
              (aligned, 16u);
            }).find("deadlocks"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              BP_LAUNCH(1, 32, 0, nullptr, split_warp_load_kernel)
              (aligned);
            }).find("another call"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              BP_LAUNCH(1, 48, 0, nullptr, fill_kernel)
              (aligned);
            }).find("needs all 32"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              BP_LAUNCH(1, 32, 0, nullptr, some_lanes_load_kernel)
              (aligned + 1, 32u);
            }).find("aligned"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              BP_LAUNCH(1, 32, 0, nullptr, lane_dependent_fragment_kernel)(aligned);
            }).find("other fragment values"),
            std::string::npos);
  // The same kernels used correctly run (the checks above are not always on).
  EXPECT_EQ(error_of([&] { BP_LAUNCH(1, 64, 0, nullptr, some_lanes_load_kernel)(aligned, 64u); }), "(no error)");
  EXPECT_EQ(error_of([&] { BP_LAUNCH(1, 64, 0, nullptr, fill_kernel)(aligned); }), "(no error)");
}

}  // namespace
}  // namespace bp::sim
