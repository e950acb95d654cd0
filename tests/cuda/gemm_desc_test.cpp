// The GEMM descriptions the CUDA backend hands to cuBLASLt (src/backend/cuda/gemm_desc.h),
// executed by the plain column-major reference, against the CPU backend's row-major sgemm for
// the shapes of the model (a small Qwen2-like layer at odd sizes): q/k/v/o, gate/up/down, the LM
// head chunk, each forward and both backward GEMMs; bf16 inputs too; a strided batch; and the
// refusal of an invalid description.
#include "backend/cuda/gemm_desc.h"

#include "backend/cpu/gemm.h"
#include "backend/cuda/device_workspace.h"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/sim/gemm_reference.h"
#include "backend/cuda/sim/gemm_sim.h"
#include "core/error.h"
#include "sim_test_util.h"

namespace bp::sim {
namespace {

struct LinearShape {
  const char* name;
  int64_t in, out;
};

// D = 72 hidden, 3 query heads of 24 with 1 KV head (GQA), FFN 136, vocab chunk 101; T = 33.
constexpr LinearShape kShapes[] = {{"q_proj", 72, 72},     {"k_proj", 72, 24},        {"v_proj", 72, 24},
                                   {"o_proj", 72, 72},     {"gate_proj", 72, 136},    {"up_proj", 72, 136},
                                   {"down_proj", 136, 72}, {"lm_head_chunk", 72, 101}};
constexpr int64_t kTokens = 33;

void check_linear_gemms(const LinearShape& s, bool bf16_inputs) {
  const std::string at = std::string(s.name) + (bf16_inputs ? " bf16" : " f32");
  auto round = [&](std::vector<float> v) { return bf16_inputs ? test::round_bf16(v) : v; };
  const auto x = round(test::random_floats(kTokens * s.in, 70 + s.in));
  const auto W = round(test::random_floats(s.out * s.in, 71 + s.out));
  const auto dy = round(test::random_floats(kTokens * s.out, 72 + s.out));
  const auto dW0 = test::random_floats(s.out * s.in, 73);  // dW accumulates
  const auto in_type = bf16_inputs ? gemm::DType::BF16 : gemm::DType::F32;
  auto stored = [&](const std::vector<float>& v) -> std::vector<uint16_t> {
    std::vector<uint16_t> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = __float2bfloat16(v[i]).bits;
    return r;
  };
  auto xs = stored(x), Ws = stored(W), dys = stored(dy);
  auto ptr = [&](const std::vector<float>& f, const std::vector<uint16_t>& h) -> const void* {
    return bf16_inputs ? static_cast<const void*>(h.data()) : static_cast<const void*>(f.data());
  };
  const test::Tolerance tol{1e-5, 1e-5};  // same products, f32 sums in another order

  std::vector<float> y_ref(kTokens * s.out), y(kTokens * s.out, NAN);
  cpu::sgemm(false, true, kTokens, s.out, s.in, 1.0f, x.data(), s.in, W.data(), s.in, 0.0f, y_ref.data(), s.out);
  gemm::gemm_reference(gemm::linear_forward_gemm(kTokens, s.in, s.out, in_type, gemm::DType::F32), ptr(W, Ws),
                       ptr(x, xs), y.data());
  test::expect_close(y, y_ref, tol, at + " forward");

  std::vector<float> dx_ref(kTokens * s.in), dx(kTokens * s.in, NAN);
  cpu::sgemm(false, false, kTokens, s.in, s.out, 1.0f, dy.data(), s.out, W.data(), s.in, 0.0f, dx_ref.data(), s.in);
  gemm::gemm_reference(gemm::linear_dx_gemm(kTokens, s.in, s.out, in_type, gemm::DType::F32), ptr(W, Ws), ptr(dy, dys),
                       dx.data());
  test::expect_close(dx, dx_ref, tol, at + " dx");

  auto dW_ref = dW0, dW = dW0;
  cpu::sgemm(true, false, s.out, s.in, kTokens, 1.0f, dy.data(), s.out, x.data(), s.in, 1.0f, dW_ref.data(), s.in);
  gemm::gemm_reference(gemm::linear_dW_gemm(kTokens, s.in, s.out, in_type), ptr(x, xs), ptr(dy, dys), dW.data());
  test::expect_close(dW, dW_ref, tol, at + " dW");
}

TEST(GemmDesc, ModelShapesMatchCpuSgemmForwardAndBackward) {
  for (const auto& s : kShapes) {
    check_linear_gemms(s, false);
    check_linear_gemms(s, true);
    for (auto d : {gemm::linear_forward_gemm(kTokens, s.in, s.out, gemm::DType::BF16, gemm::DType::F32),
                   gemm::linear_dx_gemm(kTokens, s.in, s.out, gemm::DType::BF16, gemm::DType::BF16),
                   gemm::linear_dW_gemm(kTokens, s.in, s.out, gemm::DType::BF16)})
      EXPECT_EQ(gemm::invalid_reason(d), "") << s.name;
  }
}

// A strided batch (attention's per-head scores have this form): each item is its own GEMM.
TEST(GemmDesc, StridedBatchRunsEachItemAtItsOffset) {
  const int64_t M = 5, N = 7, K = 3, batch = 4;
  const auto X = test::random_floats(batch * M * K, 80), Wt = test::random_floats(batch * N * K, 81);
  auto d = gemm::row_major_gemm(false, true, M, N, K, 0.5f, K, K, 0.0f, N);
  d.batch = batch;
  d.stride_a = N * K;
  d.stride_b = M * K;
  d.stride_c = M * N;
  std::vector<float> y(batch * M * N, NAN), y_ref(batch * M * N);
  gemm::gemm_reference(d, Wt.data(), X.data(), y.data());
  for (int64_t b = 0; b < batch; ++b)
    cpu::sgemm(false, true, M, N, K, 0.5f, X.data() + b * M * K, K, Wt.data() + b * N * K, K, 0.0f,
               y_ref.data() + b * M * N, N);
  test::expect_close(y, y_ref, test::kF32Tol, "batched");
}

// cuBLASLt's MIN_ALIGNMENT preferences: the largest power of two dividing the address, capped at
// 256 (a null pointer, a 512-aligned one: 256).
TEST(GemmDesc, PointerAlignmentIsTheLargestPowerOfTwoDividingTheAddressUpTo256) {
  auto at = [](uintptr_t a) { return gemm::pointer_alignment(reinterpret_cast<const void*>(a)); };
  EXPECT_EQ(at(0), 256u);
  EXPECT_EQ(at(0x1000), 256u);
  EXPECT_EQ(at(0x1100), 256u);
  EXPECT_EQ(at(0x1080), 128u);
  EXPECT_EQ(at(0x1004), 4u);
  EXPECT_EQ(at(0x1008), 8u);
  EXPECT_EQ(at(0x1002), 2u);
  EXPECT_EQ(at(0x1001), 1u);
}

// The held-weight panel GEMMs (kernel_wrappers.h, cross_entropy.cuh) write `C + n0` and read
// `X + n0`: 4 or 8 bytes past a 256-aligned allocation. The simulated GEMM computes the
// preferences cublaslt_gemm.cpp hands cuBLASLt and must report the real alignment, not 256.
TEST(GemmDesc, PanelPointersReportTheirRealAlignment) {
  const int64_t M = 3, N = 37, K = 5, n0 = 9, nb = 7;  // panel n0..n0+nb of Y[M x N] = X·Wᵀ
  void *x_mem = nullptr, *w_mem = nullptr, *y_mem = nullptr;
  ASSERT_EQ(cudaMalloc(&x_mem, M * K * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&w_mem, N * K * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&y_mem, M * N * 4), cudaSuccess);
  auto* X = static_cast<float*>(x_mem);
  auto* W = static_cast<float*>(w_mem);
  auto* Y = static_cast<float*>(y_mem);
  const auto x = test::random_floats(M * K, 90), w = test::random_floats(N * K, 91);
  std::copy(x.begin(), x.end(), X);
  std::copy(w.begin(), w.end(), W);
  std::fill(Y, Y + M * N, 0.0f);
  auto d = gemm::row_major_gemm(false, true, M, nb, K, 1.0f, K, K, 0.0f, N);
  gemm(d, W + n0 * K, X, Y + n0, nullptr, 0, nullptr);  // W + 45 floats: 4 bytes; Y + 9 floats: 4 bytes
  gemm::GemmAlignments al = last_gemm_alignments();
  EXPECT_EQ(al.a, 4u);
  EXPECT_EQ(al.b, 256u);
  EXPECT_EQ(al.c, 4u);
  EXPECT_EQ(al.d, 4u);
  std::vector<float> ref(M * nb);
  cpu::sgemm(false, true, M, nb, K, 1.0f, x.data(), K, w.data() + n0 * K, K, 0.0f, ref.data(), nb);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < nb; ++j) EXPECT_NEAR(Y[r * N + n0 + j], ref[r * nb + j], 1e-5) << r << "," << j;

