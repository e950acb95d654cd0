// LoRA adapter in memory (DESIGN.md "LoRA"), with PEFT semantics and layout:
//   for a target projection W [out, in]:  y = x·Wᵀ + scale · (dropout(x)·Aᵀ)·Bᵀ
//   A = lora_A [r, in]  (Kaiming-uniform init with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in)))
//   B = lora_B [out, r] (zero init, so a fresh adapter leaves the model unchanged)
//   scale = alpha / r, or alpha / sqrt(r) with rsLoRA.
// One LoraLayer per transformer layer holds A/B for each of the seven projections, indexed by
// LoraTarget; `enabled[t]` says whether that projection is adapted (A/B undefined otherwise).
// DoRA (use_dora, PEFT's): each adapted projection also has a trainable magnitude m [out], initialised
// to the row norms ||W_j|| of its base weight (init_dora_magnitudes); the layer's output is
// (m / ||W + s·B·A||_row) ⊙ (x·Wᵀ + s·B·A·x) (ops/linear.h "DoRA").
// PiSSA (init_lora_weights "pissa", PEFT's pissa_init): with W = U·S·Vᵀ, A = diag(sqrt(S_r/s))·V_rᵀ and
// B = U_r·diag(sqrt(S_r/s)) (the top r singular triplets; s = the LoRA scale), and the frozen base W
// is replaced by its residual W − s·B·A, so the model is unchanged at step 0 (init_pissa). Saved as
// PEFT's PiSSA-to-LoRA conversion does (pissa_to_lora): a LoRA of rank 2r for the ORIGINAL base.
// Save/load in PEFT's files: model/peft.h. Merge into base weights: model/merge.h.
// A model that stores projections fused (Phi-3: qkv_proj, gate_up_proj) has PEFT's LoRA on the
// fused module: ONE A [r, D] and ONE B [Σout, r]. Here its members (q, k, v or gate, up) share that
// A (the same tensor) and their B are row views of the one B (rows in the fused weight's order), so
// every per-projection path (forward, merge) computes the fused module's values, and the gradient
// of the shared A is the sum over the members (model/transformer.h). Target names on such a model
// are the fused modules' ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"; q_proj etc. refused:
// LoraConfig::validate_for). DoRA and PiSSA on a fused module are PEFT's on its one Linear: one
// magnitude M [Σout] whose row views the members' M are (the norm is per row, so each member's DoRA
// over its rows is the module's), and one SVD of the fused weight [Σout, in] (the shared A and A0,
// B and B0 over all rows, the residual written into the members' rows).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/weights.h"

