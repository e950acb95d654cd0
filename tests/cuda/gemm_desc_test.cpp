// The GEMM descriptions the CUDA backend hands to cuBLASLt (src/backend/cuda/gemm_desc.h),
// executed by the plain column-major reference, against the CPU backend's row-major sgemm for
// the shapes of the model (a small Qwen2-like layer at odd sizes): q/k/v/o, gate/up/down, the LM
// head chunk, each forward and both backward GEMMs; bf16 inputs too; a strided batch; and the
// refusal of an invalid description.
#include "backend/cuda/gemm_desc.h"

#include "backend/cpu/gemm.h"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/sim/gemm_reference.h"
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
