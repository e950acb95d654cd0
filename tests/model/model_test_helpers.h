// Helpers for the transformer tests: tiny random models of each architecture, LoRA tensors,
// packed batches, and the bridge to the PyTorch oracle (tests/oracles/torch_llama.py).
#pragma once

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/lora.h"
#include "model/transformer.h"
#include "model/weight_names.h"
#include "ops/optim.h"
#include "support/test_util.h"

namespace bp::test {

struct TinySpec {
  Arch arch = Arch::Llama;
  int64_t vocab = 67, hidden = 32, inter = 48, layers = 2, heads = 4, kv_heads = 2, head_dim = 8;
  bool tied = true, bias = false, qk_norm = false, llama3_rope = false;
  float theta = 10000.0f;
  int64_t sliding_window = 0;          // on every layer, unless layer_windows says per layer (Gemma: 0 = 3)
  std::vector<int64_t> layer_windows;  // ModelConfig::layer_windows
  float attention_scale = 0.0f, attention_softcap = 0.0f;  // Gemma: attention_softcap = attn_logit_softcapping
  // More config.json keys (Phi-3's partial_rotary_factor, rope_scaling longrope, sliding_window;
  // SmolLM3's no_rope_layers): the config is then parsed from JSON by ModelConfig::from_json (the
  // four fields above are then unused: the window comes from these keys), and the oracle reads the
  // same keys (write_oracle_case).
  nlohmann::json hf = nullptr;
  // Gemma 2 / 3 (arch Gemma2 or Gemma3): config.json keys, parsed by ModelConfig::from_json.
  std::vector<std::string> layer_types;  // empty: the architecture's default pattern
  float query_pre_attn_scalar = 12.0f;   // != head_dim: the scale is not 1/sqrt(d)
  float final_softcap = 0.0f;            // final_logit_softcapping
  float linear_rope = 0.0f;              // rope_scaling linear factor (0: none)
  bool bf16 = false;                     // torch_dtype bfloat16: the embedding normalizer rounded to bf16
};

inline bool is_gemma(Arch a) {
  return a == Arch::Gemma2 || a == Arch::Gemma3;
}

// A tiny Gemma config through ModelConfig::from_json (the keys of config.json).
inline ModelConfig tiny_gemma_config(const TinySpec& s) {
  nlohmann::json j = {{"architectures", {s.arch == Arch::Gemma2 ? "Gemma2ForCausalLM" : "Gemma3ForCausalLM"}},
                      {"vocab_size", s.vocab},
                      {"hidden_size", s.hidden},
                      {"intermediate_size", s.inter},
                      {"num_hidden_layers", s.layers},
                      {"num_attention_heads", s.heads},
                      {"num_key_value_heads", s.kv_heads},
                      {"head_dim", s.head_dim},
                      {"max_position_embeddings", 128},
                      {"rms_norm_eps", 1e-5},
                      {"rope_theta", s.theta},
                      {"rope_local_base_freq", 100.0},
                      {"sliding_window", s.sliding_window > 0 ? s.sliding_window : 3},  // shorter than the samples
                      {"query_pre_attn_scalar", s.query_pre_attn_scalar},
                      {"hidden_activation", "gelu_pytorch_tanh"},
                      {"tie_word_embeddings", s.tied},
                      {"torch_dtype", s.bf16 ? "bfloat16" : "float32"}};
  j["attn_logit_softcapping"] = s.attention_softcap > 0 ? nlohmann::json(s.attention_softcap) : nlohmann::json(nullptr);
  j["final_logit_softcapping"] = s.final_softcap > 0 ? nlohmann::json(s.final_softcap) : nlohmann::json(nullptr);
  if (!s.layer_types.empty()) j["layer_types"] = s.layer_types;
  if (s.linear_rope > 0) j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.linear_rope}};
  return ModelConfig::from_json(j, "tiny gemma config");
}

