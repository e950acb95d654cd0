// A LoRA training step of the demo model (models/tiny-chat) on the CPU over a base held in bf16
// (--base-dtype bf16) against the same step over the f32 base: the CPU's GEMMs against the bf16
// weights take bf16 inputs (backend/cpu/gemm_engine.h: oneDNN's bf16 matmul where the CPU has bf16
// dot products, else OpenBLAS on the operand rounded to bf16), so the step moves by what rounding
// the weights and each GEMM's activation operand to bf16 (u = 2⁻⁹) does. The CUDA backend's
// tolerances for the same comparison (docs/architecture.md "CUDA numerics"): the first step's loss
// within 2⁻⁸ relative, every LoRA gradient within 2⁻⁵ in norm, tensor by tensor. Run on each bf16
// path this machine has, and once with --cpu-gemm openblas (f32 activations), which must stay within
// them too. Adapter: r 4, random B (every LoRA gradient non-zero), dropout 0.1, every projection.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/gemm_engine.h"
#include "core/sysinfo.h"
#include "model/loader.h"
#include "model/lora.h"
#include "model/model_test_helpers.h"
#include "model/transformer.h"
#include "support/test_util.h"

namespace bp::test {
namespace {

using cpu::HeldBf16Path;

struct StepResult {
  double loss = 0;
  std::vector<std::string> names;
  std::vector<std::vector<float>> grads;
};

Batch sample_batch(int64_t vocab) {
  std::vector<std::vector<int32_t>> samples;
  uint32_t x = 12345;
  for (size_t len : {13, 1, 29}) {  // packed, a one-token sample among them
    std::vector<int32_t> s(len);
    for (auto& id : s) id = static_cast<int32_t>((x = x * 1103515245u + 12345u) >> 8) % static_cast<int32_t>(vocab);
    samples.push_back(s);
  }
  return Batch::causal_lm(samples);
}

StepResult lora_step(DType base) {
  Model model(load_model(source_dir() + "/models/tiny-chat", base), ModelOptions{TrainMode::Lora, true, 16});
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8.0f;
  lc.dropout = 0.1f;
  LoraAdapter adapter = init_lora(model.config(), lc, 7);
  uint64_t seed = 100;
  for (auto& layer : adapter.layers)
    for (int t = 0; t < kNumLoraTargets; ++t) {
      if (!layer.enabled[static_cast<size_t>(t)]) continue;
      Tensor& B = layer.B[static_cast<size_t>(t)];
      B = random_tensor(B.shape(), seed++, -0.05f, 0.05f);
    }
  model.attach_lora(adapter);
  const Batch batch = sample_batch(model.config().vocab_size);
  StepResult r;
  r.loss = model.forward_backward(batch, 1.0f / static_cast<float>(batch.num_label_tokens()), 42).mean();
  for (auto& p : model.trainable_parameters()) {
    r.names.push_back(p.name);
    r.grads.push_back(p.grad->to_vector());
  }
  return r;
}

// ‖got − ref‖ / ‖ref‖ (Frobenius).
double relative_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double d2 = 0, r2 = 0;
  for (size_t j = 0; j < ref.size(); ++j) {
    const double d = static_cast<double>(got[j]) - ref[j];
    d2 += d * d;
    r2 += static_cast<double>(ref[j]) * ref[j];
  }
  return std::sqrt(d2 / r2);
}

void select_path(HeldBf16Path p) {
  CpuIsa isa = cpu_isa();
  if (p == HeldBf16Path::F32) cpu::select_cpu_gemm("openblas", isa, cpu::onednn_built());
  if (p == HeldBf16Path::OneDnn) cpu::select_cpu_gemm("onednn");
  if (p == HeldBf16Path::Bf16Sgemm) {
    isa.avx512_bf16 = isa.amx_bf16 = false;
    cpu::select_cpu_gemm("auto", isa, cpu::onednn_built());
  }
  ASSERT_EQ(cpu::cpu_gemm_choice().held_bf16, p);
}

TEST(HeldBf16Step, TinyChatLoraStepOverABf16BaseIsWithinTheCudaPathsTolerancesOfF32) {
  const StepResult ref = lora_step(DType::F32);
  ASSERT_FALSE(ref.names.empty());
  std::vector<HeldBf16Path> paths{HeldBf16Path::Bf16Sgemm, HeldBf16Path::F32};
  bool onednn = cpu::onednn_built();
  if (onednn) try {
      cpu::select_cpu_gemm("onednn");
    } catch (const Error&) {
      onednn = false;  // linked, but no bf16 matmul on this CPU (no AVX-512)
    }
  if (onednn) paths.push_back(HeldBf16Path::OneDnn);
  std::vector<double> bf16_losses;
  for (HeldBf16Path path : paths) {
    SCOPED_TRACE(cpu::held_bf16_path_name(path));
    select_path(path);
    const StepResult got = lora_step(DType::BF16);
    cpu::select_cpu_gemm("auto");
    EXPECT_TRUE(std::isfinite(got.loss));
    EXPECT_NE(got.loss, ref.loss) << "the bf16 base moved nothing: the comparison would prove nothing";
    EXPECT_LE(std::abs(got.loss - ref.loss), std::abs(ref.loss) / 256) << got.loss << " vs " << ref.loss;
    ASSERT_EQ(got.names, ref.names);
    double worst = 0;
    std::string worst_name;
    for (size_t i = 0; i < ref.grads.size(); ++i) {
      double scale = 0;
      for (float v : ref.grads[i]) scale = std::max(scale, static_cast<double>(std::abs(v)));
      ASSERT_GT(scale, 0.0) << ref.names[i] << " has an all-zero gradient: the comparison would prove nothing";
      const double e = relative_error(got.grads[i], ref.grads[i]);
      EXPECT_LE(e, 1.0 / 32) << ref.names[i];
      if (e > worst) worst = e, worst_name = ref.names[i];
    }
    RecordProperty(std::string(cpu::held_bf16_path_name(path)) + "_worst_grad_rel", std::to_string(worst));
    std::printf("[ %s ] loss %.8f vs f32 %.8f (rel %.2e); worst LoRA gradient %.2e in %s\n",
                cpu::held_bf16_path_name(path), got.loss, ref.loss, std::abs(got.loss - ref.loss) / std::abs(ref.loss),
                worst, worst_name.c_str());
    if (path != HeldBf16Path::F32) bf16_losses.push_back(got.loss);
  }
  // The two bf16 paths compute the same products: their losses agree far closer than either to f32.
  if (bf16_losses.size() == 2)
    EXPECT_LE(std::abs(bf16_losses[0] - bf16_losses[1]), std::abs(ref.loss) * 1e-5) << "oneDNN vs OpenBLAS bf16";
}

}  // namespace
}  // namespace bp::test