namespace bp {

// The seven linear projections of a Llama-family layer, in PEFT's usual order.
enum class LoraTarget : int { Q = 0, K, V, O, Gate, Up, Down };
inline constexpr int kNumLoraTargets = 7;
inline constexpr std::array<LoraTarget, kNumLoraTargets> kAllLoraTargets = {
    LoraTarget::Q, LoraTarget::K, LoraTarget::V, LoraTarget::O, LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down};

// PEFT's fused modules (on a model with fused projections): qkv_proj = q, k, v; gate_up_proj = gate, up.
struct LoraFusedModule {
  const char* name;
  LoraTarget first;
  int count;
  bool contains(LoraTarget t) const {
    return static_cast<int>(t) >= static_cast<int>(first) && static_cast<int>(t) < static_cast<int>(first) + count;
  }
};
inline constexpr std::array<LoraFusedModule, 2> kLoraFusedModules = {
    {{"qkv_proj", LoraTarget::Q, 3}, {"gate_up_proj", LoraTarget::Gate, 2}}};
const LoraFusedModule* lora_fused_module_of(LoraTarget t);  // null for o_proj, down_proj

// Whether a and b are one tensor (the same memory, shape, type and device), as a fused module's
// members' A are; compares addresses only, so it holds for device tensors too.
bool same_tensor(const Tensor& a, const Tensor& b);

// A fused module's members' tensors in `ts` (B, a DoRA magnitude: rows of one tensor) as that one
// tensor: a view where they are rows of one already, else a joined copy (model/weight_names.h
// join_rows_or_copy).
Tensor fused_rows_of(const std::array<Tensor, kNumLoraTargets>& ts, const LoraFusedModule& f);
// The members' tensors in `ts` made consecutive row views of `whole`, member i taking rows[i] rows.
void split_fused_rows(std::array<Tensor, kNumLoraTargets>& ts, const LoraFusedModule& f, const Tensor& whole,
                      const std::array<int64_t, 3>& rows);
// The members' row counts (dim 0 of their tensors in `ts`).
std::array<int64_t, 3> fused_member_rows(const std::array<Tensor, kNumLoraTargets>& ts, const LoraFusedModule& f);

// The expert projection p (0 gate, 1 up, 2 down) of a LoRA target (Gate, Up, Down), -1 for others.
inline int expert_projection(LoraTarget t) {
  return static_cast<int>(t) >= static_cast<int>(LoraTarget::Gate)
             ? static_cast<int>(t) - static_cast<int>(LoraTarget::Gate)
             : -1;
}
// The PEFT module path of expert e's projection p in layer l
// ("base_model.model.model.layers.3.mlp.experts.5.gate_proj"; Mixtral: "...block_sparse_moe.experts.5.w1").
std::string peft_expert_module(bool mixtral, int64_t layer, int64_t expert, int p);

// The Mixture-of-Experts router's PEFT target name: Qwen3-MoE's mlp.gate and Mixtral's
// block_sparse_moe.gate are nn.Linear [E, D] in transformers' per-expert layout (the one our PEFT
// names follow), so PEFT's suffix match ".gate" (and all-linear) adapts them. Not gate_proj (the MLP's).
inline constexpr const char* kLoraRouterTarget = "gate";
// The PEFT module path of layer l's router ("base_model.model.model.layers.3.mlp.gate"; Mixtral:
// "...block_sparse_moe.gate").
std::string peft_router_module(bool mixtral, int64_t layer);

// "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj".
const char* lora_target_name(LoraTarget t);
std::optional<LoraTarget> parse_lora_target(std::string_view name);
// Shape of the base weight W [out, in] this projection adapts.
int64_t lora_target_out(const ModelConfig& cfg, LoraTarget t);
int64_t lora_target_in(const ModelConfig& cfg, LoraTarget t);

// The most power iterations "pissa_niter_N" takes (PEFT suggests 4 to 16).
inline constexpr int kMaxPissaNiter = 1000;

struct LoraConfig {
  int64_t r = 16;
  float alpha = 16.0f;
  float dropout = 0.0f;  // probability in [0, 1), on the LoRA input only
  bool use_rslora = false;
  bool use_dora = false;  // DoRA: a magnitude vector per adapted projection (LoraLayer::M)
  // PEFT's init_lora_weights: "true" (Kaiming-uniform A, zero B), "pissa" (see above) or
  // "pissa_niter_N" (PiSSA from PEFT's fast SVD: torch.svd_lowrank with N power iterations).
  std::string init_lora_weights = "true";
  bool pissa() const;
  // N of "pissa_niter_N"; -1 for the full SVD ("pissa") or no PiSSA.
  int pissa_niter() const;
  // Projection names ("q_proj", ...; "qkv_proj", "gate_up_proj" on a fused model) or the single
  // entry "all-linear" (all seven).
  std::vector<std::string> target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
  // The model stores q/k/v and gate/up fused (Phi-3; set by init_lora / load_peft_adapter from the
  // model): LoRA on qkv_proj / gate_up_proj as one module each, and resolved_targets names them so.
  bool fused = false;
  // The model is the text part of a multimodal checkpoint (ModelConfig::multimodal_text; set like
  // fused): PEFT's module names on the multimodal model (model/peft.h).
  bool multimodal_text = false;
  // Mixtral (set by init_lora / load_peft_adapter from the model): its experts' PEFT names w1, w3, w2
  // stand for gate, up, down (model/weights.h); resolved_targets names them so.
  bool mixtral = false;
  // A Mixture-of-Experts model (set like mixtral): all-linear takes the router too (PEFT's all-linear
  // is every nn.Linear but the output layer), and resolved_targets names it "gate".
  bool moe = false;

  float scale() const;               // alpha / r, or alpha / sqrt(r) with rsLoRA
  bool targets(LoraTarget t) const;  // is this projection adapted?
  // Is a Mixture-of-Experts router adapted ("gate", or all-linear: on a model with a router only)?
  bool targets_router() const;
  std::vector<std::string> resolved_targets() const;  // the names, "all-linear" expanded, in enum order
  // Throws CONFIG_INVALID_SETTING for r < 1, dropout outside [0, 1), alpha <= 0, an unknown
  // target name (the message lists the known ones), an unknown init_lora_weights, or PiSSA with DoRA.
  void validate() const;
  // validate() and the names fit the model: on a fused model (ModelConfig::fused_projections)
  // q_proj, k_proj, v_proj, gate_proj and up_proj are refused (PEFT has no such modules there: use
  // qkv_proj, gate_up_proj), elsewhere qkv_proj and gate_up_proj; "gate" (the router) on a model
  // without one (its MLP's gate is gate_proj). CONFIG_INVALID_SETTING.
  void validate_for(const ModelConfig& cfg) const;
  bool operator==(const LoraConfig&) const = default;
};

struct LoraLayer {
  std::array<Tensor, kNumLoraTargets> A;  // [r, in]   (defined when enabled)
  std::array<Tensor, kNumLoraTargets> B;  // [out, r]
  std::array<Tensor, kNumLoraTargets> M;  // [out] DoRA magnitude (defined when enabled and use_dora)
  // PiSSA: the initial A and B (f32, host), for the conversion at save (pissa_to_lora).
  std::array<Tensor, kNumLoraTargets> A0, B0;
  std::array<bool, kNumLoraTargets> enabled{};
  // Mixture-of-Experts: LoRA on a sparse layer's experts (PEFT's modules mlp.experts.E.gate_proj, ...;
  // Mixtral's block_sparse_moe.experts.E.w1, ...), per projection p (0 gate, 1 up, 2 down) every
  // expert's A and B stacked like the weights: A [E, r, in], B [E, out, r] (expert_matrix gives expert
  // e's). Undefined: not adapted. A sparse layer's enabled[gate/up/down] stay false (it has no dense MLP).
  std::array<Tensor, 3> expert_A, expert_B;
  // Each expert's projection is one PEFT module: DoRA's magnitudes stacked [E, out] (row e is expert
  // e's, initialised to its own W_e's row norms), PiSSA's initial A and B stacked like A and B (each
  // expert from its own W_e's SVD).
  std::array<Tensor, 3> expert_M, expert_A0, expert_B0;
  // Mixture-of-Experts: LoRA on a sparse layer's router (PEFT's module mlp.gate; Mixtral's
  // block_sparse_moe.gate): A [r, D], B [E, r]; the router's logits get s·x·Aᵀ·Bᵀ. Undefined: not adapted.
  Tensor router_A, router_B;