inline ModelConfig tiny_config(const TinySpec& s) {
  if (is_gemma(s.arch)) return tiny_gemma_config(s);
  if (!s.hf.is_null()) {
    nlohmann::json j = s.hf;
    j["architectures"] = {arch_name(s.arch)};
    j["model_type"] = arch_info(s.arch).model_type;
    j["vocab_size"] = s.vocab;
    j["hidden_size"] = s.hidden;
    j["intermediate_size"] = s.inter;
    j["num_hidden_layers"] = s.layers;
    j["num_attention_heads"] = s.heads;
    j["num_key_value_heads"] = s.kv_heads;
    j["head_dim"] = s.head_dim;
    j["rms_norm_eps"] = 1e-5;
    j["rope_theta"] = s.theta;
    j["tie_word_embeddings"] = s.tied;
    if (!j.contains("max_position_embeddings")) j["max_position_embeddings"] = 128;
    return ModelConfig::from_json(j, "tiny config");
  }
  ModelConfig c;
  c.arch = s.arch;
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.inter;
  c.num_layers = s.layers;
  c.num_heads = s.heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.max_position_embeddings = 128;
  c.rms_norm_eps = 1e-5f;
  c.rope.head_dim = static_cast<int>(s.head_dim);
  c.rope.theta = s.theta;
  if (s.llama3_rope) {
    c.rope.llama3_scaling = true;
    c.rope.factor = 8.0f;
    c.rope.low_freq_factor = 1.0f;
    c.rope.high_freq_factor = 4.0f;
    c.rope.original_max_position = 64;  // small, so all three frequency bands occur at d = 8
  }
  c.tie_word_embeddings = s.tied;
  c.attention_bias = s.bias;
  c.qk_norm = s.qk_norm;
  c.sliding_window = s.sliding_window;
  c.layer_windows = s.layer_windows;
  c.attention_scale = s.attention_scale;
  c.attention_softcap = s.attention_softcap;
  return c;
}

// Random weights with sensible scales (linears ~ U(±1/sqrt(in)), norms ~ 1 ± 0.2).
inline ModelWeights tiny_weights(const ModelConfig& c, uint64_t seed) {
  ModelWeights w;
  w.config = c;
  auto lin = [&](int64_t out, int64_t in) {
    const float b = 1.0f / std::sqrt(static_cast<float>(in));
    return random_tensor({out, in}, seed++, -b, b);
  };
  // Gemma's norms multiply by (1 + w): w near 0 gives the same scales.
  const float nlo = 0.8f - c.norm_weight_offset, nhi = 1.2f - c.norm_weight_offset;
  auto norm = [&](int64_t n) { return random_tensor({n}, seed++, nlo, nhi); };
  const int64_t D = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  w.embed = random_tensor({c.vocab_size, D}, seed++, -1.0f, 1.0f);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights L;
    L.input_norm = norm(D);
    L.q = lin(qd, D), L.k = lin(kvd, D), L.v = lin(kvd, D), L.o = lin(D, qd);
    if (c.attention_bias) {
      L.q_bias = random_tensor({qd}, seed++, -0.2f, 0.2f);
      L.k_bias = random_tensor({kvd}, seed++, -0.2f, 0.2f);
      L.v_bias = random_tensor({kvd}, seed++, -0.2f, 0.2f);
    }
    if (c.qk_norm) L.q_norm = norm(c.head_dim), L.k_norm = norm(c.head_dim);
    L.post_norm = norm(D);
    if (c.is_moe_layer(l)) {  // the router's logits spread wide enough for decisive top-k choices
      const int64_t E = c.num_experts, Fe = c.moe_intermediate_size;
      const float bd = 1.0f / std::sqrt(static_cast<float>(D)), bf = 1.0f / std::sqrt(static_cast<float>(Fe));
      L.router = random_tensor({E, D}, seed++, -3 * bd, 3 * bd);
      L.experts_gate = random_tensor({E, Fe, D}, seed++, -bd, bd);
      L.experts_up = random_tensor({E, Fe, D}, seed++, -bd, bd);
      L.experts_down = random_tensor({E, D, Fe}, seed++, -bf, bf);
    } else {
      L.gate = lin(F, D), L.up = lin(F, D), L.down = lin(D, F);
    }
    if (c.sandwich_norms) L.pre_ffn_norm = norm(D), L.post_ffn_norm = norm(D);
    w.layers.push_back(std::move(L));
  }
  w.final_norm = norm(D);
  if (!c.tie_word_embeddings) w.lm_head = lin(c.vocab_size, D);
  return w;
}

