// Whole-model parity with an independent implementation: tests/oracles/torch_llama.py (plain
// PyTorch, float64) computes loss, logits and every trainable gradient of tiny random models of
// each architecture on a packed batch of three samples; the C++ transformer (float32) must agree.
// Sliding windows (Mistral's on every layer; per-layer windows with a custom scale and soft cap)
// shorter than the samples are among the cases, and a test shows the window changes the result.
//
// Tolerances (f32 against an f64 reference, stated once here):
//   loss:       |Δ| <= 1e-5 · |loss|
//   logits:     |Δ| <= 1e-4 + 1e-4 · |ref|
//   gradients:  |Δ| <= 1e-4 · max|ref of that tensor| + 1e-3 · |ref|   (scale-aware: gradients of
//               different tensors differ by orders of magnitude)
//   AdamW:      10 steps of torch.optim.AdamW vs ops/optim adamw_step, per-step loss within a bound that
//               grows with the step from the ones above (model_test_helpers.h
//               expect_adamw_trajectory_matches)
// If /usr/bin/python3 or torch is missing these tests FAIL (never skip).
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "model/model_test_helpers.h"

namespace bp::test {
namespace {

// One parity case: a tiny model (architecture spec, mode, seeds), optional LoRA, a packed batch.
struct ParityCase {
  std::string name;
  TinySpec spec;
  TrainMode mode = TrainMode::Lora;
  bool checkpointing = true;
  int64_t lora_r = 4;
  float lora_alpha = 8.0f;
  bool rslora = false;
  std::vector<LinearRole> targets = all_roles();
  int adamw_steps = 0;
  uint64_t seed = 1;
  bool dora = false;    // DoRA magnitudes on every adapted projection
  bool router = false;  // Mixture-of-Experts: LoRA on every router too (PEFT's mlp.gate)
};

struct Built {
  std::unique_ptr<Model> model;
  std::unique_ptr<TinyLora> lora;
  Batch batch;
};

Built build(const ParityCase& pc) {
  Built b;
  ModelConfig cfg = tiny_config(pc.spec);
  b.model = std::make_unique<Model>(tiny_weights(cfg, pc.seed * 100), ModelOptions{pc.mode, pc.checkpointing});
  if (pc.mode == TrainMode::Lora) {
    b.lora = std::make_unique<TinyLora>();
    make_tiny_lora(*b.lora, cfg, pc.lora_r, pc.lora_alpha, pc.rslora, pc.targets, 0.0f, pc.seed * 100 + 50);
    if (pc.dora) add_tiny_dora(*b.lora, pc.seed * 100 + 90);
    if (pc.router) add_tiny_router_lora(*b.lora, cfg, pc.lora_r, pc.seed * 100 + 70);
    b.model->attach_lora(b.lora->view);
  }
  b.batch = tiny_batch(cfg.vocab_size, pc.seed);
  return b;
}

OracleAdamW adamw_settings(const ParityCase& pc) {
  OracleAdamW a;
  a.steps = pc.adamw_steps;
  a.lr = 1e-2f;
  a.weight_decay = 0.01f;
  return a;
}

std::vector<ParityCase> parity_cases() {
  TinySpec llama_tied;    // GQA 4/2, tied head
  TinySpec llama_untied;  // MHA, untied, llama3 rope scaling
  llama_untied.tied = false;
  llama_untied.kv_heads = 4;
  llama_untied.llama3_rope = true;
  TinySpec qwen2;  // q/k/v bias, untied, GQA 4/1
  qwen2.arch = Arch::Qwen2;
  qwen2.bias = true;
  qwen2.tied = false;
  qwen2.kv_heads = 1;
  qwen2.theta = 1000000.0f;
  TinySpec qwen3;  // q/k norm, tied, head_dim 16 so Hq·d (64) != hidden (32)
  qwen3.arch = Arch::Qwen3;
  qwen3.qk_norm = true;
  qwen3.head_dim = 16;
  // Phi-3 (Phi-4-mini's shape of RoPE): fused qkv_proj / gate_up_proj as HF stores them, partial
  // rotary 0.75 (6 of 8 dims rotate), LongRoPE with an attention factor (max 64 over original 4:
  // factor 16); the batch's positions reach 6, past the original 4: the long factors.
  TinySpec phi3_long;
  phi3_long.arch = Arch::Phi3;
  phi3_long.tied = false;
  phi3_long.hf = {
      {"partial_rotary_factor", 0.75},
      {"max_position_embeddings", 64},
      {"original_max_position_embeddings", 4},
      {"rope_scaling", {{"type", "longrope"}, {"short_factor", {1.0, 1.5, 2.5}}, {"long_factor", {1.25, 3.0, 7.5}}}}};
  // The same with original 16: positions stay inside it, the short factors (and factor 4).
  TinySpec phi3_short = phi3_long;
  phi3_short.kv_heads = 1;
  phi3_short.hf["original_max_position_embeddings"] = 16;
  // SmolLM3: every 2nd layer without RoPE (no_rope_layer_interval), and an explicit no_rope_layers.
  TinySpec smol_interval;
  smol_interval.arch = Arch::SmolLM3;
  smol_interval.layers = 3;
  smol_interval.hf = {{"no_rope_layer_interval", 2}};
  TinySpec smol_list = smol_interval;
  smol_list.layers = 2;
  smol_list.tied = false;
  smol_list.hf = {{"no_rope_layers", {0, 1}}};
  // Gemma 3: sandwich norms with (1 + w), GeGLU, q/k norms, a sliding window (3) shorter than the
  // samples on layers 0 and 2 with the local RoPE base, linear rope scaling on the global layer,
  // query_pre_attn_scalar 12 (not head_dim), the bf16 embedding normalizer.
  TinySpec gemma3;
  gemma3.arch = Arch::Gemma3;
  gemma3.layers = 3;
  gemma3.head_dim = 16;
  gemma3.layer_types = {"sliding_attention", "full_attention", "sliding_attention"};
  gemma3.linear_rope = 2.0f;
  gemma3.bf16 = true;
  // Gemma 2: both soft-caps small enough to bend this model's scores and logits, layers sliding and
  // global by the default alternation, untied head.
  TinySpec gemma2;
  gemma2.arch = Arch::Gemma2;
  gemma2.tied = false;
  gemma2.attention_softcap = 2.0f;
  gemma2.final_softcap = 3.0f;
  std::vector<ParityCase> v;
  uint64_t seed = 1;
  for (auto [name, spec] : {std::pair{"llama_tied_gqa", llama_tied}, std::pair{"llama_untied_llama3rope", llama_untied},
                            std::pair{"qwen2_bias", qwen2}, std::pair{"qwen3_qknorm", qwen3},
                            std::pair{"gemma3", gemma3}, std::pair{"gemma2_softcap", gemma2}}) {
    ParityCase lora{std::string("lora_") + name, spec};
    lora.seed = seed++;
    v.push_back(lora);
    ParityCase full{std::string("full_") + name, spec, TrainMode::Full, false};
    full.seed = seed++;
    v.push_back(full);
  }
  for (auto [name, spec] : {std::pair{"phi3_longrope_long", phi3_long}, std::pair{"phi3_longrope_short", phi3_short},
                            std::pair{"smollm3_interval", smol_interval}, std::pair{"smollm3_list", smol_list}}) {
    ParityCase lora{std::string("lora_") + name, spec};  // checkpointed
    lora.seed = seed++;
    v.push_back(lora);
    ParityCase lora_nockpt{std::string("lora_nockpt_") + name, spec, TrainMode::Lora, false};
    lora_nockpt.seed = seed++;
    v.push_back(lora_nockpt);
    ParityCase full{std::string("full_") + name, spec, TrainMode::Full, false};
    full.seed = seed++;
    v.push_back(full);
    ParityCase full_ckpt{std::string("full_ckpt_") + name, spec, TrainMode::Full, true};
    full_ckpt.seed = seed++;
    v.push_back(full_ckpt);
  }
  // Phi-3 LoRA on qkv_proj and down_proj only (PEFT's fused module alone), rsLoRA.
  ParityCase phi_subset{"lora_phi3_qkv_down",
                        phi3_short,
                        TrainMode::Lora,
                        true,
                        8,
                        16.0f,
                        true,
                        {LinearRole::Q, LinearRole::K, LinearRole::V, LinearRole::Down}};
  phi_subset.seed = seed++;
  v.push_back(phi_subset);
  // Gemma 3 the other way round: LoRA without checkpointing, full fine-tuning with it.
  ParityCase gemma3_lora_nockpt{"lora_gemma3_nockpt", gemma3, TrainMode::Lora, false};
  gemma3_lora_nockpt.seed = seed++;
  v.push_back(gemma3_lora_nockpt);
  ParityCase gemma3_full_ckpt{"full_gemma3_ckpt", gemma3, TrainMode::Full, true};
  gemma3_full_ckpt.seed = seed++;
  v.push_back(gemma3_full_ckpt);
  // rsLoRA scale and a subset of target modules (q_proj, v_proj, down_proj), no checkpointing.
  ParityCase rs{"lora_rslora_subset",
                llama_tied,
                TrainMode::Lora,
                false,
                8,
                16.0f,
                true,
                {LinearRole::Q, LinearRole::V, LinearRole::Down}};
  rs.seed = seed++;
  v.push_back(rs);
  // Mistral's sliding window (3, shorter than the samples of 5, 7 and 4 tokens) on every layer:
  // LoRA and full, with and without gradient checkpointing.
  TinySpec mistral;
  mistral.arch = Arch::Mistral;
  mistral.sliding_window = 3;
  for (const auto& [mode, ckpt] : {std::pair{TrainMode::Lora, true}, std::pair{TrainMode::Lora, false},
                                   std::pair{TrainMode::Full, true}, std::pair{TrainMode::Full, false}}) {
    ParityCase c{std::string(mode == TrainMode::Lora ? "lora" : "full") + "_mistral_window" + (ckpt ? "_ckpt" : ""),
                 mistral, mode, ckpt};
    c.seed = seed++;
    v.push_back(c);
  }
  // Phi-3's sliding_window (config.json's key, on every layer as Phi3Model's sliding-window causal
  // mask applies it) with its fused projections, partial rotary and LongRoPE.
  TinySpec phi3_window = phi3_short;
  phi3_window.hf["sliding_window"] = 3;
  for (const TrainMode mode : {TrainMode::Lora, TrainMode::Full}) {
    ParityCase c{std::string(mode == TrainMode::Lora ? "lora" : "full") + "_phi3_window", phi3_window, mode,
                 mode == TrainMode::Lora};
    c.seed = seed++;
    v.push_back(c);
  }
  // A full layer and a windowed one (window 2; as Qwen2's max_window_layers or layer_types give),
  // with a custom score scale and a soft cap (Gemma's options).
  TinySpec mixed = qwen2;
  mixed.sliding_window = 2;
  mixed.layer_windows = {0, 2};
  mixed.attention_scale = 0.6f;
  mixed.attention_softcap = 1.5f;
  for (const TrainMode mode : {TrainMode::Lora, TrainMode::Full}) {
    ParityCase c{std::string(mode == TrainMode::Lora ? "lora" : "full") + "_mixed_windows_scale_softcap", mixed, mode,
                 mode == TrainMode::Lora};
    c.seed = seed++;
    v.push_back(c);
  }
  // DoRA (PEFT's use_dora): with biases (added unscaled) and checkpointing; a target subset with
  // rsLoRA and no checkpointing; a 10-step AdamW trajectory training the magnitudes too.
  ParityCase dora{"lora_dora_qwen2_bias", qwen2};
  dora.dora = true;
  dora.seed = seed++;
  v.push_back(dora);
  ParityCase dora_rs = rs;
  dora_rs.name = "lora_dora_rslora_subset";
  dora_rs.dora = true;
  dora_rs.seed = seed++;
  v.push_back(dora_rs);
  ParityCase adam_dora{"adamw_dora", llama_tied};
  adam_dora.dora = true;
  adam_dora.adamw_steps = 10;
  adam_dora.seed = seed++;
  v.push_back(adam_dora);
  // 10-step AdamW trajectories.
  ParityCase adam_lora{"adamw_lora", llama_tied};
  adam_lora.adamw_steps = 10;
  adam_lora.seed = seed++;
  v.push_back(adam_lora);
  ParityCase adam_full{"adamw_full_qwen2", qwen2, TrainMode::Full, true};
  adam_full.adamw_steps = 10;
  adam_full.seed = seed++;
  v.push_back(adam_full);
  // DoRA on Gemma's projections: Gemma 3 (sandwich (1 + w) norms, GeGLU, windows) with checkpointing,
  // Gemma 2 (both soft-caps) without.
  ParityCase dora_gemma3{"lora_dora_gemma3", gemma3};
  dora_gemma3.dora = true;
  dora_gemma3.seed = seed++;
  v.push_back(dora_gemma3);
  ParityCase dora_gemma2{"lora_dora_gemma2_softcap_nockpt", gemma2, TrainMode::Lora, false};
  dora_gemma2.dora = true;
  dora_gemma2.seed = seed++;
  v.push_back(dora_gemma2);
  // Mixture-of-Experts: Qwen3-MoE with 4 experts, top-2 renormalised, layer 1 dense (mlp_only_layers),
  // q/k norms; Mixtral with 3 experts, top-2. Full fine-tuning (router and experts train, the aux loss
  // added with a coefficient large enough to show in the router's gradient) and LoRA on attention,
  // each with and without checkpointing.
  TinySpec qwen3_moe;
  qwen3_moe.arch = Arch::Qwen3Moe;
  qwen3_moe.layers = 3;
  qwen3_moe.tied = false;
  qwen3_moe.hf = {{"num_experts", 4},       {"num_experts_per_tok", 2}, {"moe_intermediate_size", 24},
                  {"norm_topk_prob", true}, {"mlp_only_layers", {1}},   {"router_aux_loss_coef", 0.5}};
  TinySpec mixtral;
  mixtral.arch = Arch::Mixtral;
  mixtral.inter = 24;
  mixtral.hf = {{"num_local_experts", 3}, {"num_experts_per_tok", 2}, {"router_aux_loss_coef", 0.3}};
  const std::vector<LinearRole> attention = {LinearRole::Q, LinearRole::K, LinearRole::V, LinearRole::O};
  for (auto [name, spec] : {std::pair{"qwen3_moe", qwen3_moe}, std::pair{"mixtral", mixtral}})
    for (const bool ckpt : {true, false}) {
      ParityCase full{std::string("full_") + name + (ckpt ? "_ckpt" : ""), spec, TrainMode::Full, ckpt};
      full.seed = seed++;
      v.push_back(full);
      ParityCase lora{std::string("lora_") + name + (ckpt ? "_ckpt" : ""), spec, TrainMode::Lora, ckpt};
      lora.targets = attention;
      lora.seed = seed++;
      v.push_back(lora);
      // LoRA on every expert's gate/up/down (and the dense layer's MLP) beside attention.
      ParityCase experts{std::string("lora_experts_") + name + (ckpt ? "_ckpt" : ""), spec, TrainMode::Lora, ckpt};
      experts.seed = seed++;
      v.push_back(experts);
      // PEFT's all-linear: attention, every expert and the router (the aux loss then applies, its
      // gradient reaching the router's A and B), with and without checkpointing.
      ParityCase all_linear{std::string("lora_all_linear_") + name + (ckpt ? "_ckpt" : ""), spec, TrainMode::Lora,
                            ckpt};
      all_linear.router = true;
      all_linear.seed = seed++;
      v.push_back(all_linear);
      // DoRA on attention and every expert (each expert's projection its own magnitude).
      ParityCase dora_experts{std::string("lora_dora_experts_") + name + (ckpt ? "_ckpt" : ""), spec, TrainMode::Lora,
                              ckpt};
      dora_experts.dora = true;
      dora_experts.seed = seed++;
      v.push_back(dora_experts);
    }
  // DoRA on Phi-3's fused modules (PEFT's one magnitude over qkv_proj's / gate_up_proj's rows, the
  // norm per row of the fused weight): every module with checkpointing, and qkv_proj + down_proj
  // with rsLoRA and without it; a 10-step AdamW trajectory training the fused magnitudes.
  ParityCase dora_phi3{"lora_dora_phi3", phi3_long};
  dora_phi3.dora = true;
  dora_phi3.seed = seed++;
  v.push_back(dora_phi3);
  ParityCase dora_phi3_subset = phi_subset;
  dora_phi3_subset.name = "lora_dora_phi3_qkv_down_nockpt";
  dora_phi3_subset.checkpointing = false;
  dora_phi3_subset.dora = true;
  dora_phi3_subset.seed = seed++;
  v.push_back(dora_phi3_subset);
  ParityCase adam_dora_phi3{"adamw_dora_phi3", phi3_short};
  adam_dora_phi3.dora = true;
  adam_dora_phi3.adamw_steps = 10;
  adam_dora_phi3.seed = seed++;
  v.push_back(adam_dora_phi3);
  return v;
}

// The oracle's answers for every case, computed once (one torch start-up for the whole suite).
const std::map<std::string, OracleResult>& oracle_results(std::string* error) {
  static std::string err;
  static TempDir dir;
  static const std::map<std::string, OracleResult> results =
      run_oracle_cases(parity_cases(), dir.path, build, adamw_settings, &err);
  *error = err;
  return results;
}

// The trainable gradients named as the saved files name them: LoRA's already are (a fused module
// once, with PEFT's name); full fine-tuning's per projection are joined into the fused tensors of a
// fused model (qkv_proj, gate_up_proj: their rows in HF's order), as the oracle holds them.
std::map<std::string, std::vector<double>> saved_file_grads(Model& model) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& p : model.trainable_parameters()) out[p.name] = to_double(*p.grad);
  const ModelConfig& c = model.config();
  // The stacked experts' gradients [E, ·, ·] (weights in full mode, LoRA A and B), as HF and PEFT name
  // each expert's tensor.
  for (const auto& p : model.trainable_parameters()) {
    // (DoRA's expert magnitudes [E, out] too.)
    if (p.param->rank() != 3 && !(p.param->rank() == 2 && p.name.find(".experts.") != std::string::npos)) continue;
    const std::vector<double> all = std::move(out.at(p.name));
    out.erase(p.name);
    const std::vector<std::string> names = expert_names_of(p.name, p.param->dim(0));
    const size_t per = all.size() / names.size();
    for (size_t e = 0; e < names.size(); ++e)
      out[names[e] + (p.name.find("lora_") == std::string::npos ? ".weight" : "")] = std::vector<double>(
          all.begin() + static_cast<std::ptrdiff_t>(per * e), all.begin() + static_cast<std::ptrdiff_t>(per * (e + 1)));
  }
  if (model.options().mode != TrainMode::Full || !c.fused_projections()) return out;
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (const FusedProjection& f : fused_projection_table()) {
      std::vector<double> joined;
      for (int i = 0; i < f.count; ++i) {
        const std::string member = hf_name(static_cast<WeightRole>(static_cast<int>(f.first) + i), l);
        const auto it = out.find(member);
        EXPECT_NE(it, out.end()) << member;
        if (it == out.end()) continue;
        joined.insert(joined.end(), it->second.begin(), it->second.end());
        out.erase(it);
      }
      out[fmt::format(fmt::runtime(f.hf), l)] = std::move(joined);
    }
  return out;
}