  Tensor& a(LoraTarget t) { return A[static_cast<size_t>(t)]; }
  Tensor& b(LoraTarget t) { return B[static_cast<size_t>(t)]; }
  const Tensor& a(LoraTarget t) const { return A[static_cast<size_t>(t)]; }
  const Tensor& b(LoraTarget t) const { return B[static_cast<size_t>(t)]; }
  Tensor& m(LoraTarget t) { return M[static_cast<size_t>(t)]; }
  const Tensor& m(LoraTarget t) const { return M[static_cast<size_t>(t)]; }
  bool has(LoraTarget t) const { return enabled[static_cast<size_t>(t)]; }
};

struct LoraAdapter {
  LoraConfig config;
  std::vector<LoraLayer> layers;        // one per transformer layer
  std::string base_model_name_or_path;  // written to adapter_config.json

  int64_t num_parameters() const;  // elements of every A, B (and DoRA magnitude)
};

// PEFT initialisation: A Kaiming-uniform (bound 1/sqrt(in)), B zeros; f32 tensors from the CPU
// allocator. Deterministic in `seed`; each (layer, target) draws from its own stream, so enabling
// another target does not change the others' values. Validates `lora`.
// On a fused model the members of a fused module share A (drawn from the first member's stream) and
// their B are rows of one zero tensor. Validates `lora` for `cfg` (validate_for).
// With use_dora the magnitudes are left undefined: init_dora_magnitudes sets them from the base.
LoraAdapter init_lora(const ModelConfig& cfg, const LoraConfig& lora, uint64_t seed);

// Replaces every A, B and DoRA magnitude by copy(it) (to a device, to the host, a clone), keeping a fused module's
// layout: its shared A copied once, its B [Σout, r] copied as one tensor whose row views the
// members' B stay.
void copy_adapter_tensors(LoraAdapter& adapter, const std::function<Tensor(const Tensor&)>& copy);

// Row norms of a weight [out, in] of any held type (dequantized as the GEMMs read it), summed in
// double: ||W_j||, or ||W_j||² with `squared`; an f32 [out] tensor on the CPU.
Tensor weight_row_norms(const Tensor& W, bool squared);
// DoRA: every adapted projection's magnitude = the row norms of its base weight in `w` (PEFT's
// initialisation), f32 on the CPU. A no-op without use_dora.
void init_dora_magnitudes(LoraAdapter& adapter, const ModelWeights& w);

// PiSSA (a no-op unless init_lora_weights is "pissa"): A, B (and A0, B0) from the SVD of each
// adapted base weight in `w` (f64, LAPACK), and that weight replaced in place by W − s·B·A, rounded
// to its held type. A base held in a block type (q8_0, q4_K, ...) is refused
// (CONFIG_INVALID_SETTING): its residual would be quantized again.
// "pissa_niter_N": the SVD is the randomized one (ops/svd.h svd_lowrank, rank r, N power
// iterations), each (layer, projection) from its own stream of `seed`: a resumed run redoes it bit
// for bit.
void init_pissa(LoraAdapter& adapter, ModelWeights& w, uint64_t seed);

// PEFT's PiSSA-to-LoRA conversion of a PiSSA adapter (host tensors): A' = [A; A0] [2r, in],
// B' = [B, −B0] [out, 2r], r' = 2r and alpha' = 2·alpha (alpha·sqrt(2) with rsLoRA) so the scale is
// the same: s·B'·A' = s·(B·A − B0·A0), the change from the ORIGINAL base. Any other adapter is
// returned as it is.
LoraAdapter pissa_to_lora(const LoraAdapter& adapter);

}  // namespace bp