// LoRA tensors owned by the test; B is random (not PEFT's zero init) so every gradient is non-zero.
struct TinyLora {
  std::vector<std::array<Tensor, kNumLinearRoles>> A, B, M;
  std::vector<std::array<Tensor, 3>> EA, EB;  // a sparse layer's experts' stacked A and B (gate, up, down)
  std::vector<std::array<Tensor, 3>> EM;      // DoRA: the experts' stacked magnitudes [E, out]
  std::vector<Tensor> RA, RB;                 // a sparse layer's router A [r, D] and B [E, r]
  LoraView view;
  float alpha = 8.0f;
  bool rslora = false;
  bool dora = false;
  std::vector<std::string> targets;
};

inline void make_tiny_lora(TinyLora& t, const ModelConfig& c, int64_t r, float alpha, bool rslora,
                           const std::vector<LinearRole>& roles, float dropout, uint64_t seed) {
  t.A.assign(static_cast<size_t>(c.num_layers), {});
  t.B.assign(static_cast<size_t>(c.num_layers), {});
  t.EA.assign(static_cast<size_t>(c.num_layers), {});
  t.EB.assign(static_cast<size_t>(c.num_layers), {});
  t.view = LoraView{};
  t.view.layers.resize(static_cast<size_t>(c.num_layers));
  t.view.experts.resize(static_cast<size_t>(c.num_layers));
  t.view.rank = r;
  t.view.scale = rslora ? alpha / std::sqrt(static_cast<float>(r)) : alpha / static_cast<float>(r);
  t.view.dropout = dropout;
  t.alpha = alpha;
  t.rslora = rslora;
  t.targets.clear();
  for (auto role : roles) t.targets.push_back(linear_role_name(role));
  const int64_t D = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  const int64_t outs[kNumLinearRoles] = {qd, kvd, kvd, D, F, F, D};
  const int64_t ins[kNumLinearRoles] = {D, D, D, qd, D, D, F};
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (auto role : roles) {
      const auto ri = static_cast<size_t>(role);
      const auto li = static_cast<size_t>(l);
      if (c.is_moe_layer(l) && expert_projection(static_cast<LoraTarget>(role)) >= 0) {  // every expert's A, B
        const auto p = static_cast<size_t>(expert_projection(static_cast<LoraTarget>(role)));
        const int64_t E = c.num_experts, in = p == 2 ? c.moe_intermediate_size : D,
                      out = p == 2 ? D : c.moe_intermediate_size;
        const float be = 1.0f / std::sqrt(static_cast<float>(in));
        t.EA[li][p] = random_tensor({E, r, in}, seed++, -be, be);
        t.EB[li][p] = random_tensor({E, out, r}, seed++, -0.2f, 0.2f);
        t.view.experts[li].A[p] = &t.EA[li][p];
        t.view.experts[li].B[p] = &t.EB[li][p];
        continue;
      }
      const float b = 1.0f / std::sqrt(static_cast<float>(ins[ri]));
      // A fused model (Phi-3): PEFT's qkv_proj / gate_up_proj, one A shared by the members and one B
      // [Σout, r] whose rows their B are (model/lora.h), made with the first member.
      const LoraFusedModule* f = c.fused_projections() ? lora_fused_module_of(static_cast<LoraTarget>(role)) : nullptr;
      if (f && static_cast<int>(f->first) != static_cast<int>(role)) continue;
      t.A[li][ri] = random_tensor({r, ins[ri]}, seed++, -b, b);
      if (!f) {
        t.B[li][ri] = random_tensor({outs[ri], r}, seed++, -0.2f, 0.2f);
        t.view.layers[li][ri] = {&t.A[li][ri], &t.B[li][ri]};
        continue;
      }
      int64_t rows = 0;
      for (int i = 0; i < f->count; ++i) rows += outs[ri + static_cast<size_t>(i)];
      const Tensor B = random_tensor({rows, r}, seed++, -0.2f, 0.2f);
      int64_t at = 0;
      for (int i = 0; i < f->count; ++i) {
        const size_t m = ri + static_cast<size_t>(i);
        t.A[li][m] = t.A[li][ri];
        t.B[li][m] = B.rows(at, at + outs[m]);
        at += outs[m];
        t.view.layers[li][m] = {&t.A[li][m], &t.B[li][m]};
      }
    }
}

