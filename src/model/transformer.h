// The Llama-family transformer: forward, backward and recompute over packed micro-batches
// (DESIGN.md "Model", "Batches are packed", "LoRA").
//
// One decoder layer, in Hugging Face's order (x is the layer input [T, D]):
//   xn = rms_norm(x, input_norm)
//   q, k, v = linear(xn, Wq/Wk/Wv (+bias, +LoRA))        (Qwen2: bias; Qwen3: per-head q/k norm)
//   q, k = rope(q_norm(q)), rope(k_norm(k))              positions restart per packed sample
//   a = causal_attention(q, k, v, cu_seqlens)            never across samples, GQA
//   h = x + linear(a, Wo)
//   hn = rms_norm(h, post_norm)
//   out = h + linear(swiglu(linear(hn, Wg), linear(hn, Wu)), Wd)
// Gemma 2/3 (ModelConfig's Gemma fields): the embeddings times embed_scale, every norm times
// (1 + w), the attention with its layer's window, scale and soft-cap and RoPE (local or global),
// GeGLU for SwiGLU, and sandwich norms:
//   h = x + rms_norm(linear(a, Wo), post_norm)            (post_attention_layernorm)
//   hn = rms_norm(h, pre_ffn_norm)
//   out = h + rms_norm(linear(geglu(...), Wd), post_ffn_norm)
// Then rms_norm(final_norm) and the LM head (W = lm_head, or embed when tied), which only ever
// runs inside the fused linear_cross_entropy op: full [T × V] logits are never held in training.
//
// Trainable sets: TrainMode::Lora (only LoRA A/B, frozen base weights get no gradient) or
// TrainMode::Full (every tensor: embeddings, norms, linears, biases, lm_head). With tied
// embeddings the embedding gradient is the sum of the lookup and the LM-head contributions.
//
// Gradient checkpointing (on by default): forward keeps only each layer's input; backward
// recomputes one layer at a time, so saved activations are [L+1, T, D] plus one layer's full
// set. Without it every layer's activations are kept from forward to backward.
//
// Mixture-of-Experts (Qwen3-MoE, Mixtral; ModelConfig::is_moe_layer): a sparse layer's MLP is
//   logits = hn·Wrᵀ, (ids, w) = top-k routing (ops/moe.h), hn's rows sorted by expert,
//   per expert e ONE GEMM each over its block of rows: swiglu(gate_e, up_e), down_e -> ys,
//   out = h + Σ_j w_j · ys[row of (t, j)]
// (model/transformer_moe.cpp); the load-balancing loss over all sparse layers' routing is added with
// ModelOptions::router_aux_loss_coef where the router trains. The exact bytes
// of each group are what train/memory_plan predicts; keep the two in step.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/host_mirror.h"
#include "core/tensor.h"
#include "model/weights.h"
#include "ops/cross_entropy.h"
#include "ops/linear.h"

namespace bp {

struct LoraAdapter;  // model/lora.h

// A packed micro-batch (all i32; made on the CPU, copied to the model's device by the model).
struct Batch {
  Tensor tokens;      // [T]
  Tensor positions;   // [T], restarting at 0 for each sample
  Tensor labels;      // [T], −100 = no loss; label[t] is the target predicted at position t
  Tensor cu_seqlens;  // [S+1], 0 = cu[0] < cu[1] < ... < cu[S] = T
  int64_t num_tokens() const { return tokens.defined() ? tokens.dim(0) : 0; }
  int64_t num_samples() const { return cu_seqlens.defined() ? cu_seqlens.dim(0) - 1 : 0; }
  int64_t num_label_tokens() const;  // labels != −100