void expect_grads_close(const std::string& name, const std::vector<double>& got, const std::vector<double>& ref) {
  const double scale = max_abs(ref);
  ASSERT_GT(scale, 0.0) << name << ": the oracle's gradient is all zeros, the test would prove nothing";
  EXPECT_TRUE(all_close(got, ref, Tolerance{kParityGradOfMax * scale, kParityGradRel}))
      << name << " (max|ref| " << scale << ")";
}

// Loss, logits and every trainable gradient of one case against the oracle.
void check_case(const ParityCase& pc, const OracleResult& ref) {
  Built b = build(pc);
  Model& model = *b.model;
  ASSERT_EQ(ref.n_counted, b.batch.num_label_tokens());

  // Logits of the packed batch (per-sample attention).
  Tensor logits = model.logits(b.batch);
  EXPECT_TRUE(all_close(to_double(logits), ref.arrays.at("logits"), kParityLogits)) << "logits";

  // Loss and gradients of the mean loss (grad_scale = 1 / label tokens).
  model.zero_grads();
  const int64_t n = b.batch.num_label_tokens();
  CrossEntropyResult res = model.forward_backward(b.batch, 1.0f / static_cast<float>(n), 1234);
  EXPECT_EQ(res.n_counted, n);
  EXPECT_NEAR(res.mean(), ref.loss, kParityLossRel * std::fabs(ref.loss)) << "loss";
  // Mixture-of-Experts: the load-balancing loss (counts of the router's top-k choices over every
  // sparse layer, and mean probabilities) is the oracle's, so are the choices behind it.
  EXPECT_EQ(ref.aux_loss >= 0, model.config().is_moe());
  if (ref.aux_loss >= 0) {
    EXPECT_NEAR(model.last_aux_loss(), ref.aux_loss, kParityLossRel * ref.aux_loss) << "aux loss";
    EXPECT_GT(ref.aux_loss, 0.5);
    // The coefficient the oracle added it with is config.json's where the router trains (full
    // fine-tuning, LoRA on the router), else 0.
    const double coef =
        pc.mode == TrainMode::Full || pc.router ? model.config().raw.at("router_aux_loss_coef").get<double>() : 0.0;
    EXPECT_FLOAT_EQ(model.router_aux_coef(), static_cast<float>(coef));
  }
  const auto params = model.trainable_parameters();
  ASSERT_FALSE(params.empty());
  size_t compared = 0;
  for (const auto& [name, grad] : saved_file_grads(model)) {
    auto it = ref.arrays.find("grad:" + name);
    ASSERT_NE(it, ref.arrays.end()) << "the oracle has no gradient for " << name;
    expect_grads_close(name, grad, it->second);
    ++compared;
  }
  // Every oracle gradient was compared (nothing trainable is missing on the C++ side).
  size_t oracle_grads = 0;
  for (auto& [k, v] : ref.arrays) oracle_grads += k.rfind("grad:", 0) == 0;
  EXPECT_EQ(compared, oracle_grads);
  if (pc.mode == TrainMode::Lora) {  // one A and one B per adapted module (a fused one counts once)
    size_t modules = 0;
    for (LinearRole r : pc.targets) {
      const LoraFusedModule* f =
          model.config().fused_projections() ? lora_fused_module_of(static_cast<LoraTarget>(r)) : nullptr;
      modules += !f || static_cast<int>(f->first) == static_cast<int>(r);
    }
    const size_t magnitudes = pc.dora ? modules : 0;  // DoRA: one per module (a fused one's over its rows)
    size_t expected = (2 * modules + magnitudes) * static_cast<size_t>(model.config().num_layers);
    const ModelConfig& mc = model.config();
    for (LinearRole r : pc.targets)  // a sparse layer's MLP projection: one A and B (DoRA: M) per expert
      if (expert_projection(static_cast<LoraTarget>(r)) >= 0)
        expected += (pc.dora ? 3 : 2) * static_cast<size_t>(mc.num_moe_layers() * (mc.num_experts - 1));
    if (pc.router) expected += 2 * static_cast<size_t>(mc.num_moe_layers());  // each router's A and B
    EXPECT_EQ(compared, expected);
  }
}