  gemm(d, W + 2 * K, X, Y + 2, nullptr, 0, nullptr);  // 40 and 8 bytes past the allocations
  al = last_gemm_alignments();
  EXPECT_EQ(al.a, 8u);
  EXPECT_EQ(al.c, 8u);

  // bf16 panels: 2 bytes past an allocation is still a whole element.
  auto b = gemm::row_major_gemm(false, true, M, nb, K, 1.0f, K, K, 0.0f, N, gemm::DType::BF16, gemm::DType::F32);
  std::fill(static_cast<uint16_t*>(x_mem), static_cast<uint16_t*>(x_mem) + M * K, uint16_t{0x3f80});
  std::fill(static_cast<uint16_t*>(w_mem), static_cast<uint16_t*>(w_mem) + N * K, uint16_t{0x3f80});
  gemm(b, static_cast<uint16_t*>(w_mem) + 1, x_mem, Y, nullptr, 0, nullptr);
  al = last_gemm_alignments();
  EXPECT_EQ(al.a, 2u);
  EXPECT_EQ(al.c, 256u);

  // A strided batch whose items are an odd number of f32 apart: every item but the first is only
  // 4-byte aligned, whatever the base pointer.
  auto batched = gemm::row_major_gemm(false, true, 1, 1, 1, 1.0f, 1, 1, 0.0f, 1);
  batched.batch = 3;
  batched.stride_a = batched.stride_b = 3;
  batched.stride_c = 2;
  gemm(batched, W, X, Y, nullptr, 0, nullptr);
  al = last_gemm_alignments();
  EXPECT_EQ(al.a, 4u);
  EXPECT_EQ(al.b, 4u);
  EXPECT_EQ(al.c, 8u);