  // Packs samples: each is (input ids, labels of the same length, −100 = ignore). Positions
  // restart per sample.
  static Batch pack(const std::vector<std::vector<int32_t>>& tokens, const std::vector<std::vector<int32_t>>& labels);
  // Causal LM convenience: labels[t] = ids[t+1] inside each sample, −100 at each sample's end.
  static Batch causal_lm(const std::vector<std::vector<int32_t>>& samples);
  // The same batch on `device` (itself when it is already there).
  Batch to(Device device) const;
  // While the result lives, the ops' checks of this batch (uploaded from `host` by to()) read
  // `host` instead of copying the device's values back (core/host_mirror.h): no wait for the card.
  HostMirrorScope mirrored_by(const Batch& host) const;
};

// The seven linear projections of a layer, in PEFT's naming (target_modules).
enum class LinearRole : int { Q = 0, K, V, O, Gate, Up, Down };
constexpr int kNumLinearRoles = 7;
const char* linear_role_name(LinearRole r);                          // "q_proj", ..., "down_proj"
const Tensor& layer_matrix(const LayerWeights& w, LinearRole role);  // w.q, ..., w.down

enum class TrainMode { Frozen, Lora, Full };

// The projections that read one input, consecutive in LinearRole order: q/k/v (of xn) and gate/up
// (of hn). Their LoRA A matrices are rows of one tensor (Model::attach_lora lays them out so, and
// allocate_grads their dA), so the LoRA products of that input run as one GEMM per group
// (ops/linear.h lora_group_forward, lora_group_backward) where every member has LoRA; with dropout
// one call of the dropout kernels per product, each member's mask its own.
struct LinearInputGroup {
  LinearRole first;
  int count;
  bool contains(LinearRole r) const {
    return static_cast<int>(r) >= static_cast<int>(first) && static_cast<int>(r) < static_cast<int>(first) + count;
  }
};
inline constexpr std::array<LinearInputGroup, 2> kLinearInputGroups = {{{LinearRole::Q, 3}, {LinearRole::Gate, 2}}};
inline constexpr const LinearInputGroup& kQkvGroup = kLinearInputGroups[0];
inline constexpr const LinearInputGroup& kGateUpGroup = kLinearInputGroups[1];
static_assert(kQkvGroup.first == LinearRole::Q && kQkvGroup.count == 3 && kGateUpGroup.first == LinearRole::Gate &&
              kGateUpGroup.count == 2);

// The LoRA tensors the transformer reads. The adapter object (model/lora.h) owns the tensors;
// attach it with Model::attach_lora. A/B undefined (null) = module not targeted.
struct LoraModuleView {
  Tensor* A = nullptr;               // [r, in]
  Tensor* B = nullptr;               // [out, r]
  Tensor* M = nullptr;               // [out] DoRA magnitude, or null (plain LoRA)
  Tensor weight_norm_sq = Tensor();  // DoRA: ||W_j||² of the frozen base rows [out], made by attach_lora
};
struct LoraView {
  static LoraView of(LoraAdapter& adapter);
  float scale = 1.0f;    // alpha / r, or alpha / sqrt(r) with rsLoRA
  float dropout = 0.0f;  // on the LoRA input only, training only
  int64_t rank = 0;
  std::vector<std::array<LoraModuleView, kNumLinearRoles>> layers;
  // Mixture-of-Experts: per layer, the experts' stacked A [E, r, in] and B [E, out, r] of each
  // projection (0 gate, 1 up, 2 down; model/lora.h LoraLayer::expert_A), null where not adapted;
  // and the router's A [r, D] and B [E, r] (LoraLayer::router_A), null where it is not adapted.
  struct Experts {
    std::array<Tensor*, 3> A{}, B{};
    std::array<Tensor*, 3> M{};              // DoRA: the stacked magnitudes [E, out], or null
    std::array<Tensor, 3> weight_norm_sq{};  // DoRA: ||W_e,j||² [E, out] of the frozen experts (attach_lora)
    Tensor* router_A = nullptr;
    Tensor* router_B = nullptr;
  };
  std::vector<Experts> experts;
  bool any() const;
};

// Gradients, in the same layout as the weights. Undefined tensors = not trainable.
struct LoraGradPair {
  Tensor dA, dB;
  Tensor dM;  // DoRA's magnitude
};
struct LayerGrads {
  LayerWeights w;  // full mode: same fields as the weights
  std::array<LoraGradPair, kNumLinearRoles> lora;
  // A fused LoRA module (model/lora.h: the group's members share A, their B are rows of one
  // tensor), per input group: that B and its gradient, whose row views the members' dB are (their
  // dA is one tensor too, the sum over the members). Undefined for an ordinary group.
  std::array<Tensor, kLinearInputGroups.size()> fused_B, fused_dB;
  // DoRA on a fused module: its one magnitude [Σout] (the members' M are its rows) and gradient.
  std::array<Tensor, kLinearInputGroups.size()> fused_M, fused_dM;
  // Mixture-of-Experts LoRA: the stacked experts' dA [E, r, in] and dB [E, out, r] per projection.
  std::array<Tensor, 3> expert_dA, expert_dB;
  std::array<Tensor, 3> expert_dM;  // DoRA: the stacked magnitudes' gradient [E, out]
  Tensor router_dA, router_dB;      // the router's LoRA: [r, D], [E, r]
};
struct ModelGrads {
  Tensor embed, final_norm, lm_head;
  std::vector<LayerGrads> layers;
};

// A trainable tensor with its gradient, named as in the saved file (HF name in full mode,
// PEFT name for LoRA), for optimizers, clipping and checkpoints.
struct TrainableParam {
  std::string name;
  Tensor* param = nullptr;
  Tensor* grad = nullptr;
  // The parameter's bf16 GEMM copy (ModelOptions::matmul_dtype bf16), or null: the optimizer
  // rewrites it as it writes the parameter (ops/optim.h AdamWTensors::gemm_copy). Valid until the
  // next set_matmul_dtype.
  Tensor* gemm_copy = nullptr;
};

struct ModelOptions {
  TrainMode mode = TrainMode::Lora;
  bool gradient_checkpointing = true;
  int64_t ce_chunk_tokens = kDefaultCrossEntropyChunk;
  // The input type of the GEMMs of trainable matrices (full mode; training.matmul_dtype). BF16:
  // mixed precision as Trainer(bf16=True) does it, with f32 masters, gradients and AdamW state and
  // a bf16 GEMM copy of each matrix (the seven projections of every layer and the LM head, or the
  // tied embedding as the head; norms, biases and the embedding lookup read the masters). Forward,
  // recompute, dx and the head read the copy (bf16 tensor cores on a card); dW accumulates in f32
  // into the master's gradient. The copies are derived: the optimizer's step rewrites them with the
  // masters (TrainableParam::gemm_copy), refresh_gemm_copies() after anything else writes them.
  // F32: the masters themselves (the CPU's arithmetic).
  DType matmul_dtype = DType::F32;
  // Mixture-of-Experts: the load-balancing loss's coefficient (training.router_aux_loss_coef); < 0 =
  // config.json's router_aux_loss_coef, 0 = off. Added to the loss only where the router trains (full
  // fine-tuning); Model::last_aux_loss reports the loss itself either way.
  float router_aux_loss_coef = -1.0f;
};

class Model {
 public:
  // Takes the weights (moved in). Mode Lora needs attach_lora before forward_backward.
  Model(ModelWeights weights, ModelOptions options);

