// PiSSA initialisation (--init-lora-weights pissa, model/lora.h init_pissa / pissa_to_lora):
//   - B·A and the residual base W − s·B·A against tests/oracles/pissa_svd.py (torch.linalg.svd in
//     float64, PEFT's formulas; products, since singular vectors have arbitrary signs), also of
//     Phi-3's fused qkv_proj / gate_up_proj (one SVD of the fused weight, PEFT's one Linear);
//   - at step 0 the model (residual base + adapter) gives the base model's logits (Llama, Gemma 3;
//     Phi-3's fused modules: tests/cli/dora_pissa_cli_test.cpp PissaCli.Phi3*, merged export);
//   - after A and B change (as training changes them), the saved adapter (PEFT's PiSSA-to-LoRA
//     conversion: rank 2r, alpha doubled, [A; A0] and [B, −B0]) applied to the ORIGINAL base by the
//     PyTorch oracle (tests/oracles/torch_llama.py) gives the trained model's logits;
//   - a quantized base, DoRA together with PiSSA, and an unknown init are refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/lora.h"
#include "model/model_test_helpers.h"
#include "model/peft.h"
#include "model/weight_names.h"
#include "ops/elementwise.h"
#include "ops/svd.h"

namespace bp::test {
namespace {

TinySpec spec() {
  TinySpec s;  // hidden 32, inter 48, GQA 4/2, tied
  s.layers = 2;
  return s;
}

LoraConfig pissa_config(bool rslora = false, std::vector<std::string> targets = {"all-linear"}) {
  LoraConfig lc;
  lc.r = 3;
  lc.alpha = 6;
  lc.use_rslora = rslora;
  lc.init_lora_weights = "pissa";
  lc.target_modules = std::move(targets);
  return lc;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

ModelWeights clone_weights(const ModelWeights& w) {
  ModelWeights c = w;
  for (const auto& [role, layer] : model_roles(c.config))
    weight_ref(c, role, layer) = weight_ref(w, role, layer).clone();
  return c;
}

// PiSSA's factors and residual of every adapted module of the architecture `sp` against the oracle.
// A fused module (Phi-3's qkv_proj, gate_up_proj: PEFT's one Linear) is one SVD of its whole
// [Σout, in] weight: one A shared by the members, B over all its rows, the residual in the members'
// rows of the fused weight.
void expect_factors_and_residual_match_torch(const TinySpec& sp) {
  const ModelConfig cfg = tiny_config(sp);
  const ModelWeights original = tiny_weights(cfg, 11);
  ModelWeights w = clone_weights(original);
  LoraAdapter ad = init_lora(cfg, pissa_config(), 3);
  init_pissa(ad, w, 0);

  // Each module: its first member, name and weight (a fused one's joined in HF's row order).
  struct Module {
    int64_t layer;
    LoraTarget t;
    const LoraFusedModule* f;
    std::string name;
  };
  std::vector<Module> modules;
  auto joined = [&](const ModelWeights& mw, const Module& m) {
    std::vector<const Tensor*> parts;
    for (int i = 0; i < (m.f ? m.f->count : 1); ++i)
      parts.push_back(&weight_ref(mw, lora_target_role(static_cast<LoraTarget>(static_cast<int>(m.t) + i)), m.layer));
    return join_rows_or_copy(parts);
  };
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (LoraTarget t : kAllLoraTargets) {
      const LoraFusedModule* f = cfg.fused_projections() ? lora_fused_module_of(t) : nullptr;
      if (f && f->first != t) continue;
      const std::string a = peft_lora_name(l, t, true, f != nullptr);
      modules.push_back({l, t, f, a.substr(0, a.size() - std::string(".lora_A.weight").size())});
    }

  TempDir dir;
  nlohmann::json table = nlohmann::json::array();
  std::ofstream bin(dir.path + "/tensors.bin", std::ios::binary);
  int64_t off = 0;
  for (const Module& m : modules) {
    const Tensor W = joined(original, m);
    const auto v = W.to_vector();
    bin.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    table.push_back({{"name", m.name}, {"shape", W.shape().vec()}, {"offset", off}});
    off += static_cast<int64_t>(v.size());
  }
  bin.close();
  std::ofstream(dir.path + "/spec.json") << nlohmann::json{
      {"r", ad.config.r},
      {"scale", ad.config.scale()},
      {"tensors", table}}.dump();
  std::string log;
  ASSERT_EQ(run_command("/usr/bin/python3 " + source_dir() + "/tests/oracles/pissa_svd.py " + dir.path, &log), 0)
      << "the PiSSA oracle needs /usr/bin/python3 with torch:\n"
      << log;
  const OracleResult ref = [&] {  // read_oracle_result wants a loss: give the table alone
    nlohmann::json r = nlohmann::json::parse(std::ifstream(dir.path + "/result.json"));
    r["loss"] = 0.0;
    r["n_counted"] = 0;
    std::ofstream(dir.path + "/result.json") << r.dump();
    return read_oracle_result(dir.path);
  }();

  const double s = ad.config.scale();
  for (const Module& m : modules) {
    const LoraLayer& layer = ad.layers[static_cast<size_t>(m.layer)];
    const Tensor& A = layer.a(m.t);
    const Tensor B = m.f ? fused_rows_of(layer.B, *m.f) : layer.b(m.t);
    const int64_t out = B.dim(0), in = A.dim(1), r = A.dim(0);
    std::vector<double> ba(static_cast<size_t>(out * in));
    const auto a = A.to_vector(), b = B.to_vector();
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        for (int64_t k = 0; k < r; ++k) ba[static_cast<size_t>(o * in + i)] += double(b[o * r + k]) * a[k * in + i];
    // f32 factors of an f64 SVD: a few f32 roundings of values of |W|'s size (|W| < 1/sqrt(in)).
    const std::vector<double>& want_ba = ref.arrays.at("ba:" + m.name);
    ASSERT_EQ(ba.size(), want_ba.size()) << m.name;
    EXPECT_GT(max_abs(want_ba), 1e-3) << m.name;
    EXPECT_TRUE(all_close(ba, want_ba, {1e-6 / s, 1e-5})) << m.name;
    EXPECT_TRUE(all_close(to_double(joined(w, m)), ref.arrays.at("residual:" + m.name), {2e-6, 1e-5})) << m.name;
    const auto ti = static_cast<size_t>(m.t);
    EXPECT_EQ(layer.A0[ti].to_vector(), A.to_vector());
    EXPECT_EQ((m.f ? fused_rows_of(layer.B0, *m.f) : layer.B0[ti]).to_vector(), B.to_vector());
    for (int i = 1; m.f && i < m.f->count; ++i) {  // the members share A; their B are B's rows
      const auto mi = ti + static_cast<size_t>(i);
      EXPECT_TRUE(same_tensor(layer.A[mi], A)) << m.name;
      EXPECT_TRUE(Tensor::joined_rows(std::vector<const Tensor*>{&layer.B[mi - 1], &layer.B[mi]}).defined()) << m.name;
    }
  }
}

TEST(Pissa, FactorsAndResidualMatchTorchSvd) {
  expect_factors_and_residual_match_torch(spec());
}

// Phi-3's fused qkv_proj and gate_up_proj: one SVD of each fused weight, as PEFT's one Linear.
TinySpec phi3_spec() {
  TinySpec p;
  p.arch = Arch::Phi3;
  p.layers = 2;
  p.hf = {{"partial_rotary_factor", 0.75}};
  return p;
}

TEST(Pissa, Phi3FusedModulesFactorsAndResidualMatchTorchSvd) {
  expect_factors_and_residual_match_torch(phi3_spec());
}

// Step 0 is the base model, and the saved conversion applied by the oracle to the original base is
// the trained model: for the architecture `sp`, with the LoRA or the rsLoRA scale.
void expect_starts_as_base_and_saved_applies_to_original(const TinySpec& sp, const std::vector<bool>& rsloras,
                                                         const std::vector<std::string>& targets = {"all-linear"}) {
  const ModelConfig cfg = tiny_config(sp);
  const Batch batch = tiny_batch(cfg.vocab_size, 5);
  Model base(tiny_weights(cfg, 21), ModelOptions{TrainMode::Frozen});
  base.set_training(false);
  const auto base_logits = to_double(base.logits(batch));

  for (bool rslora : rsloras) {
    SCOPED_TRACE(rslora ? "rsLoRA" : "LoRA");
    ModelWeights w = tiny_weights(cfg, 21);
    LoraAdapter ad = init_lora(cfg, pissa_config(rslora, targets), 4);
    init_pissa(ad, w, 0);
    Model model(std::move(w), ModelOptions{TrainMode::Lora});
    model.attach_lora(ad);
    model.set_training(false);
    EXPECT_TRUE(all_close(to_double(model.logits(batch)), base_logits, kParityLogits)) << "step 0 is the base";

    // "Training": A and B move away from A0 and B0.
    uint64_t seed = 900;
    for (LoraLayer& l : ad.layers) {
      for (LoraTarget t : kAllLoraTargets) {
        if (!l.has(t)) continue;
        axpy_inplace(l.a(t), 1.0f, random_tensor(l.a(t).shape(), ++seed, -0.2f, 0.2f));
        axpy_inplace(l.b(t), 1.0f, random_tensor(l.b(t).shape(), ++seed, -0.2f, 0.2f));
      }
      for (size_t p = 0; p < 3; ++p)  // every expert's (a Mixture-of-Experts layer)
        if (l.expert_A[p].defined()) {
          axpy_inplace(l.expert_A[p], 1.0f, random_tensor(l.expert_A[p].shape(), ++seed, -0.2f, 0.2f));
          axpy_inplace(l.expert_B[p], 1.0f, random_tensor(l.expert_B[p].shape(), ++seed, -0.2f, 0.2f));
        }
    }
    const auto trained = to_double(model.logits(batch));
    EXPECT_GT(max_abs_diff(trained, base_logits), 1e-2) << "the adapter should change the logits";

    // The saved adapter: PEFT's layout of the conversion.
    TempDir dir;
    save_peft_adapter(ad, dir.path + "/adapter");
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(dir.path + "/adapter/adapter_config.json"));
    EXPECT_EQ(j["r"], 6);
    EXPECT_NEAR(j["lora_alpha"].get<double>(), rslora ? 6 * std::sqrt(2.0) : 12.0, 1e-5);
    EXPECT_EQ(j["init_lora_weights"], true);
    LoraAdapter saved = load_peft_adapter(dir.path + "/adapter", cfg);
    if (cfg.is_moe()) {  // each expert's own rank-2r LoRA, stacked
      EXPECT_EQ(saved.layers[0].expert_A[2].shape(), (Shape{cfg.num_experts, 6, cfg.moe_intermediate_size}));
      EXPECT_EQ(saved.layers[0].expert_B[0].shape(), (Shape{cfg.num_experts, cfg.moe_intermediate_size, 6}));
    } else {
      EXPECT_EQ(saved.layers[1].a(LoraTarget::Down).shape(), (Shape{6, cfg.intermediate_size}));
      EXPECT_EQ(saved.layers[0].b(LoraTarget::K).shape(), (Shape{cfg.kv_dim(), 6}));
    }
    EXPECT_NEAR(saved.config.scale(), ad.config.scale(), 1e-6 * ad.config.scale());

    // The oracle applies it to the original base (torch, float64).
    Model on_original(tiny_weights(cfg, 21), ModelOptions{TrainMode::Lora});
    TinyLora tl;
    tl.view = LoraView::of(saved);
    tl.alpha = saved.config.alpha;
    tl.rslora = saved.config.use_rslora;
    on_original.attach_lora(tl.view);
    write_oracle_case(dir.path + "/case", on_original, &tl, batch, OracleAdamW{});
    std::string error;
    ASSERT_TRUE(run_torch_oracle({dir.path + "/case"}, &error)) << error;
    const OracleResult ref = read_oracle_result(dir.path + "/case/out");
    EXPECT_TRUE(all_close(trained, ref.arrays.at("logits"), kParityLogits));
  }
}

TEST(Pissa, StartsAsTheBaseAndItsSavedAdapterAppliesToTheOriginalBase) {
  expect_starts_as_base_and_saved_applies_to_original(spec(), {false, true});
}

// Gemma 3's seven projections (between its sandwich (1 + w) norms, GeGLU) as Llama's.
TEST(Pissa, GemmaStartsAsTheBaseAndItsSavedAdapterAppliesToTheOriginalBase) {
  TinySpec gemma3;
  gemma3.arch = Arch::Gemma3;
  gemma3.head_dim = 16;
  expect_starts_as_base_and_saved_applies_to_original(gemma3, {false});
}

// Mixture-of-Experts: each expert's projection is one PEFT module, so PiSSA takes each expert's own
// SVD: s·B_e·A_e is the rank-r truncation of that expert's W_e (LAPACK's, ops/svd.h) and its slab of the
// stacked weight becomes the residual; the model starts as the base and the saved conversion (each
// expert's rank-2r LoRA) applied by the oracle to the original experts is the trained model.
std::vector<double> rank_r_product(const Svd& d, int64_t r);

TEST(Pissa, EachExpertFromItsOwnSvd) {
  TinySpec moe;
  moe.arch = Arch::Qwen3Moe;
  moe.layers = 2;
  moe.tied = false;
  moe.hf = {{"num_experts", 3}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 16}, {"norm_topk_prob", true}};
  const std::vector<std::string> targets = {"q_proj", "gate_proj", "up_proj", "down_proj"};
  const ModelConfig cfg = tiny_config(moe);
  const ModelWeights original = tiny_weights(cfg, 11);
  ModelWeights w = clone_weights(original);
  LoraAdapter ad = init_lora(cfg, pissa_config(false, targets), 3);
  init_pissa(ad, w, 0);
  const double s = ad.config.scale();
  for (int64_t e = 0; e < cfg.num_experts; ++e)
    for (int p = 0; p < 3; ++p) {
      const auto role = static_cast<WeightRole>(static_cast<int>(WeightRole::ExpertGate) + p);
      const Tensor W = expert_matrix(weight_ref(original, role, 1), e);
      const Svd d = svd(W);
      const std::vector<double> want = rank_r_product(d, 3);
      const auto a = expert_matrix(ad.layers[1].expert_A[static_cast<size_t>(p)], e).to_vector();
      const auto b = expert_matrix(ad.layers[1].expert_B[static_cast<size_t>(p)], e).to_vector();
      const int64_t out = W.dim(0), in = W.dim(1);
      std::vector<double> sba(static_cast<size_t>(out * in)), residual(sba.size());
      const auto wv = W.to_vector();
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          double v = 0;
          for (int64_t k = 0; k < 3; ++k) v += double(b[o * 3 + k]) * a[k * in + i];
          sba[static_cast<size_t>(o * in + i)] = s * v;
          residual[static_cast<size_t>(o * in + i)] = wv[static_cast<size_t>(o * in + i)] - s * v;
        }
      EXPECT_GT(max_abs(want), 1e-3);
      EXPECT_TRUE(all_close(sba, want, {1e-6, 1e-5})) << "expert " << e << " projection " << p;
      EXPECT_TRUE(all_close(to_double(expert_matrix(weight_ref(w, role, 1), e)), residual, {2e-6, 1e-5}))
          << "expert " << e << " projection " << p;
    }
  expect_starts_as_base_and_saved_applies_to_original(moe, {false}, targets);
}

