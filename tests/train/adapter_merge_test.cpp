// Adapter merging (train/adapter_merge.h) against the NumPy/PyTorch oracle
// tests/oracles/adapter_merge.py on random adapters (every tensor random, B included), plus the
// properties each mode promises.
#include "train/adapter_merge.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/model_test_helpers.h"
#include "support/finite_diff_b.h"
#include "support/test_util.h"

namespace bp {
namespace {

// A tiny adapter on q/v/down (odd shapes: in 32 or 48, out 32 or 16, r 3) with every tensor random;
// moe: a tiny Qwen3-MoE (3 experts, layer 1 dense) with LoRA on q, every expert's gate and down, and
// the routers (each expert's projection a module of its own).
LoraAdapter random_adapter(uint64_t seed, bool moe = false) {
  LoraConfig lc;
  lc.r = 3;
  lc.alpha = 6;
  lc.target_modules = {"q_proj", "v_proj", "down_proj"};
  test::TinySpec spec;
  if (moe) {
    spec.arch = Arch::Qwen3Moe, spec.layers = 3, spec.tied = false;
    spec.hf = {{"num_experts", 3},
               {"num_experts_per_tok", 2},
               {"moe_intermediate_size", 16},
               {"norm_topk_prob", true},
               {"mlp_only_layers", {1}}};
    lc.target_modules = {"q_proj", "gate_proj", "down_proj", "gate"};
  }
  LoraAdapter a = init_lora(test::tiny_config(spec), lc, seed);
  uint64_t s = seed * 1000;
  for (auto& layer : a.layers) {
    for (LoraTarget t : kAllLoraTargets)
      if (layer.has(t)) {
        layer.a(t) = test::random_tensor(layer.a(t).shape(), ++s);
        layer.b(t) = test::random_tensor(layer.b(t).shape(), ++s, -0.5f, 0.5f);
      }
    for (size_t p = 0; p < 3; ++p)
      if (layer.expert_A[p].defined()) {
        layer.expert_A[p] = test::random_tensor(layer.expert_A[p].shape(), ++s);
        layer.expert_B[p] = test::random_tensor(layer.expert_B[p].shape(), ++s, -0.5f, 0.5f);
      }
    if (layer.router_A.defined()) {
      layer.router_A = test::random_tensor(layer.router_A.shape(), ++s);
      layer.router_B = test::random_tensor(layer.router_B.shape(), ++s, -0.5f, 0.5f);
    }
  }
  return a;
}

// The order merge_adapter documents: the dense modules' A, B; then each expert's (views of the
// stacked tensors), then each router's.
std::vector<Tensor> tensor_list(const LoraAdapter& a) {
  std::vector<Tensor> v;
  for (const auto& layer : a.layers)
    for (LoraTarget t : kAllLoraTargets)
      if (layer.has(t)) {
        v.push_back(layer.a(t));
        v.push_back(layer.b(t));
      }
  for (const auto& layer : a.layers) {
    for (size_t p = 0; p < 3; ++p)
      if (layer.expert_A[p].defined())
        for (int64_t e = 0; e < layer.expert_A[p].dim(0); ++e) {
          v.push_back(expert_matrix(layer.expert_A[p], e));
          v.push_back(expert_matrix(layer.expert_B[p], e));
        }
    if (layer.router_A.defined()) {
      v.push_back(layer.router_A);
      v.push_back(layer.router_B);
    }
  }
  return v;
}
std::vector<const Tensor*> tensors(const LoraAdapter& a) {
  static thread_local std::vector<std::vector<Tensor>> keep;  // the views outlive the call
  keep.push_back(tensor_list(a));
  std::vector<const Tensor*> v;
  for (const Tensor& t : keep.back()) v.push_back(&t);
  return v;
}

// On a Mixture-of-Experts adapter (one oracle run): the dense modules (q_proj, the dense layer's MLP),
// and each expert's A and B and each router's as tensors of their own (TIES trims each, DARE draws each
// one's mask, slao orthonormalises each expert's A), as PEFT's modules are.
TEST(AdapterMerge, EveryModeMatchesTheOracle) {
  const LoraAdapter merged = random_adapter(1, true), fresh = random_adapter(2, true);
  test::TempDir dir;
  nlohmann::json list = nlohmann::json::array();
  auto mt = tensors(merged), ft = tensors(fresh);
  for (size_t k = 0; k < mt.size(); ++k) {
    test::write_raw(dir.path + "/merged_" + std::to_string(k) + ".f32", mt[k]->to_vector());
    test::write_raw(dir.path + "/fresh_" + std::to_string(k) + ".f32", ft[k]->to_vector());
    list.push_back({{"shape", {mt[k]->dim(0), mt[k]->dim(1)}}, {"is_b", k % 2 == 1}});
  }
  const int64_t run_index = 3;
  AdapterMergeOptions opt;
  opt.ties_trim = 0.3;
  opt.dare_drop = 0.4;
  opt.seed = 7;
  auto res = test::run_python_oracle(
      "adapter_merge.py", "", dir.path,
      {{"tensors", list}, {"run_index", run_index}, {"ties_trim", 0.3}, {"dare_drop", 0.4}, {"seed", 7}});
  ASSERT_FALSE(res.is_null());
  EXPECT_NEAR(adapter_b_cosine(merged, fresh), res["b_cosine"].get<double>(), 1e-9);
  EXPECT_NEAR(slao_lambda(run_index), res["lambda"].get<double>(), 1e-15);

  for (auto mode : {AdapterMergeMode::Slao, AdapterMergeMode::Linear, AdapterMergeMode::Ties, AdapterMergeMode::Dare}) {
    opt.mode = mode;
    LoraAdapter out = clone_adapter(merged);
    merge_adapter(out, fresh, run_index, opt);
    auto ot = tensors(out);
    for (size_t k = 0; k < ot.size(); ++k) {
      auto expect =
          test::read_raw_f32(dir.path + "/" + adapter_merge_mode_name(mode) + "_" + std::to_string(k) + ".out.f32");
      EXPECT_TRUE(test::all_close(ot[k]->to_vector(), expect, {1e-6, 1e-6}))
          << adapter_merge_mode_name(mode) << " tensor " << k;
    }
  }
  LoraAdapter ortho = clone_adapter(merged);
  orthonormalize_rows(ortho);
  auto ot = tensors(ortho);
  for (size_t k = 0; k < ot.size(); k += 2)
    EXPECT_TRUE(test::all_close(
        ot[k]->to_vector(), test::read_raw_f32(dir.path + "/ortho_" + std::to_string(k) + ".out.f32"), {1e-5, 1e-5}))
        << "A tensor " << k;
}

TEST(AdapterMerge, SlaoLambdaIsClampedInverseSquareRoot) {
  EXPECT_DOUBLE_EQ(slao_lambda(1), 1.0);
  EXPECT_DOUBLE_EQ(slao_lambda(4), 0.5);
  EXPECT_DOUBLE_EQ(slao_lambda(100), 0.1);
  EXPECT_DOUBLE_EQ(slao_lambda(10000), 0.1);  // 0.01 clamped up
}

TEST(AdapterMerge, FirstSlaoRunTakesTheFreshAdapterAndLaterRunsBlendB) {
  LoraAdapter merged = random_adapter(3);
  const LoraAdapter fresh = random_adapter(4), before = clone_adapter(merged);
  merge_adapter(merged, fresh, 1, {});
  for (size_t k = 0; k < tensors(merged).size(); ++k)
    EXPECT_EQ(tensors(merged)[k]->to_vector(), tensors(fresh)[k]->to_vector());
  LoraAdapter second = clone_adapter(before);
  merge_adapter(second, fresh, 4, {});  // λ = 0.5: B halfway, A replaced
  auto s = tensors(second), b = tensors(before), f = tensors(fresh);
  EXPECT_EQ(s[0]->to_vector(), f[0]->to_vector());
  EXPECT_NEAR(s[1]->to_vector()[5], 0.5f * (b[1]->to_vector()[5] + f[1]->to_vector()[5]), 1e-6);
}

TEST(AdapterMerge, OrthonormalizedRowsAreOrthonormalAndSpanTheSameSpace) {
  LoraAdapter a = random_adapter(5);
  const LoraAdapter original = clone_adapter(a);
  orthonormalize_rows(a);
  const Tensor& q = a.layers[0].a(LoraTarget::Q);
  const Tensor& orig = original.layers[0].a(LoraTarget::Q);
  const int64_t r = q.dim(0), in = q.dim(1);
  const float* qd = q.data<float>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < r; ++j) {
      double d = 0;
      for (int64_t k = 0; k < in; ++k) d += double(qd[i * in + k]) * qd[j * in + k];
      EXPECT_NEAR(d, i == j ? 1.0 : 0.0, 1e-5);
    }
  // Each original row is its own projection onto the new rows (same row space).
  const float* od = orig.data<float>();
  for (int64_t i = 0; i < r; ++i) {
    std::vector<double> proj(static_cast<size_t>(in), 0.0);
    for (int64_t j = 0; j < r; ++j) {
      double c = 0;
      for (int64_t k = 0; k < in; ++k) c += double(od[i * in + k]) * qd[j * in + k];
      for (int64_t k = 0; k < in; ++k) proj[static_cast<size_t>(k)] += c * qd[j * in + k];
    }
    for (int64_t k = 0; k < in; ++k) EXPECT_NEAR(proj[static_cast<size_t>(k)], od[i * in + k], 1e-4);
  }
}

TEST(AdapterMerge, FiniteCheckAndMismatchedAdapters) {
  LoraAdapter a = random_adapter(6);
  EXPECT_TRUE(adapter_is_finite(a));
  a.layers[1].b(LoraTarget::V).data<float>()[2] = std::nanf("");
  EXPECT_FALSE(adapter_is_finite(a));
  LoraAdapter other = random_adapter(7);
  other.layers.pop_back();
  EXPECT_THROW(merge_adapter(a, other, 2, {}), Error);
  AdapterMergeOptions bad;
  bad.dare_drop = 1.0;
  EXPECT_THROW(merge_adapter(a, random_adapter(8), 2, bad), Error);
  EXPECT_THROW(parse_adapter_merge_mode("average"), Error);
}

}  // namespace
}  // namespace bp
