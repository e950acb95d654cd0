// The CUDA kernels on a REAL device against the CPU backend (the same checks the simulation runs
// in tests/cuda, here through nvcc's code): built in CUDA builds only. Without a usable device the
// tests skip, unless BP_REQUIRE_GPU=1 (scripts/gpu_check.sh sets it), where no device is a failure.
#include <gtest/gtest.h>

#ifdef BP_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/optim.h"
#include "backend/cpu/rms_norm.h"
#include "backend/cpu/swiglu.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/lora_dropout_split.h"
#include "core/quant_blocks.h"

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
  cpu::rms_norm_forward(x.data(), w.data(), 1e-5f, y_ref.data(), nullptr, r_ref.data(), N, D);
  cpu::rms_norm_backward(dy.data(), x.data(), w.data(), r_ref.data(), dx_ref.data(), nullptr, dw_ref.data(), N, D,
                         false);
  DeviceBuffer<float> xd{x}, wd{w}, dyd{dy}, y{std::vector<float>(N * D)}, r{std::vector<float>(N)},
      dx{std::vector<float>(N * D)}, dw{std::vector<float>(D, 0.0f)};
  cuda::rms_norm_forward<float>(xd.ptr, wd.ptr, 1e-5f, y.ptr, nullptr, r.ptr, N, D, nullptr);
  cuda::rms_norm_backward<float>(dyd.ptr, xd.ptr, wd.ptr, r.ptr, dx.ptr, nullptr, dw.ptr, N, D, false, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(y.to_host(), y_ref, 1e-5, "y");
  expect_close(dx.to_host(), dx_ref, 1e-5, "dx");
  expect_close(dw.to_host(), dw_ref, 1e-4, "dw");
}