  // An f32 operand 2 bytes past an allocation: cuBLASLt refuses it (CUBLAS_STATUS_NOT_SUPPORTED).
  try {
    gemm(d, W, X, static_cast<char*>(y_mem) + 2, nullptr, 0, nullptr);
    ADD_FAILURE() << "a misaligned C was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_INTERNAL);
    EXPECT_NE(std::string(e.what()).find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("C is 2-byte aligned"), std::string::npos) << e.what();
  }
  cudaFree(x_mem);
  cudaFree(w_mem);
  cudaFree(y_mem);
}

// Out of place (gemm.cuh C_in: a residual the projection's GEMM adds, ops/linear.h): C = X·Wᵀ +
// beta·C_in, C_in read and never written, C's old values never read; C_in's alignment is the C
// preference and C's the D one (cuBLASLt's names), each refused below its element size.
TEST(GemmDesc, OutOfPlaceAddsCInAndLeavesItUnwritten) {
  const int64_t M = 5, N = 11, K = 7;
  void *x_mem = nullptr, *w_mem = nullptr, *c_mem = nullptr, *r_mem = nullptr;
  ASSERT_EQ(cudaMalloc(&x_mem, M * K * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&w_mem, N * K * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&c_mem, M * N * 4 + 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&r_mem, M * N * 4 + 8), cudaSuccess);
  auto* X = static_cast<float*>(x_mem);
  auto* W = static_cast<float*>(w_mem);
  auto* C = static_cast<float*>(c_mem);
  auto* R = static_cast<float*>(r_mem) + 1;  // 4 bytes past its allocation
  const auto x = test::random_floats(M * K, 92), w = test::random_floats(N * K, 93), r = test::random_floats(M * N, 94);
  std::copy(x.begin(), x.end(), X);
  std::copy(w.begin(), w.end(), W);
  std::copy(r.begin(), r.end(), R);
  std::fill(C, C + M * N, std::nanf(""));  // never read
  auto d = gemm::row_major_gemm(false, true, M, N, K, 1.0f, K, K, 1.0f, N);
  gemm(d, W, X, C, nullptr, 0, nullptr, R);
  const gemm::GemmAlignments al = last_gemm_alignments();
  EXPECT_EQ(al.c, 4u) << "C_in's alignment";
  EXPECT_EQ(al.d, 256u) << "the written matrix's";
  std::vector<float> ref(r);
  cpu::sgemm(false, true, M, N, K, 1.0f, x.data(), K, w.data(), K, 1.0f, ref.data(), N);
  for (int64_t i = 0; i < M * N; ++i) EXPECT_NEAR(C[i], ref[i], 1e-5) << i;
  EXPECT_TRUE(std::equal(r.begin(), r.end(), R)) << "C_in was written";

  // beta 0 reads neither: C = X·Wᵀ.
  d.beta = 0.0f;
  gemm(d, W, X, C, nullptr, 0, nullptr, R);
  cpu::sgemm(false, true, M, N, K, 1.0f, x.data(), K, w.data(), K, 0.0f, ref.data(), N);
  for (int64_t i = 0; i < M * N; ++i) EXPECT_NEAR(C[i], ref[i], 1e-5) << i;

  d.beta = 1.0f;
  for (const bool bad_c_in : {true, false}) {
    try {
      if (bad_c_in)
        gemm(d, W, X, C, nullptr, 0, nullptr, static_cast<char*>(r_mem) + 2);
      else
        gemm(d, W, X, static_cast<char*>(c_mem) + 2, nullptr, 0, nullptr, R);
      ADD_FAILURE() << "a misaligned " << (bad_c_in ? "C_in" : "C") << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("CUBLAS_STATUS_NOT_SUPPORTED"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad_c_in ? "C is 2-byte aligned" : "D is 2-byte aligned"), std::string::npos)
          << e.what();
    }
  }
  for (void* p : {x_mem, w_mem, c_mem, r_mem}) cudaFree(p);
}