// DoRA magnitudes for every adapted projection of `t`: random in [0.4, 1.2] (not the base rows'
// norms, so the scale m / ||W + s·B·A|| is far from 1 and every term of the formula shows).
// A fused module (its members share A: Phi-3's qkv_proj, gate_up_proj) gets one magnitude over all its
// rows, PEFT's one DoRA module, whose row views its members' are (model/lora.h).
inline void add_tiny_dora(TinyLora& t, uint64_t seed) {
  t.dora = true;
  t.M.assign(t.A.size(), {});
  for (size_t l = 0; l < t.A.size(); ++l) {
    for (size_t r = 0; r < kNumLinearRoles; ++r)
      if (t.B[l][r].defined()) t.M[l][r] = random_tensor({t.B[l][r].dim(0)}, seed++, 0.4f, 1.2f);
    for (const LoraFusedModule& f : kLoraFusedModules) {
      const auto first = static_cast<size_t>(f.first);
      if (!t.A[l][first].defined() || !same_tensor(t.A[l][first], t.A[l][first + 1])) continue;
      split_fused_rows(t.M[l], f, fused_rows_of(t.M[l], f), fused_member_rows(t.M[l], f));
    }
    for (size_t r = 0; r < kNumLinearRoles; ++r)
      if (t.M[l][r].defined()) t.view.layers[l][r].M = &t.M[l][r];
  }
  // Every expert's projection: its own magnitudes, rows of one [E, out] per projection.
  t.EM.assign(t.EB.size(), {});
  for (size_t l = 0; l < t.EB.size(); ++l)
    for (size_t p = 0; p < 3; ++p)
      if (t.EB[l][p].defined()) {
        t.EM[l][p] = random_tensor({t.EB[l][p].dim(0), t.EB[l][p].dim(1)}, seed++, 0.4f, 1.2f);
        t.view.experts[l].M[p] = &t.EM[l][p];
      }
}

// LoRA on every sparse layer's router (PEFT's mlp.gate): A [r, D], B [E, r], random (B too).
inline void add_tiny_router_lora(TinyLora& t, const ModelConfig& c, int64_t r, uint64_t seed) {
  t.RA.assign(static_cast<size_t>(c.num_layers), Tensor());
  t.RB.assign(static_cast<size_t>(c.num_layers), Tensor());
  t.view.experts.resize(static_cast<size_t>(c.num_layers));
  const float b = 1.0f / std::sqrt(static_cast<float>(c.hidden_size));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    const auto li = static_cast<size_t>(l);
    t.RA[li] = random_tensor({r, c.hidden_size}, seed++, -b, b);
    t.RB[li] = random_tensor({c.num_experts, r}, seed++, -0.5f, 0.5f);
    t.view.experts[li].router_A = &t.RA[li];
    t.view.experts[li].router_B = &t.RB[li];
  }
  t.targets.emplace_back("gate");
}

inline std::vector<LinearRole> all_roles() {
  return {LinearRole::Q,    LinearRole::K,  LinearRole::V,   LinearRole::O,
          LinearRole::Gate, LinearRole::Up, LinearRole::Down};
}

// Three packed samples (lengths 5, 7, 4): causal LM labels, the first two tokens of sample 1
// masked as a "prompt", so −100 appears inside and at the end of samples.
inline Batch tiny_batch(int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  std::vector<std::vector<int32_t>> ids(3), labels(3);
  const int lens[3] = {5, 7, 4};
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < lens[s]; ++i) ids[s].push_back(tok(rng));
    labels[s].assign(ids[s].size(), -100);
    for (size_t i = 0; i + 1 < ids[s].size(); ++i) labels[s][i] = ids[s][i + 1];
  }
  labels[1][0] = labels[1][1] = -100;
  return Batch::pack(ids, labels);
}

inline nlohmann::json vec_json(const Tensor& t) {
  auto v = t.to_vector();
  nlohmann::json j = nlohmann::json::array();
  for (float x : v) j.push_back(static_cast<int64_t>(std::lround(x)));
  return j;
}

struct OracleResult {
  double loss = 0;
  double aux_loss = -1;  // Mixture-of-Experts: load_balancing_loss_func's value (-1: none)
  int64_t n_counted = 0;
  std::vector<double> adamw_losses;
  std::map<std::string, std::vector<double>> arrays;  // "logits", "grad:<name>"
};