// W [m, n] = U·diag(σ)·Vᵀ with random orthonormal U, V (Gram-Schmidt of random columns) and a
// geometrically decaying spectrum σ_i = ratio^i.
Tensor decaying_spectrum_matrix(int64_t m, int64_t n, double ratio, uint64_t seed) {
  const int64_t k = std::min(m, n);
  auto orthonormal = [&](int64_t rows, uint64_t sd) {
    std::vector<double> q = to_double(random_tensor({rows, k}, sd));
    for (int64_t j = 0; j < k; ++j) {
      for (int pass = 0; pass < 2; ++pass)
        for (int64_t i = 0; i < j; ++i) {
          double d = 0;
          for (int64_t t = 0; t < rows; ++t) d += q[t * k + i] * q[t * k + j];
          for (int64_t t = 0; t < rows; ++t) q[t * k + j] -= d * q[t * k + i];
        }
      double nrm = 0;
      for (int64_t t = 0; t < rows; ++t) nrm += q[t * k + j] * q[t * k + j];
      for (int64_t t = 0; t < rows; ++t) q[t * k + j] /= std::sqrt(nrm);
    }
    return q;
  };
  const std::vector<double> U = orthonormal(m, seed), V = orthonormal(n, seed + 1);
  Tensor W = Tensor::empty({m, n});
  for (int64_t a = 0; a < m; ++a)
    for (int64_t b = 0; b < n; ++b) {
      double v = 0;
      for (int64_t i = 0; i < k; ++i) v += U[a * k + i] * std::pow(ratio, static_cast<double>(i)) * V[b * k + i];
      W.data<float>()[a * n + b] = static_cast<float>(v);
    }
  return W;
}