// The panels of a held weight (cuda_workspace::held_panel_rows) start every `rows` rows, and a panel
// starting at row r0 hands cuBLASLt `y + r0` (f32) and `dy + r0` (16-bit) beside the panel: for
// the shapes of Qwen2.5 and SmolLM (896 and 576 columns do not divide the tile) those stay 16-byte
// aligned, the tensor-core kernels' requirement; no panel is empty or past the tile.
// Checked at the card's default panel budget and at a small one (what tests use to split small weights).
TEST(GemmDesc, HeldWeightPanelsKeepTheOtherOperands16ByteAligned) {
  const std::pair<int64_t, int64_t> weights[] = {{151936, 896}, {4864, 896},    {896, 4864}, {128, 896},   {49152, 576},
                                                 {1536, 576},   {576, 1536},    {7, 300000}, {20, 100000}, {101, 72},
                                                 {18944, 3584}, {152064, 3584}, {7, 3000000}};
  for (const int64_t budget : {cuda_workspace::kDefaultHeldPanelValues, int64_t{1} << 17}) {
    const int64_t previous = cuda_workspace::exchange_held_panel_values(budget);
    for (const auto& [rows, cols] : weights) {
      const int64_t step = cuda_workspace::held_panel_rows(rows, cols);
      const std::string at = std::to_string(rows) + "x" + std::to_string(cols) + ": " + std::to_string(step) +
                             " rows of a " + std::to_string(budget) + "-value panel";
      ASSERT_GE(step, 1) << at;
      ASSERT_LE(step, rows) << at;
      EXPECT_TRUE(step == 1 || step * cols <= budget) << at;
      if (step == rows) continue;  // one panel: the operands as allocated
      if (step < 8) continue;      // a row is wider than an eighth of the tile: nothing to round to
      for (int64_t r0 = step; r0 < rows; r0 += step) {
        const auto f32_at = reinterpret_cast<const void*>(static_cast<uintptr_t>(256 + 4 * r0));
        const auto b16_at = reinterpret_cast<const void*>(static_cast<uintptr_t>(256 + 2 * r0));
        ASSERT_GE(gemm::pointer_alignment(f32_at), 16u) << at << " panel at row " << r0;
        ASSERT_GE(gemm::pointer_alignment(b16_at), 16u) << at << " panel at row " << r0;
      }
    }
    cuda_workspace::exchange_held_panel_values(previous);
  }
}

TEST(GemmDesc, InvalidLeadingDimensionIsRefusedWithTheNumbers) {
  auto d = gemm::linear_forward_gemm(33, 72, 24, gemm::DType::F32, gemm::DType::F32);
  d.lda = 10;  // stored A (W, as 72 x 24 column-major) needs lda >= 72
  const std::string why = gemm::invalid_reason(d);
  EXPECT_NE(why.find("lda"), std::string::npos) << why;
  EXPECT_NE(why.find("lda=10"), std::string::npos) << why;
  std::vector<float> a(72 * 24), b(33 * 72), c(33 * 24);
  try {
    gemm(d, a.data(), b.data(), c.data(), nullptr, 0, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::RUNTIME_INTERNAL);
  }
}

}  // namespace
}  // namespace bp::sim
