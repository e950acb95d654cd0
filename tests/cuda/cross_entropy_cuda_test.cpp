// CUDA fused linear + cross-entropy (src/backend/cuda/cross_entropy.cuh) on the simulation (its
// GEMMs run the column-major reference of the cuBLASLt descriptions) against the CPU backend:
// loss, count, dx and dW, f32 and bf16, with ignored labels, whole ignored windows, and a chunk
// that does not divide T; with Gemma 2's final logit soft-cap. The held head (a frozen W in q8_0, q4_K, bf16, ...)
// against the CPU reading the same held bytes, walked in panels that do not divide V.
#include "backend/cpu/cross_entropy.h"
#include "backend/cuda/cross_entropy.cuh"
#include "core/quant_blocks.h"
#include "sim_test_util.h"

namespace bp::sim {
namespace {

template <class T>
void check_linear_cross_entropy(int64_t T_tokens, int64_t D, int64_t V, int64_t chunk, float softcap = 0.0f) {
  const std::string at = "T=" + std::to_string(T_tokens) + " D=" + std::to_string(D) + " V=" + std::to_string(V) +
                         " chunk=" + std::to_string(chunk) + " softcap=" + std::to_string(softcap);
  const auto x = test::back(test::as<T>(test::random_floats(T_tokens * D, 90 + D, -2, 2)));
  const auto W = test::back(test::as<T>(test::random_floats(V * D, 91 + V, -0.5, 0.5)));
  std::vector<int32_t> labels(T_tokens);
  std::mt19937 rng(static_cast<uint32_t>(T_tokens + V));
  for (int64_t t = 0; t < T_tokens; ++t) labels[t] = (t % 5 == 1 || t < chunk) ? -100 : static_cast<int32_t>(rng() % V);
  if (T_tokens == 1) labels[0] = static_cast<int32_t>(V - 1);
  const float grad_scale = 1.0f / 7.0f;

  std::vector<float> logits_ws(std::min(chunk, T_tokens) * V), dx_ref(T_tokens * D), dW_ref(V * D, 0.125f);
  const auto ref =
      cpu::linear_cross_entropy(x.data(), cpu::HeldMatrix{W.data(), DType::F32, V, D}, labels.data(), T_tokens, D, V,
                                chunk, logits_ws.data(), grad_scale, dx_ref.data(), dW_ref.data(), softcap);

  auto xd = test::as<T>(x), Wd = test::as<T>(W);
  std::vector<T> dx(T_tokens * D, test::as<T>(std::vector<float>{NAN})[0]);
  std::vector<float> dW(V * D, 0.125f);
  std::vector<unsigned char> ws(cross_entropy_workspace_bytes<T>(chunk, V));
  const auto got =
      linear_cross_entropy<T>(xd.data(), Wd.data(), labels.data(), labels.data(), T_tokens, D, V, chunk, ws.data(),
                              grad_scale, dx.data(), dW.data(), gemm::Workspace{}, nullptr, softcap);
  ASSERT_EQ(got.n_counted, ref.n_counted) << at;
  const double loss_tol = std::is_same_v<T, float> ? 1e-5 : 1e-3;
  EXPECT_NEAR(got.loss_sum, ref.loss_sum, loss_tol * (1 + std::abs(ref.loss_sum))) << at;
  test::expect_close(test::back(dx), dx_ref, test::tolerance_of<T>(), "dx " + at);
  test::expect_close(dW, dW_ref, test::tolerance_of<T>(), "dW " + at);

  // Loss only (no gradients) gives the same loss.
  const auto loss_only =
      linear_cross_entropy<T>(xd.data(), Wd.data(), labels.data(), labels.data(), T_tokens, D, V, chunk, ws.data(),
                              grad_scale, nullptr, nullptr, gemm::Workspace{}, nullptr, softcap);
  EXPECT_EQ(loss_only.loss_sum, got.loss_sum) << at;
}

TEST(CudaLinearCrossEntropy, MatchesCpuF32) {
  check_linear_cross_entropy<float>(1, 31, 33, 4);
  check_linear_cross_entropy<float>(33, 31, 257, 8);  // first window all ignored; 33 = 4·8 + 1
  check_linear_cross_entropy<float>(17, 64, 1000, 17);
}

TEST(CudaLinearCrossEntropy, MatchesCpuBf16) {
  check_linear_cross_entropy<bf16>(33, 31, 257, 8);
}

// Gemma 2's final_logit_softcapping (logits up to ~3 here: a cap of 1.5 bends them).
TEST(CudaLinearCrossEntropy, FinalLogitSoftcapMatchesCpu) {
  check_linear_cross_entropy<float>(33, 31, 257, 8, 1.5f);
  check_linear_cross_entropy<float>(17, 64, 1000, 17, 1.5f);
  check_linear_cross_entropy<bf16>(33, 31, 257, 8, 1.5f);
}

// W [V, D] held in `type`: linear_cross_entropy_held with panels of `panel_rows` rows against the
// CPU kernel reading the same held matrix: loss and dx (a held weight gets no gradient).
void check_held_head(DType type, int64_t D, int64_t panel_rows) {
  const int64_t T_tokens = 21, V = 37, chunk = 8;
  const std::string at = std::string(dtype_name(type)) + " panel_rows=" + std::to_string(panel_rows);
  const auto x = test::random_floats(T_tokens * D, 80, -2, 2);
  const auto w = test::random_floats(V * D, 81, -0.5, 0.5);
  std::vector<uint8_t> held(dtype_bytes(type, V * D));
  quantize_span(type, w.data(), held.data(), V * D);
  const cpu::HeldMatrix W{held.data(), type, V, D};
  std::vector<int32_t> labels(T_tokens);
  for (int64_t t = 0; t < T_tokens; ++t) labels[t] = t < chunk || t % 4 == 2 ? -100 : static_cast<int32_t>(t * 5 % V);
  std::vector<float> logits_ws(chunk * V), dx_ref(T_tokens * D);
  const auto ref = cpu::linear_cross_entropy(x.data(), W, labels.data(), T_tokens, D, V, chunk, logits_ws.data(), 0.5f,
                                             dx_ref.data(), nullptr);
  std::vector<float> dx(T_tokens * D, NAN);
  std::vector<unsigned char> ws(cross_entropy_held_workspace_bytes(chunk, V, D, panel_rows));
  const uint64_t launches = launch_count();
  const auto got = linear_cross_entropy_held(x.data(), type, held.data(), labels.data(), labels.data(), T_tokens, D, V,
                                             chunk, panel_rows, ws.data(), 0.5f, dx.data(), gemm::Workspace{});
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  // Two windows with labels, each dequantizing every panel twice (logits, dx), plus a softmax and
  // the addition of its row losses to the call's total (kept on the device).
  const int64_t panels = (V + panel_rows - 1) / panel_rows;
  EXPECT_EQ(launch_count() - launches, static_cast<uint64_t>(2 * (2 * panels + 2))) << at;
  ASSERT_EQ(got.n_counted, ref.n_counted) << at;
  EXPECT_NEAR(got.loss_sum, ref.loss_sum, 1e-5 * (1 + std::abs(ref.loss_sum))) << at;
  test::expect_close(dx, dx_ref, test::kF32Tol, "dx " + at);
}

TEST(CudaLinearCrossEntropy, HeldHeadMatchesCpuInPanels) {
  for (int64_t panel_rows : {5, 37}) {  // 8 panels, the last of 2 rows; one panel
    check_held_head(DType::Q8_0, 64, panel_rows);
    check_held_head(DType::Q4_K, 256, panel_rows);
    check_held_head(DType::Q6_K, 256, panel_rows);
    check_held_head(DType::BF16, 31, panel_rows);
  }
}

}  // namespace
}  // namespace bp::sim