// U_r·diag(S_r)·V_rᵀ of an Svd, [m, n].
std::vector<double> rank_r_product(const Svd& d, int64_t r) {
  std::vector<double> p(static_cast<size_t>(d.m * d.n), 0.0);
  for (int64_t a = 0; a < d.m; ++a)
    for (int64_t b = 0; b < d.n; ++b)
      for (int64_t i = 0; i < r; ++i) p[a * d.n + b] += d.U[a * d.k + i] * d.S[i] * d.Vt[i * d.n + b];
  return p;
}

double frobenius(const std::vector<double>& a, const std::vector<double>* minus = nullptr) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double v = a[i] - (minus ? (*minus)[i] : 0.0);
    s += v * v;
  }
  return std::sqrt(s);
}

// The randomized SVD (torch.svd_lowrank's algorithm, PEFT's pissa_niter_N) against LAPACK's exact
// one on a matrix whose spectrum decays by 0.5 a value: with q = r and N power iterations the rank-r
// product is within about (σ_{r+1}/σ_r)^(2N+1) of the truncated SVD's (Halko et al. 2011, §10), here
// 0.5^9 for N = 4, and further from it with fewer iterations; singular values likewise.
// Deterministic in the seed; q past min(m, n) is refused.
TEST(Pissa, FastSvdApproximatesTheTruncatedSvd) {
  const Tensor W = decaying_spectrum_matrix(40, 24, 0.5, 17);
  const int64_t r = 4;
  const Svd exact = svd(W);
  const std::vector<double> want = rank_r_product(exact, r);
  std::vector<double> errors;
  for (int niter : {0, 1, 4}) {
    const Svd fast = svd_lowrank(W, r, niter, 99);
    ASSERT_EQ(fast.k, r);
    const double err = frobenius(rank_r_product(fast, r), &want) / frobenius(want);
    errors.push_back(err);
    if (niter == 4) {
      EXPECT_LT(err, 2e-3) << "niter 4";
      for (int64_t i = 0; i < r; ++i) EXPECT_NEAR(fast.S[i], exact.S[i], 2e-3 * exact.S[0]) << i;
    }
  }
  EXPECT_LT(errors[2], errors[1]);
  EXPECT_LT(errors[1], errors[0]);
  EXPECT_EQ(svd_lowrank(W, r, 2, 5).U, svd_lowrank(W, r, 2, 5).U);
  EXPECT_NE(svd_lowrank(W, r, 2, 5).U, svd_lowrank(W, r, 2, 6).U);
  EXPECT_THROW(svd_lowrank(W, 25, 2, 5), Error);
}