  const ModelConfig& config() const { return weights_.config; }
  // Where the model's weights live (and its activations and gradients are made): the device of
  // the embedding table. A batch is copied there by the forward functions.
  Device device() const { return weights_.embed.device(); }
  ModelWeights& weights() { return weights_; }
  const ModelWeights& weights() const { return weights_; }
  ModelGrads& grads() { return grads_; }
  const ModelOptions& options() const { return options_; }
  void set_gradient_checkpointing(bool on) { options_.gradient_checkpointing = on; }
  void set_training(bool on) { training_ = on; }  // dropout on/off
  // Switches the trainable matrices' GEMMs to `dtype` (ModelOptions::matmul_dtype): BF16 makes the
  // copies from the masters where they are now, F32 frees them.
  void set_matmul_dtype(DType dtype);
  // Remakes the bf16 GEMM copies from the f32 masters (nothing with f32 GEMMs): call after anything
  // but the optimizer writes the trainable weights (restoring a checkpoint, moving the weights to
  // another device); an update through trainable_parameters()' gemm_copy rewrites them itself. One
  // rounding kernel per matrix.
  void refresh_gemm_copies();
  // The tensor the GEMMs of a layer's projection (or the LM head) read: its bf16 copy, or the weight.
  const Tensor& gemm_weight(int64_t layer, LinearRole role) const;
  const Tensor& head_gemm_weight() const;
  bool training() const { return training_; }

  // Installs LoRA tensors (owned by the caller, must outlive the model) and allocates their
  // gradients when mode is Lora. Shapes are checked against the config. The A matrices of each
  // input group (kLinearInputGroups) whose members all have LoRA are re-laid, values unchanged, as
  // consecutive rows of one tensor on their device: the caller's tensors become views of it.
  void attach_lora(const LoraView& lora);
  // The same for an adapter from model/lora.h (init_lora or loaded from PEFT files): scale,
  // dropout and targets come from its LoraConfig.
  void attach_lora(LoraAdapter& adapter);
  const LoraView& lora() const { return lora_; }

  // Allocates the gradient group of the current mode (done by the constructor / attach_lora).
  void allocate_grads();
  void zero_grads();
  std::vector<TrainableParam> trainable_parameters();
  // Every base weight with its Hugging Face name (model.layers.0.self_attn.q_proj.weight, ...).
  std::vector<std::pair<std::string, Tensor*>> named_weights();
  int64_t num_trainable_parameters() const;