struct OracleAdamW {
  int steps = 0;
  float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};

// A stacked experts' tensor name ("...layers.0.mlp.experts.gate_proj[.lora_A.weight]") as each
// expert's ("...layers.0.mlp.experts.3.gate_proj[.lora_A.weight]"), for E experts.
inline std::vector<std::string> expert_names_of(const std::string& stacked, int64_t E) {
  const size_t at = stacked.find(".experts.") + 9;
  std::vector<std::string> out;
  for (int64_t e = 0; e < E; ++e) out.push_back(stacked.substr(0, at) + std::to_string(e) + "." + stacked.substr(at));
  return out;
}

// Writes the model, LoRA tensors and batch of one case for the oracle into `dir`.
inline void write_oracle_case(const std::string& dir, Model& model, const TinyLora* lora, const Batch& batch,
                              const OracleAdamW& adam) {
  std::filesystem::create_directories(dir);
  const auto& c = model.config();
  nlohmann::json spec;
  spec["config"] = {{"num_layers", c.num_layers},     {"num_heads", c.num_heads},
                    {"num_kv_heads", c.num_kv_heads}, {"head_dim", c.head_dim},
                    {"rms_norm_eps", c.rms_norm_eps}, {"rope_theta", c.rope.theta},
                    {"qk_norm", c.qk_norm},           {"tie_word_embeddings", c.tie_word_embeddings}};
  nlohmann::json windows = nlohmann::json::array();
  for (int64_t l = 0; l < c.num_layers; ++l) windows.push_back(c.attention_window(l));
  spec["config"]["layer_windows"] = windows;
  spec["config"]["attention_scale"] = c.attention_scale;
  spec["config"]["attention_softcap"] = c.attention_softcap;
  // The config.json keys of Phi-3's and SmolLM3's RoPE, as the model's config.json has them: the
  // oracle interprets them itself (partial rotary, longrope's factors and attention factor, layers
  // without RoPE).
  for (const char* key : {"model_type", "partial_rotary_factor", "max_position_embeddings",
                          "original_max_position_embeddings", "no_rope_layers", "no_rope_layer_interval"})
    if (c.raw.is_object() && c.raw.contains(key)) spec["config"][key] = c.raw[key];
  if (c.rope.longrope)
    spec["config"]["rope_scaling"] = c.raw["rope_scaling"];
  else if (c.rope.llama3_scaling)
    spec["config"]["rope_scaling"] = {{"rope_type", "llama3"},
                                      {"factor", c.rope.factor},
                                      {"low_freq_factor", c.rope.low_freq_factor},
                                      {"high_freq_factor", c.rope.high_freq_factor},
                                      {"original_max_position_embeddings", c.rope.original_max_position}};
  else
    spec["config"]["rope_scaling"] = nullptr;
  if (c.rope.linear_factor != 1.0f)
    spec["config"]["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope.linear_factor}};
  if (c.sandwich_norms) {  // Gemma: the config.json keys the oracle derives everything else from
    const nlohmann::json& r = c.raw;
    spec["config"]["hidden_size"] = c.hidden_size;
    spec["config"]["gemma"] = {{"torch_dtype", c.torch_dtype == DType::BF16 ? "bfloat16" : "float32"},
                               {"query_pre_attn_scalar", r.at("query_pre_attn_scalar")},
                               {"sliding_window", r.at("sliding_window")},
                               {"layer_types", c.to_json().at("layer_types")},
                               {"attn_logit_softcapping", r.at("attn_logit_softcapping")},
                               {"final_logit_softcapping", r.at("final_logit_softcapping")}};
    if (c.local_rope) spec["config"]["gemma"]["rope_local_base_freq"] = r.at("rope_local_base_freq");
  }
  if (c.is_moe()) {  // the sparse blocks (oracle's sparse_moe) and the aux loss's coefficient
    const MoeNaming& n = arch_info(c.arch).moe;
    spec["config"]["moe"] = {{"num_experts", c.num_experts},       {"top_k", c.num_experts_per_tok},
                             {"norm_topk_prob", c.norm_topk_prob}, {"block", n.block},
                             {"proj", {n.gate, n.up, n.down}},     {"aux_coef", model.router_aux_coef()}};
  }
  spec["mode"] = model.options().mode == TrainMode::Full ? "full" : "lora";
  std::ofstream bin(dir + "/tensors.bin", std::ios::binary);
  int64_t off = 0;
  nlohmann::json table = nlohmann::json::array();
  auto put = [&](const std::string& name, const Tensor& t) {
    auto v = t.to_vector();
    bin.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    table.push_back({{"name", name}, {"shape", t.shape().vec()}, {"offset", off}});
    off += static_cast<int64_t>(v.size());
  };
  for (auto& [name, t] : named_hf_weights(model.weights())) put(name, t);  // fused as HF stores them
  if (lora) {
    spec["lora"] = {
        {"r", lora->view.rank}, {"alpha", lora->alpha}, {"use_rslora", lora->rslora}, {"use_dora", lora->dora}};
    for (auto& p : model.trainable_parameters())
      if (p.name.find("lora_") != std::string::npos) {
        if (p.param->rank() == 3 || (p.param->rank() == 2 && p.name.find(".experts.") != std::string::npos)) {
          // the experts' stacked A or B (or DoRA magnitudes [E, out]): each expert under its PEFT name
          const std::vector<std::string> names = expert_names_of(p.name, p.param->dim(0));
          for (int64_t e = 0; e < p.param->dim(0); ++e)
            put(names[static_cast<size_t>(e)],
                p.param->rank() == 3 ? expert_matrix(*p.param, e) : p.param->rows(e, e + 1).reshape({p.param->dim(1)}));
        } else {
          put(p.name, *p.param);
        }
      }
  }
  bin.close();
  spec["tensors"] = table;
  spec["batch"] = {{"tokens", vec_json(batch.tokens)},
                   {"positions", vec_json(batch.positions)},
                   {"labels", vec_json(batch.labels)},
                   {"cu_seqlens", vec_json(batch.cu_seqlens)}};
  if (adam.steps > 0)
    spec["adamw"] = {{"steps", adam.steps}, {"lr", adam.lr},   {"beta1", adam.beta1},
                     {"beta2", adam.beta2}, {"eps", adam.eps}, {"weight_decay", adam.weight_decay}};
  std::ofstream(dir + "/spec.json") << spec.dump();
}

inline OracleResult read_oracle_result(const std::string& dir) {
  OracleResult out;
  std::ifstream rj(dir + "/result.json");
  nlohmann::json r = nlohmann::json::parse(rj);
  out.loss = r["loss"].get<double>();
  out.n_counted = r["n_counted"].get<int64_t>();
  if (r.contains("aux_loss")) out.aux_loss = r["aux_loss"].get<double>();
  if (r.contains("adamw_losses")) out.adamw_losses = r["adamw_losses"].get<std::vector<double>>();
  std::ifstream rb(dir + "/result.bin", std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(rb)), std::istreambuf_iterator<char>());
  const double* vals = reinterpret_cast<const double*>(raw.data());
  for (auto& a : r["arrays"]) {
    int64_t n = 1;
    for (auto s : a["shape"]) n *= s.get<int64_t>();
    const int64_t o = a["offset"].get<int64_t>();
    out.arrays[a["name"].get<std::string>()] = std::vector<double>(vals + o, vals + o + n);
  }
  return out;
}