// --init-lora-weights pissa_niter_N: the model is unchanged at step 0, A and B are the exact
// PiSSA's up to the fast SVD's error, redone bit for bit from the same seed (a resume), and another
// seed draws another test matrix.
TEST(Pissa, FastSvdInitStartsAsTheBaseAndIsReproducible) {
  const ModelConfig cfg = tiny_config(spec());
  const Batch batch = tiny_batch(cfg.vocab_size, 5);
  Model base(tiny_weights(cfg, 21), ModelOptions{TrainMode::Frozen});
  base.set_training(false);
  const auto base_logits = to_double(base.logits(batch));
  LoraConfig lc = pissa_config();
  lc.init_lora_weights = "pissa_niter_4";
  EXPECT_EQ(lc.pissa_niter(), 4);
  EXPECT_TRUE(lc.pissa());
  auto init = [&](uint64_t seed) {
    ModelWeights w = tiny_weights(cfg, 21);
    LoraAdapter ad = init_lora(cfg, lc, 4);
    init_pissa(ad, w, seed);
    return std::pair{std::move(w), std::move(ad)};
  };
  auto [w, ad] = init(7);
  const auto [w2, ad2] = init(7);
  const auto [w3, ad3] = init(8);
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (LoraTarget t : kAllLoraTargets) {
      EXPECT_EQ(weight_ref(w, lora_target_role(t), l).to_vector(), weight_ref(w2, lora_target_role(t), l).to_vector());
      EXPECT_EQ(ad.layers[l].a(t).to_vector(), ad2.layers[l].a(t).to_vector());
    }
  EXPECT_NE(ad.layers[0].a(LoraTarget::Q).to_vector(), ad3.layers[0].a(LoraTarget::Q).to_vector());
  Model model(std::move(w), ModelOptions{TrainMode::Lora});
  model.attach_lora(ad);
  model.set_training(false);
  EXPECT_TRUE(all_close(to_double(model.logits(batch)), base_logits, kParityLogits)) << "step 0 is the base";
  const ModelConfig& c = cfg;
  for (const std::string bad : {"pissa_niter_", "pissa_niter_x", "pissa_niter_1001", "pissa_niter_-1"}) {
    LoraConfig b = lc;
    b.init_lora_weights = bad;
    EXPECT_FALSE(b.pissa()) << bad;
    EXPECT_THROW(init_lora(c, b, 1), Error) << bad;
  }
}

TEST(Pissa, RefusesWhatItCannotDo) {
  const ModelConfig cfg = tiny_config(spec());
  auto code_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::RUNTIME_INTERNAL;
  };
  LoraConfig both = pissa_config();
  both.use_dora = true;
  EXPECT_EQ(code_of([&] { both.validate(); }), ErrorCode::CONFIG_INVALID_SETTING);
  LoraConfig unknown = pissa_config();
  unknown.init_lora_weights = "olora";
  EXPECT_EQ(code_of([&] { unknown.validate(); }), ErrorCode::CONFIG_INVALID_SETTING);
  ModelWeights w = tiny_weights(cfg, 3);
  weight_ref(w, WeightRole::Up, 1) = weight_ref(w, WeightRole::Up, 1).to(DType::Q8_0);
  LoraAdapter ad = init_lora(cfg, pissa_config(), 1);
  EXPECT_EQ(code_of([&] { init_pissa(ad, w, 0); }), ErrorCode::CONFIG_INVALID_SETTING);
}

}  // namespace
}  // namespace bp::test