// A 10-step AdamW trajectory: per-step losses of our forward_backward + adamw_step against
// torch.optim.AdamW on the oracle.
void check_trajectory(const ParityCase& c, const OracleResult& ref) {
  ASSERT_EQ(ref.adamw_losses.size(), 10u);
  Built b = build(c);
  expect_adamw_trajectory_matches(*b.model, b.batch, adamw_settings(c), ref.adamw_losses);
}

// One test for all cases: the oracle (torch start-up takes seconds) runs once per process, and
// CTest runs every TEST in its own process.
TEST(Parity, EveryArchitectureAndModeMatchesTorch) {
  std::string error;
  const auto& results = oracle_results(&error);
  ASSERT_TRUE(error.empty()) << error;
  for (const auto& pc : parity_cases()) {
    SCOPED_TRACE("case " + pc.name);
    const auto it = results.find(pc.name);
    ASSERT_NE(it, results.end());
    if (pc.adamw_steps)
      check_trajectory(pc, it->second);
    else
      check_case(pc, it->second);
  }
}

// The window is applied, not just recorded: without it the model's logits and loss differ from the
// windowed oracle's well beyond the tolerances the parity test holds them to.
TEST(Parity, SlidingWindowChangesTheResult) {
  std::string error;
  const auto& results = oracle_results(&error);
  ASSERT_TRUE(error.empty()) << error;
  for (const auto& pc : parity_cases()) {
    const bool hf_window = pc.spec.hf.is_object() && pc.spec.hf.contains("sliding_window");
    if (pc.spec.sliding_window == 0 && !hf_window) continue;
    SCOPED_TRACE("case " + pc.name);
    ParityCase unwindowed = pc;
    unwindowed.spec.sliding_window = 0;
    unwindowed.spec.layer_windows.clear();
    if (hf_window) unwindowed.spec.hf.erase("sliding_window");
    Built b = build(unwindowed);
    const OracleResult& ref = results.at(pc.name);
    EXPECT_FALSE(all_close(to_double(b.model->logits(b.batch)), ref.arrays.at("logits"), kParityLogits));
    const int64_t n = b.batch.num_label_tokens();
    const double loss = b.model->forward_backward(b.batch, 1.0f / static_cast<float>(n), 1234).mean();
    EXPECT_GT(std::fabs(loss - ref.loss), 10 * kParityLossRel * std::fabs(ref.loss));
  }
}

}  // namespace
}  // namespace bp::test