// Runs the oracle once over several prepared case folders (torch starts once: it takes seconds).
// Returns false and sets *error (with the oracle's output) when python/torch is missing or fails.
inline bool run_torch_oracle(const std::vector<std::string>& case_dirs, std::string* error) {
  std::string cmd = "/usr/bin/python3 " + source_dir() + "/tests/oracles/torch_llama.py";
  for (const auto& d : case_dirs) cmd += " " + d + " " + d + "/out";
  std::string log;
  const int rc = run_command(cmd, &log);
  if (rc == 0) return true;
  *error = "The PyTorch oracle failed (exit " + std::to_string(rc) +
           "). It needs /usr/bin/python3 with torch (Debian package python3-torch). Command: " + cmd + "\nOutput:\n" +
           log;
  return false;
}

// The oracle's answers for every case of a suite, keyed by case name: each case is built
// (`build(c)` gives .model, .lora and .batch) and written under `root`, then one torch start-up runs
// them all. Empty (with *error set) when the oracle fails.
template <class Case, class BuildFn, class SettingsFn>
std::map<std::string, OracleResult> run_oracle_cases(const std::vector<Case>& cases, const std::string& root,
                                                     BuildFn build, SettingsFn settings, std::string* error) {
  std::vector<std::string> dirs;
  for (const Case& c : cases) {
    auto b = build(c);
    dirs.push_back(root + "/" + c.name);
    write_oracle_case(dirs.back(), *b.model, b.lora.get(), b.batch, settings(c));
  }
  std::map<std::string, OracleResult> results;
  if (run_torch_oracle(dirs, error))
    for (size_t i = 0; i < cases.size(); ++i) results[cases[i].name] = read_oracle_result(dirs[i] + "/out");
  return results;
}

