// The CUDA kernels on a REAL device against the CPU backend (the same checks the simulation runs
// in tests/cuda, here through nvcc's code): built in CUDA builds only. Without a usable device the
// tests skip, unless BP_REQUIRE_GPU=1 (scripts/gpu_check.sh sets it), where no device is a failure.
#include <gtest/gtest.h>

#ifdef BP_HAVE_CUDA
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/optim.h"
#include "backend/cpu/rms_norm.h"
#include "backend/cpu/swiglu.h"
#include "backend/cuda/cuda_kernels.h"

namespace bp {
namespace {

bool device_usable() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return ok;
}

#define BP_NEED_DEVICE()                                                                   \
  do {                                                                                     \
    if (!device_usable()) {                                                                \
      const char* require = std::getenv("BP_REQUIRE_GPU");                                 \
      if (require && std::string(require) == "1") FAIL() << "BP_REQUIRE_GPU=1: no device"; \
      GTEST_SKIP() << "no usable CUDA device";                                             \
    }                                                                                      \
  } while (0)

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& e : v) e = d(rng);
  return v;
}

// Device copy of a host vector, freed at scope end.
template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(const std::vector<T>& host) : n(host.size()) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T)), cudaSuccess);
    cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> to_host() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
};

void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double tol, const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::abs(got[i] - ref[i]), tol * (1 + std::abs(ref[i]))) << what << " [" << i << "]";
}

TEST(CudaDevice, RmsNormMatchesCpu) {
  BP_NEED_DEVICE();
  const int64_t N = 7, D = 1000;
  const auto x = random_floats(N * D, 1), w = random_floats(D, 2), dy = random_floats(N * D, 3);
  std::vector<float> y_ref(N * D), r_ref(N), dx_ref(N * D), dw_ref(D, 0.0f);
  cpu::rms_norm_forward(x.data(), w.data(), 1e-5f, y_ref.data(), r_ref.data(), N, D);
  cpu::rms_norm_backward(dy.data(), x.data(), w.data(), r_ref.data(), dx_ref.data(), dw_ref.data(), N, D);
  DeviceBuffer<float> xd{x}, wd{w}, dyd{dy}, y{std::vector<float>(N * D)}, r{std::vector<float>(N)},
      dx{std::vector<float>(N * D)}, dw{std::vector<float>(D, 0.0f)};
  cuda::rms_norm_forward<float>(xd.ptr, wd.ptr, 1e-5f, y.ptr, r.ptr, N, D, nullptr);
  cuda::rms_norm_backward<float>(dyd.ptr, xd.ptr, wd.ptr, r.ptr, dx.ptr, dw.ptr, N, D, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(y.to_host(), y_ref, 1e-5, "y");
  expect_close(dx.to_host(), dx_ref, 1e-5, "dx");
  expect_close(dw.to_host(), dw_ref, 1e-4, "dw");
}

TEST(CudaDevice, SwigluAndGlobalNormMatchCpu) {
  BP_NEED_DEVICE();
  const int64_t n = 300001;
  const auto g = random_floats(n, 4), u = random_floats(n, 5);
  std::vector<float> h_ref(n);
  cpu::swiglu_forward(g.data(), u.data(), h_ref.data(), n);
  DeviceBuffer<float> gd{g}, ud{u}, h{std::vector<float>(n)};
  cuda::swiglu_forward<float>(gd.ptr, ud.ptr, h.ptr, n, nullptr);
  expect_close(h.to_host(), h_ref, 1e-5, "swiglu");
  DeviceBuffer<unsigned char> scratch{std::vector<unsigned char>(64 * 1024)};
  EXPECT_NEAR(cuda::sum_squares<float>(gd.ptr, n, scratch.ptr, nullptr), cpu::sum_squares(g.data(), n), 1e-9 * n);
  EXPECT_TRUE(cuda::all_finite<float>(gd.ptr, n, scratch.ptr, nullptr));
}

}  // namespace
}  // namespace bp
#else
TEST(CudaDevice, NotBuiltWithCuda) {
  GTEST_SKIP() << "this build has no CUDA backend";
}
#endif