  // Forward + backward of one micro-batch. Gradients accumulate (+=) scaled by grad_scale
  // (normally 1 / label tokens of the whole optimizer step). Returns the micro-batch's summed
  // loss and label count. dropout_seed makes LoRA dropout masks reproducible.
  CrossEntropyResult forward_backward(const Batch& batch, float grad_scale, uint64_t dropout_seed);
  // Loss only, dropout off (evaluation).
  CrossEntropyResult forward_loss(const Batch& batch);

  // Per-sequence losses (preference methods, train/preference.h): for each sample s of a packed
  // batch, the summed cross-entropy of its counted tokens (−π, π = the completion's summed
  // log-probability) and their count.
  struct SequenceLosses {
    std::vector<double> loss_sum;
    std::vector<int64_t> n_counted;
  };
  // Given the forward's SequenceLosses, d(loss)/d(loss_sum[s]) for every sequence s.
  using SequenceGradFn = std::function<std::vector<float>(const SequenceLosses&)>;
  // Forward only, dropout off: each sequence's loss (reference and KL passes, evaluation).
  SequenceLosses sequence_losses(const Batch& batch);
  // Forward + backward of a loss that is a function of the sequences' losses: `grad_of` is called
  // once, between the forward and the backward, and gradients accumulate (+=) as if each
  // sequence's tokens had grad_scale = grad_of(...)[s]. A frozen head costs no extra pass (each
  // sequence's dx is computed at scale 1, then scaled); a trainable head is run forward once
  // more per sequence (its dW needs the scale while it is summed).
  SequenceLosses forward_backward_sequences(const Batch& batch, const SequenceGradFn& grad_of, uint64_t dropout_seed);
  // Switches the attached LoRA adapter off (the preference methods' reference: the frozen base)
  // and on again; off, every pass runs the base weights alone.
  void set_lora_enabled(bool enabled);
  bool lora_enabled() const { return !lora_off_.has_value(); }
  // Full logits [T, V] (tests, generation prefill). positions i32 [T]; one causal sample.
  Tensor logits(const Tensor& tokens, const Tensor& positions);
  // Full logits of a packed batch (per-sample attention).
  Tensor logits(const Batch& batch);
  // Final hidden states after final_norm [T, D].
  Tensor hidden_states(const Batch& batch);

  // The weight an RMSNorm of this model multiplies by: w itself, or (norm_weight_offset + w) in f32
  // (Gemma's (1 + w), as HF computes it), made for the call. Its gradient is w's.
  Tensor norm_weight(const Tensor& w) const;

  // Mixture-of-Experts: the load-balancing loss (ops/moe.h) of the last training pass's forward over
  // every sparse layer's tokens (0 for a dense model), and the coefficient it enters the loss with
  // (0 where the router is frozen or the setting is 0).
  double last_aux_loss() const { return moe_aux_.loss; }
  float router_aux_coef() const;
  // Does a router train (full fine-tuning, or LoRA on a router)? The aux loss applies only then.
  bool router_trains() const;

  // Used by generation: a sparse layer's MLP for inference (no dropout, nothing kept): h + the
  // experts' weighted sum of hn = rms_norm(h) (Mixture-of-Experts, transformer_moe.cpp).
  Tensor sparse_mlp(int64_t layer, const Tensor& h, const Tensor& hn) const;

  // Used by generation: the layer's LoRA for inference (dropout off).
  const LoraWeights* lora_for(int64_t layer, LinearRole role, LoraWeights* storage) const;