inline std::vector<double> to_double(const Tensor& t) {
  auto v = t.to_vector();
  return {v.begin(), v.end()};
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// The parity tolerances, f32 against the oracle's f64 (parity_test.cpp states them):
inline constexpr double kParityLossRel = 1e-5;    // loss: |Δ| <= 1e-5·|loss|
inline constexpr double kParityGradOfMax = 1e-4;  // gradients: |Δ| <= 1e-4·max|ref of that tensor|
inline constexpr double kParityGradRel = 1e-3;    //                     + 1e-3·|ref|
inline constexpr Tolerance kParityLogits{1e-4, 1e-4};

// An AdamW trajectory of `ref_losses.size()` steps (our forward_backward + ops adamw_step against
// torch.optim.AdamW on the oracle): each step's loss within a bound that grows with the step,
// derived from the computation instead of one machine's rounding (CONVENTIONS.md). A step's loss is
// one more forward: kParityLossRel·|loss|. Before it, every earlier update may differ: each
// gradient is f32 sums along a chain of at most K terms (the LM head's vocab, and per layer the
// hidden, intermediate and two token sums), so it is good to a relative K·2^-24; an Adam update
// (lr·m̂/√v̂, invariant to the gradient's scale) then moves by at most lr·K·2^-24 relative, so
// parameter i by that much and, to first order, the loss by |g_i|·lr·K·2^-24. The bound adds
// lr·K·2^-24·Σ|g_i| of every earlier step (the gradients measured here); a real error (a wrong
// sign, a missing term, a step's bias correction off by one) moves the loss by lr·Σ|g_i|-sized
// amounts, thousands of times more.
inline void expect_adamw_trajectory_matches(Model& model, const Batch& batch, const OracleAdamW& adam,
                                            const std::vector<double>& ref_losses) {
  const ModelConfig& c = model.config();
  const double K = static_cast<double>(
      c.vocab_size + c.num_layers * (2 * c.hidden_size + c.intermediate_size + 2 * batch.num_tokens()));
  const double grad_rel = K * 0x1p-24;
  auto params = model.trainable_parameters();
  std::vector<Tensor> m, v;
  for (auto& p : params) {
    m.push_back(Tensor::zeros(p.param->shape()));
    v.push_back(Tensor::zeros(p.param->shape()));
  }
  const AdamWConfig cfg{adam.lr, adam.beta1, adam.beta2, adam.eps, adam.weight_decay};
  const float scale = 1.0f / static_cast<float>(batch.num_label_tokens());
  double drift = 0;  // the earlier updates' share of the bound
  for (size_t k = 0; k < ref_losses.size(); ++k) {
    const int step = static_cast<int>(k) + 1;
    model.zero_grads();
    const double loss = model.forward_backward(batch, scale, 99).mean();
    const double allowed = kParityLossRel * std::fabs(ref_losses[k]) + drift;
    EXPECT_NEAR(loss, ref_losses[k], allowed) << "step " << step << " (bound: " << kParityLossRel << "·|loss| + "
                                              << drift << " from the earlier updates, K = " << K << ")";
    double g_l1 = 0;
    for (auto& p : params)
      for (float x : p.grad->to_vector()) g_l1 += std::fabs(static_cast<double>(x));
    drift += adam.lr * grad_rel * g_l1;
    for (size_t i = 0; i < params.size(); ++i) adamw_step(*params[i].param, *params[i].grad, m[i], v[i], cfg, step);
  }
  // The trajectory must actually move (a learning rate that does nothing proves nothing).
  EXPECT_LT(ref_losses.back(), ref_losses.front() - 0.05);
}

}  // namespace bp::test