// LoRA dropout (lora_dropout.cuh) at a projection's size: xa, dA and dx with the mask regenerated
// on the card against the CPU's materialized xd and sgemm; dA's tokens in 4 slices (partials in
// workspace, lora_dropout_split.h).
TEST(CudaDevice, LoraDropoutMatchesCpu) {
  BP_NEED_DEVICE();
  const int64_t T = 517, in = 896, r = 16;
  const float p = 0.05f;
  const uint64_t seed = 1234;
  const auto x = random_floats(T * in, 21), A = random_floats(r * in, 22), dxa = random_floats(T * r, 23);
  const auto dA0 = random_floats(r * in, 24), dx0 = random_floats(T * in, 25);
  std::vector<float> xa_ref(T * r), dA_ref = dA0, dx_ref = dx0, scratch(cpu::lora_dropout_scratch_floats(T, in, true));
  const cpu::LoraDropoutMember one{r, seed};
  cpu::lora_dropout_xa(x.data(), A.data(), p, &one, 1, scratch.data(), xa_ref.data(), T, in);
  cpu::lora_dropout_backward(dxa.data(), x.data(), A.data(), p, &one, 1, scratch.data(), dA_ref.data(), dx_ref.data(),
                             T, in);
  ASSERT_EQ(cuda_workspace::lora_dA_split(T, in, r).slices, 4);
  DeviceBuffer<float> xd{x}, Ad{A}, dxad{dxa}, xa{std::vector<float>(T * r)}, dA{dA0}, dx{dx0},
      partials{std::vector<float>(cuda_workspace::lora_dropout_dA_bytes(T, in, r) / sizeof(float))};
  cuda::lora_dropout_xa(xd.ptr, Ad.ptr, xa.ptr, T, in, &one, 1, p, nullptr);
  cuda::lora_dropout_dA_accumulate(dxad.ptr, xd.ptr, dA.ptr, T, in, &one, 1, p, partials.ptr, nullptr);
  cuda::lora_dropout_dx_accumulate(dxad.ptr, Ad.ptr, dx.ptr, T, in, &one, 1, p, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close(xa.to_host(), xa_ref, 1e-4, "xa");
  expect_close(dA.to_host(), dA_ref, 1e-4, "dA");
  expect_close(dx.to_host(), dx_ref, 1e-5, "dx");
}

TEST(CudaDevice, SwigluAndGlobalNormMatchCpu) {
  BP_NEED_DEVICE();
  const int64_t n = 300001;
  const auto g = random_floats(n, 4), u = random_floats(n, 5);
  std::vector<float> h_ref(n);
  cpu::swiglu_forward(g.data(), u.data(), h_ref.data(), nullptr, n);
  DeviceBuffer<float> gd{g}, ud{u}, h{std::vector<float>(n)};
  cuda::swiglu_forward<float>(gd.ptr, ud.ptr, h.ptr, nullptr, n, nullptr);
  expect_close(h.to_host(), h_ref, 1e-5, "swiglu");
  DeviceBuffer<unsigned char> scratch{std::vector<unsigned char>(64 * 1024)};
  EXPECT_NEAR(cuda::sum_squares<float>(gd.ptr, n, scratch.ptr, nullptr), cpu::sum_squares(g.data(), n), 1e-9 * n);
  EXPECT_TRUE(cuda::all_finite<float>(gd.ptr, n, scratch.ptr, nullptr));
}

// Attention at model sizes the simulation is too slow for (long samples, d = 64, 128 and 256, the
// last one past the default 48 KiB of shared memory), and bit-identical backward results when run
// twice (the kernels use no atomics); on the tensor-core kernels from compute capability 8.0 on.
void check_attention_on_device(const std::vector<int32_t>& lengths, int n_heads, int n_kv_heads, int head_dim) {
  std::vector<int32_t> cu{0};
  for (int32_t l : lengths) cu.push_back(cu.back() + l);
  const int64_t T = cu.back();
  const cpu::AttentionDims dims{T, static_cast<int64_t>(lengths.size()), n_heads, n_kv_heads, head_dim};
  const size_t nq = static_cast<size_t>(T) * n_heads * head_dim, nkv = static_cast<size_t>(T) * n_kv_heads * head_dim;
  const auto q = random_floats(nq, 11), k = random_floats(nkv, 12), v = random_floats(nkv, 13),
             dout = random_floats(nq, 14);
  std::vector<float> o_ref(nq), lse_ref(static_cast<size_t>(T) * n_heads), delta_ref(lse_ref.size()), dq_ref(nq),
      dk_ref(nkv), dv_ref(nkv);
  cpu::attention_forward(q.data(), k.data(), v.data(), cu.data(), dims, o_ref.data(), nullptr, lse_ref.data());
  cpu::attention_backward(dout.data(), q.data(), k.data(), v.data(), o_ref.data(), lse_ref.data(), cu.data(), dims,
                          delta_ref.data(), dq_ref.data(), dk_ref.data(), dv_ref.data(), nullptr);
  DeviceBuffer<float> qd{q}, kd{k}, vd{v}, doutd{dout}, o{std::vector<float>(nq)},
      lse{std::vector<float>(lse_ref.size())}, delta{std::vector<float>(lse_ref.size())}, dq{std::vector<float>(nq)},
      dk{std::vector<float>(nkv)}, dv{std::vector<float>(nkv)};
  DeviceBuffer<int32_t> cud{cu};
  cuda::attention_forward<float>(qd.ptr, kd.ptr, vd.ptr, cud.ptr, dims, o.ptr, nullptr, lse.ptr, nullptr);
  cuda::attention_backward<float>(doutd.ptr, qd.ptr, kd.ptr, vd.ptr, o.ptr, lse.ptr, cud.ptr, dims, delta.ptr, dq.ptr,
                                  dk.ptr, dv.ptr, nullptr, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "d=" << head_dim;
  // From compute capability 8.0 on these head dims take the tensor-core kernels (attention_tc.cuh),
  // whose products read bf16 inputs: bf16's tolerance (as tests/cuda/attention_cuda_test.cpp).
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  const bool tensor_cores = major >= 8 && head_dim % 16 == 0;
  const double tol_forward = tensor_cores ? 2e-2 : 1e-5, tol_backward = tensor_cores ? 2e-2 : 1e-4;
  expect_close(o.to_host(), o_ref, tol_forward, "attention o");
  expect_close(lse.to_host(), lse_ref, tol_forward, "attention lse");
  const auto dq1 = dq.to_host(), dk1 = dk.to_host(), dv1 = dv.to_host();
  expect_close(dq1, dq_ref, tol_backward, "attention dq");
  expect_close(dk1, dk_ref, tol_backward, "attention dk");
  expect_close(dv1, dv_ref, tol_backward, "attention dv");
  // Again with dv's bf16 copy (v_proj's dy): the same gradients, and the copy dv's rounding.
  DeviceBuffer<uint16_t> dv16{std::vector<uint16_t>(nkv)};
  cuda::attention_backward<float>(doutd.ptr, qd.ptr, kd.ptr, vd.ptr, o.ptr, lse.ptr, cud.ptr, dims, delta.ptr, dq.ptr,
                                  dk.ptr, dv.ptr, reinterpret_cast<cuda::bf16*>(dv16.ptr), nullptr);
  EXPECT_TRUE(dq.to_host() == dq1 && dk.to_host() == dk1 && dv.to_host() == dv1) << "backward not deterministic";
  const std::vector<uint16_t> got16 = dv16.to_host();
  size_t bad = 0;
  for (size_t i = 0; i < nkv; ++i) bad += got16[i] != f32_to_bf16(dv1[i]);
  EXPECT_EQ(bad, 0u) << "dv's bf16 copy, d=" << head_dim;
}

TEST(CudaDevice, AttentionMatchesCpu) {
  BP_NEED_DEVICE();
  check_attention_on_device({1, 7, 33, 300}, 6, 2, 64);
  check_attention_on_device({129, 2, 250}, 7, 1, 128);
  check_attention_on_device({70, 45}, 2, 1, 256);
}

// Held weights dequantized by nvcc's code (dequant.cuh): rows 3..9 of 13 of every held type, f32
// output bit for bit equal to core's reference dequantizers, bf16 and f16 output their rounding.
TEST(CudaDevice, DequantizeRowsMatchesCpuBitForBit) {
  BP_NEED_DEVICE();
  for (DType type : {DType::BF16, DType::F16, DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q5_1, DType::Q4_K,
                     DType::Q5_K, DType::Q6_K}) {
    SCOPED_TRACE(dtype_name(type));
    const int64_t rows = 13, cols = dtype_block_size(type) == 256 ? 512 : 96, row0 = 3, n = 7;
    std::vector<float> x = random_floats(static_cast<size_t>(rows * cols), 90);
    for (int64_t i = 0; i < cols; ++i) x[static_cast<size_t>(4 * cols + i)] *= 3e-4f;  // subnormal f16 scales
    std::vector<uint8_t> held(dtype_bytes(type, rows * cols));
    quantize_span(type, x.data(), held.data(), rows * cols);
    std::vector<float> ref(x.size());
    dequantize_span(type, held.data(), ref.data(), rows * cols);
    DeviceBuffer<uint8_t> src(held);
    DeviceBuffer<float> out(std::vector<float>(static_cast<size_t>(n * cols)));
    DeviceBuffer<uint16_t> out16(std::vector<uint16_t>(static_cast<size_t>(n * cols)));
    DeviceBuffer<uint16_t> out_f16(std::vector<uint16_t>(static_cast<size_t>(n * cols)));
    ASSERT_TRUE(cuda::dequantize_rows<float>(type, src.ptr, cols, row0, n, out.ptr, nullptr));
    ASSERT_TRUE(cuda::dequantize_rows<cuda::bf16>(type, src.ptr, cols, row0, n,
                                                  reinterpret_cast<cuda::bf16*>(out16.ptr), nullptr));
    ASSERT_TRUE(cuda::dequantize_rows<cuda::f16>(type, src.ptr, cols, row0, n,
                                                 reinterpret_cast<cuda::f16*>(out_f16.ptr), nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = out.to_host();
    const std::vector<uint16_t> got16 = out16.to_host(), got_f16 = out_f16.to_host();
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float r = ref[static_cast<size_t>(row0 * cols) + i];
      bad += f32_bits(got[i]) != f32_bits(r) || got16[i] != f32_to_bf16(r) || got_f16[i] != f32_to_f16(r);
    }
    EXPECT_EQ(bad, 0) << "of " << got.size() << " values";
  }
}

// The f16 activation operand of a Turing card's GEMMs by nvcc's code: activations up to 1.5e5
// scaled by 2^s (max|x| in [2^13, 2^14)) and rounded like core's f32_to_f16, bit for bit; then an
// f16 GEMM through cuBLASLt (CUDA_R_16F) with alpha = 2^-s gives the CPU's f32 product within the
// f16 bound (2⁻¹⁰ of Σ|x|·|w|). The scale is chosen on the device and the GEMM reads alpha there
// (device pointer mode), as the wrappers do.
TEST(CudaDevice, ScaledF16OperandAndF16GemmMatchCpu) {
  BP_NEED_DEVICE();
  const int64_t M = 37, N = 45, K = 72;
  std::vector<float> x = random_floats(static_cast<size_t>(M * K), 91),
                     w = random_floats(static_cast<size_t>(N * K), 92);
  for (float& v : x) v *= 1.5e5f;
  float abs_max = 0;
  for (float v : x) abs_max = std::max(abs_max, std::abs(v));
  const int s = cuda::f16_scale_exponent(abs_max);
  std::vector<uint16_t> w16(w.size());
  for (size_t i = 0; i < w.size(); ++i) w16[i] = f32_to_f16(w[i]);
  DeviceBuffer<float> xd(x), yd(std::vector<float>(static_cast<size_t>(M * N)));
  DeviceBuffer<uint16_t> xh(std::vector<uint16_t>(x.size())), wh(w16);
  DeviceBuffer<gemm::F16OperandScale> scale(std::vector<gemm::F16OperandScale>(1));
  cuda::convert_f32_to_f16_scaled(xd.ptr, reinterpret_cast<cuda::f16*>(xh.ptr), M * K, scale.ptr, nullptr);
  const gemm::F16OperandScale made = scale.to_host()[0];
  EXPECT_EQ(made.scale, std::ldexp(1.0f, s));
  EXPECT_EQ(made.alpha_beta_overwrite[0], std::ldexp(1.0f, -s));
  EXPECT_EQ(made.alpha_beta_overwrite[1], 0.0f);
  const std::vector<uint16_t> got = xh.to_host();
  int bad = 0;
  for (size_t i = 0; i < x.size(); ++i) bad += got[i] != f32_to_f16(std::ldexp(x[i], s));
  EXPECT_EQ(bad, 0);
  gemm::GemmDesc d = gemm::linear_forward_gemm(M, K, N, gemm::DType::F16, gemm::DType::F32);
  d.alpha = 0.0f;  // not used: the pair on the device is
  d.alpha_beta_on_device = gemm::f16_alpha_beta_on_device(scale.ptr, 0.0f);
  cuda::gemm(d, wh.ptr, xh.ptr, yd.ptr, nullptr, 0, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> y = yd.to_host();
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0, bound = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = x[static_cast<size_t>(i * K + k)], b = f16_to_f32(w16[static_cast<size_t>(j * K + k)]);
        ref += a * b;
        bound += std::abs(a * b);
      }
      ASSERT_LE(std::abs(y[static_cast<size_t>(i * N + j)] - ref), std::ldexp(bound, -10)) << i << "," << j;
    }
}

}  // namespace
}  // namespace bp
#else
TEST(CudaDevice, NotBuiltWithCuda) {
  GTEST_SKIP() << "this build has no CUDA backend";
}
#endif