 private:
  struct LayerActs;
  Tensor forward_layer(int64_t l, const Tensor& x, const Batch& b, bool train, uint64_t seed, LayerActs* acts);
  // Consumes dout: its buffer is reused for the layer's dx (transformer_backward.cpp). dout16: on
  // entry dout's bf16 copy (undefined: none), on return the returned dx's, made when layer l−1's
  // down projection reads bf16 (ops/linear.h dy_bf16).
  Tensor backward_layer(int64_t l, Tensor dout, Tensor& dout16, const Batch& b, uint64_t seed, LayerActs& acts);
  // Whether layer l's down projection reads a bf16 copy of its dy (false for l < 0: no such layer).
  bool down_reads_bf16(int64_t l) const;
  Tensor forward_trunk(const Batch& b, bool train, uint64_t seed, std::vector<Tensor>* layer_inputs,
                       std::vector<LayerActs>* acts);
  LoraWeights lora_weights(int64_t l, LinearRole role, bool train, uint64_t seed) const;
  // Layer l's group's A matrices as one tensor [Σr, in] (Tensor::joined_rows) when every member has
  // LoRA (a fused module: its one A [r, in]); undefined otherwise: each projection runs its LoRA
  // products alone.
  Tensor lora_group_A(int64_t l, const LinearInputGroup& g) const;
  // The group's dropout in this pass (train with lora.dropout > 0): each member's rows and mask
  // seed (lora_weights' dropout_seed), for lora_group_forward / lora_group_backward; p = 0 and no
  // members otherwise.
  LoraGroupDropout lora_group_dropout(int64_t l, const LinearInputGroup& g, bool train, uint64_t seed) const;
  // Whether layer l's group is a fused LoRA module (model/lora.h): every member has LoRA and they
  // share one A (the same tensor). Its group products then run on that A: one xa = x·Aᵀ [T, r] whose
  // columns every member reads (group_col 0), the members' dxa summed into one [T, r]
  // (LoraWeights::group_dxa_accumulate), then one dA and one dx term (lora_group_backward): the
  // shared A's gradient is the sum over the members; one dropout mask (the first member's) for all,
  // PEFT's one module.
  bool lora_group_shared(int64_t l, const LinearInputGroup& g) const;
  // Member r's first column in its group's xa and dxa [T, Σr]: the ranks of the members before it.
  int64_t lora_group_col(int64_t l, const LinearInputGroup& g, LinearRole r) const;
  void check_batch(const Batch& b) const;
  // A sparse layer's MLP (model/transformer_moe.cpp): out = h + Σ_j w_j · expert_j(hn), keeping its
  // activations in `a` when `keep`; backward writes dhn (=) and the experts' and router's gradients.
  Tensor moe_forward(int64_t l, LayerActs& a, bool keep, bool train, uint64_t seed) const;
  void moe_backward(int64_t l, const Tensor& dout, LayerActs& a, Tensor& dhn, uint64_t seed);
  // Expert e's LoRA of projection p (0 gate, 1 up, 2 down) of layer l: its views of the stacked A, B
  // (and DoRA's magnitude and base norms) and the LoraWeights over them, in `out`; null where the
  // experts are not adapted.
  struct ExpertLora {
    Tensor A, B, M, norm_sq;
    LoraWeights w;
  };
  const LoraWeights* expert_lora(int64_t l, int p, int64_t e, bool train, uint64_t seed, ExpertLora& out) const;
  // Layer l's router LoRA (in lw), null where the router is not adapted.
  const LoraWeights* router_lora(int64_t l, bool train, uint64_t seed, LoraWeights& lw) const;

  // The step after the trunk's forward: the final norm's output xf, the device labels and dxf to
  // fill; the head's dW (null: frozen). Returns the loss (forward_backward's or the sequences').
  using HeadStep = std::function<CrossEntropyResult(const Tensor& xf, const Tensor& labels, Tensor& dxf, Tensor* dW)>;
  CrossEntropyResult train_pass(const Batch& host_batch, uint64_t dropout_seed, const HeadStep& head);

  ModelWeights weights_;
  ModelOptions options_;
  LoraView lora_;
  std::optional<LoraView> lora_off_;  // set_lora_enabled(false): the adapter, parked here
  ModelGrads grads_;
  bool training_ = true;
  // matmul_dtype BF16: the copies, [layer][role] and the head's (undefined with f32 GEMMs).
  std::vector<std::array<Tensor, kNumLinearRoles>> gemm_copies_;
  Tensor head_copy_;
  // norm_weight_offset in every element, [max(hidden_size, head_dim)] on the weights' device: made by
  // the constructor (the memory plan counts it with the weights), again where the weights move.
  mutable Tensor norm_offset_;
  // The load-balancing loss over one training pass: its statistics gathered by the first forward of
  // every sparse layer (not by a checkpointed recompute), then its gradient per expert for the
  // backward (scaled by the coefficient and the micro-batch's share of the step: aux_scale).
  struct MoeAux {
    bool collect = false;
    Tensor counts, prob_sum;  // [E]
    int64_t tokens = 0;
    Tensor grad;  // [E], undefined: no aux gradient
    double loss = 0.0;
    float scale = 1.0f;
  };
  mutable MoeAux moe_aux_;  // the forward (a const pass at inference) gathers into it only while collect
};

}  // namespace bp
