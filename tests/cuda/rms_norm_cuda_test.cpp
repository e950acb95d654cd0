// CUDA RMSNorm (src/backend/cuda/rms_norm.cuh) on the CPU simulation against the CPU backend, f32
// and bf16 activations, forward and backward, random inputs at odd sizes.
#include "backend/cpu/rms_norm.h"
#include "backend/cuda/rms_norm.cuh"
#include "sim_test_util.h"

namespace bp::sim {
namespace {

template <class T>
void check_rms_norm(int64_t N, int64_t D) {
  const std::string at = "N=" + std::to_string(N) + " D=" + std::to_string(D);
  const auto x = test::back(test::as<T>(test::random_floats(N * D, 1 + N, -2, 2)));  // values T can hold
  const auto w = test::random_floats(D, 2 + D, 0.5f, 1.5f);
  const auto dy = test::back(test::as<T>(test::random_floats(N * D, 3 + N)));
  const float eps = 1e-5f;
  std::vector<float> y_ref(N * D), rstd_ref(N), dx_ref(N * D), dw_ref(D, 0.25f);
  cpu::rms_norm_forward(x.data(), w.data(), eps, y_ref.data(), nullptr, rstd_ref.data(), N, D);
  cpu::rms_norm_backward(dy.data(), x.data(), w.data(), rstd_ref.data(), dx_ref.data(), nullptr, dw_ref.data(), N, D,
                         false);

  auto xd = test::as<T>(x), dyd = test::as<T>(dy);
  std::vector<T> y(N * D), dx(N * D);
  std::vector<float> rstd(N, -1.0f), dw(D, 0.25f);  // dw accumulates (+=)
  std::vector<bf16> y16(N * D);                     // y's bf16 copy, the projections' GEMM operand
  rms_norm_forward<T>(xd.data(), w.data(), eps, y.data(), y16.data(), rstd.data(), N, D);
  // Without a copy asked for, the same y.
  std::vector<T> y_alone(N * D);
  rms_norm_forward<T>(xd.data(), w.data(), eps, y_alone.data(), nullptr, nullptr, N, D);
  rms_norm_backward<T>(dyd.data(), xd.data(), w.data(), rstd.data(), dx.data(), nullptr, dw.data(), N, D, false);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  // Accumulated (dx += ...): onto a residual gradient the T storage holds.
  const auto prior = test::back(test::as<T>(test::random_floats(N * D, 4 + N)));
  auto dx_acc = test::as<T>(prior);
  std::vector<float> acc_ref = prior;
  cpu::rms_norm_backward(dy.data(), x.data(), w.data(), rstd_ref.data(), acc_ref.data(), nullptr, nullptr, N, D, true);
  std::vector<bf16> dx16(N * D);  // the accumulated dx's bf16 copy (the dy of the GEMMs that read it)
  rms_norm_backward<T>(dyd.data(), xd.data(), w.data(), rstd.data(), dx_acc.data(), dx16.data(), nullptr, N, D, true);
  constexpr auto tol = test::tolerance_of<T>();
  test::expect_close(test::back(y), y_ref, tol, "y " + at);
  test::expect_bf16_copy(y16, test::back(y), "y bf16 copy " + at);
  EXPECT_EQ(test::back(y_alone), test::back(y)) << at;
  test::expect_close(rstd, rstd_ref, test::kF32Tol, "rstd " + at);
  test::expect_close(test::back(dx), dx_ref, tol, "dx " + at);
  test::expect_close(dw, dw_ref, {1e-4 * N, 1e-5}, "dw " + at);  // f32 sums of N products
  test::expect_close(test::back(dx_acc), acc_ref, tol, "dx accumulated " + at);
  test::expect_bf16_copy(dx16, test::back(dx_acc), "accumulated dx bf16 copy " + at);
}

TEST(CudaRmsNorm, MatchesCpuF32AtOddSizes) {
  for (auto [N, D] : {std::pair<int64_t, int64_t>{1, 1}, {3, 31}, {5, 33}, {2, 257}, {7, 1000}, {333, 70}})
    check_rms_norm<float>(N, D);  // 333 rows: dw's rows split over the thread rows of column_sum.cuh
}
TEST(CudaRmsNorm, MatchesCpuBf16AtOddSizes) {
  for (auto [N, D] : {std::pair<int64_t, int64_t>{1, 1}, {3, 31}, {5, 33}, {2, 257}, {100, 45}})
    check_rms_norm<bf16>(N, D);
}

}  // namespace
}  // namespace bp::sim
