// Transformer forward pass, batches, gradients group and trainable parameters
// (see transformer.h for the layer math; backward lives in transformer_backward.cpp).
#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <map>

#include "model/lora.h"
#include "model/transformer_acts.h"
#include "model/weight_names.h"
#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/op_checks.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"
#include "text/packing.h"

namespace bp {

namespace {

Error bad_batch(const std::string& msg) {
  return Error(ErrorCode::INPUT_VALIDATION_FAILED, "[model] " + msg);
}
}  // namespace

const char* linear_role_name(LinearRole r) {
  static const char* names[kNumLinearRoles] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                               "gate_proj", "up_proj", "down_proj"};
  return names[static_cast<int>(r)];
}

uint64_t lora_dropout_seed(uint64_t seed, int64_t layer, LinearRole role) {
  uint64_t z =
      seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(layer * kNumLinearRoles + static_cast<int>(role) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool LoraView::any() const {
  for (const auto& l : layers)
    for (const auto& m : l)
      if (m.A) return true;
  for (const auto& l : experts) {
    if (l.router_A) return true;
    for (const Tensor* A : l.A)
      if (A) return true;
  }
  return false;
}

// ---- batches ---------------------------------------------------------------------------------

int64_t Batch::num_label_tokens() const {
  if (!labels.defined()) return 0;
  std::vector<int32_t> staging;
  const int32_t* l = ops::host_ints(labels, staging);
  int64_t n = 0;
  for (int64_t i = 0; i < labels.numel(); ++i) n += l[i] != kIgnoreLabel;
  return n;
}

Batch Batch::pack(const std::vector<std::vector<int32_t>>& tokens, const std::vector<std::vector<int32_t>>& labels) {
  if (tokens.empty()) throw bad_batch("a batch needs at least one sample");
  if (tokens.size() != labels.size())
    throw bad_batch(fmt::format("{} token samples but {} label samples", tokens.size(), labels.size()));
  PackedBatch p;  // text/packing.h packs; this only checks the inputs and makes the tensors
  for (size_t s = 0; s < tokens.size(); ++s) {
    if (tokens[s].empty()) throw bad_batch(fmt::format("sample {} is empty", s));
    if (tokens[s].size() != labels[s].size())
      throw bad_batch(fmt::format("sample {} has {} tokens but {} labels", s, tokens[s].size(), labels[s].size()));
    append_sequence(p, tokens[s], labels[s], static_cast<int64_t>(s));
  }
  const int64_t T = p.num_tokens();
  Batch b;
  b.tokens = Tensor::from_vector(p.tokens, {T});
  b.positions = Tensor::from_vector(p.positions, {T});
  b.labels = Tensor::from_vector(p.labels, {T});
  b.cu_seqlens = Tensor::from_vector(p.cu_seqlens, {static_cast<int64_t>(p.cu_seqlens.size())});
  return b;
}

// A host batch goes to a device in ONE copy (each copy to a card is a synchronous cudaMemcpy that
// waits for the card's queue): its i32 tensors packed end to end, the device tensors views of the
// one upload.
Batch Batch::to(Device device) const {
  if (tokens.device() == device) return *this;
  const Tensor* parts[] = {&tokens, &positions, &labels, &cu_seqlens};
  if (tokens.device().type != DeviceType::CPU) {  // back to the host: one copy each
    auto move = [&](const Tensor& t) { return t.defined() ? t.to(device) : Tensor(); };
    return Batch{move(tokens), move(positions), move(labels), move(cu_seqlens)};
  }
  std::vector<int32_t> packed;
  for (const Tensor* t : parts)
    if (t->defined()) packed.insert(packed.end(), t->data<int32_t>(), t->data<int32_t>() + t->numel());
  const Tensor all = Tensor::from_vector(packed, {static_cast<int64_t>(packed.size())}).to(device);
  Batch out;
  Tensor* outs[] = {&out.tokens, &out.positions, &out.labels, &out.cu_seqlens};
  int64_t at = 0;
  for (size_t i = 0; i < 4; ++i) {
    if (!parts[i]->defined()) continue;
    *outs[i] = all.rows(at, at + parts[i]->numel()).reshape(parts[i]->shape());
    at += parts[i]->numel();
  }
  return out;
}

HostMirrorScope Batch::mirrored_by(const Batch& host) const {
  return HostMirrorScope({{&tokens, &host.tokens},
                          {&positions, &host.positions},
                          {&labels, &host.labels},
                          {&cu_seqlens, &host.cu_seqlens}});
}

Batch Batch::causal_lm(const std::vector<std::vector<int32_t>>& samples) {
  std::vector<std::vector<int32_t>> labels;
  for (const auto& s : samples) {
    std::vector<int32_t> l(s.size(), kIgnoreLabel);
    for (size_t i = 0; i + 1 < s.size(); ++i) l[i] = s[i + 1];
    labels.push_back(std::move(l));
  }
  return pack(samples, labels);
}

// ---- model ------------------------------------------------------------------------------------

Model::Model(ModelWeights weights, ModelOptions options) : weights_(std::move(weights)), options_(options) {
  const auto& c = weights_.config;
  BP_CHECK(static_cast<int64_t>(weights_.layers.size()) == c.num_layers, "[model] {} layers loaded, config says {}",
           weights_.layers.size(), c.num_layers);
  lora_.layers.resize(weights_.layers.size());
  lora_.experts.resize(weights_.layers.size());
  allocate_grads();
  set_matmul_dtype(options_.matmul_dtype);
  if (c.norm_weight_offset != 0.0f) norm_weight(weights_.final_norm);  // makes norm_offset_ with the weights
}

Tensor Model::norm_weight(const Tensor& w) const {
  const float offset = weights_.config.norm_weight_offset;
  if (offset == 0.0f) return w;
  const int64_t n = std::max(weights_.config.hidden_size, weights_.config.head_dim);
  if (!norm_offset_.defined() || norm_offset_.device() != w.device()) {
    norm_offset_ = Tensor::empty({n}, DType::F32, w.device());
    norm_offset_.fill(offset);
  }
  Tensor e = w.clone();
  add_inplace(e, norm_offset_.rows(0, w.numel()));
  return e;
}

const Tensor& layer_matrix(const LayerWeights& w, LinearRole role) {
  const Tensor* ws[kNumLinearRoles] = {&w.q, &w.k, &w.v, &w.o, &w.gate, &w.up, &w.down};
  return *ws[static_cast<int>(role)];
}

namespace {
// dst = bf16(src), dst (re)made beside src when it is missing or elsewhere.
void round_copy(const Tensor& src, Tensor& dst) {
  if (!dst.defined() || dst.device() != src.device() || !(dst.shape() == src.shape()))
    dst = Tensor::empty(src.shape(), DType::BF16, src.device());
  round_to_bf16(src, dst);
}
}  // namespace

void Model::set_matmul_dtype(DType dtype) {
  if (dtype != DType::F32 && dtype != DType::BF16)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[model] GEMMs of trainable matrices take f32 or bf16 inputs, not {}", dtype_name(dtype)));
  if (dtype == DType::BF16 && weights_.config.is_moe())
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[model] bf16 GEMM copies (training.matmul_dtype bf16) do not cover the experts of {} yet: "
                            "use f32",
                            weights_.config.architecture_name));
  if (dtype == DType::BF16 && options_.mode != TrainMode::Full)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                "[model] bf16 GEMM copies are for full fine-tuning: LoRA's frozen base GEMMs follow how the base is "
                "held (model.base_dtype)");
  options_.matmul_dtype = dtype;
  gemm_copies_.clear();
  head_copy_ = Tensor();
  refresh_gemm_copies();
}

void Model::refresh_gemm_copies() {
  if (options_.matmul_dtype != DType::BF16) return;
  gemm_copies_.resize(weights_.layers.size());
  for (size_t l = 0; l < weights_.layers.size(); ++l)
    for (int r = 0; r < kNumLinearRoles; ++r)
      round_copy(layer_matrix(weights_.layers[l], static_cast<LinearRole>(r)), gemm_copies_[l][static_cast<size_t>(r)]);
  round_copy(weights_.output_weight(), head_copy_);
}

const Tensor& Model::gemm_weight(int64_t layer, LinearRole role) const {
  const auto l = static_cast<size_t>(layer);
  if (l < gemm_copies_.size()) return gemm_copies_[l][static_cast<size_t>(role)];
  return layer_matrix(weights_.layers[l], role);
}

const Tensor& Model::head_gemm_weight() const {
  return head_copy_.defined() ? head_copy_ : weights_.output_weight();
}

void Model::attach_lora(const LoraView& lora) {
  const auto& c = weights_.config;
  if (static_cast<int64_t>(lora.layers.size()) != c.num_layers)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[lora] adapter has {} layers but the model has {}", lora.layers.size(), c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int r = 0; r < kNumLinearRoles; ++r) {
      const auto& m = lora.layers[static_cast<size_t>(l)][static_cast<size_t>(r)];
      if (!m.A) continue;
      const Tensor& W = layer_matrix(weights_.layers[static_cast<size_t>(l)], static_cast<LinearRole>(r));
      if (!W.defined())  // a sparse layer's MLP is its experts (no LoRA on them yet: LoraConfig::validate_for)
        throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                    fmt::format("[lora] layer {} has no {}: its MLP is {} experts", l,
                                linear_role_name(static_cast<LinearRole>(r)), c.num_experts));
      if (!m.B || m.A->rank() != 2 || m.B->rank() != 2 || m.A->dim(1) != W.dim(1) || m.B->dim(0) != W.dim(0) ||
          m.A->dim(0) != m.B->dim(1) || (m.M && m.M->shape() != Shape{W.dim(0)}))
        throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                    fmt::format("[lora] layer {} {}: A {} and B {} do not fit the weight {}", l,
                                linear_role_name(static_cast<LinearRole>(r)), m.A->shape().str(),
                                m.B ? m.B->shape().str() : "missing", W.shape().str()));
    }
  }
  for (size_t l = 0; l < lora.experts.size(); ++l)
    for (size_t p = 0; p < 3; ++p) {
      const Tensor* A = lora.experts[l].A[p];
      if (!A) continue;
      const LayerWeights& lw = weights_.layers[l];
      const Tensor& W = p == 0 ? lw.experts_gate : p == 1 ? lw.experts_up : lw.experts_down;
      const Tensor* B = lora.experts[l].B[p];
      if (!W.defined() || !B || A->rank() != 3 || B->rank() != 3 || A->dim(0) != W.dim(0) || B->dim(0) != W.dim(0) ||
          A->dim(2) != W.dim(2) || B->dim(1) != W.dim(1) || A->dim(1) != B->dim(2))
        throw Error(
            ErrorCode::INPUT_VALIDATION_FAILED,
            fmt::format(
                "[lora] layer {} experts' {}: A {} and B {} do not fit the experts {}", l,
                linear_role_name(static_cast<LinearRole>(static_cast<int>(LinearRole::Gate) + static_cast<int>(p))),
                A->shape().str(), B ? B->shape().str() : "missing", W.defined() ? W.shape().str() : "(a dense layer)"));
    }
  for (size_t l = 0; l < lora.experts.size(); ++l) {
    const Tensor* A = lora.experts[l].router_A;
    if (!A) continue;
    const Tensor& W = weights_.layers[l].router;
    const Tensor* B = lora.experts[l].router_B;
    if (!W.defined() || !B || A->rank() != 2 || B->rank() != 2 || A->dim(1) != W.dim(1) || B->dim(0) != W.dim(0) ||
        A->dim(0) != B->dim(1))
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[lora] layer {} router: A {} and B {} do not fit the router {}", l, A->shape().str(),
                              B ? B->shape().str() : "missing", W.defined() ? W.shape().str() : "(a dense layer)"));
  }
  for (size_t l = 0; l < lora.experts.size(); ++l)
    for (size_t p = 0; p < 3; ++p)
      if (const Tensor* M = lora.experts[l].M[p]; M && lora.experts[l].B[p]) {
        const Tensor* B = lora.experts[l].B[p];
        if (M->shape() != Shape{B->dim(0), B->dim(1)})
          throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                      fmt::format("[lora] layer {} experts' DoRA magnitude {} does not fit B {} ([experts, out])", l,
                                  M->shape().str(), B->shape().str()));
      }
  lora_ = lora;
  lora_.experts.resize(lora_.layers.size());
  // DoRA on experts: each frozen expert's rows' squared norms [E, out], once.
  for (size_t l = 0; l < lora_.experts.size(); ++l)
    for (size_t p = 0; p < 3; ++p) {
      LoraView::Experts& ex = lora_.experts[l];
      if (!ex.M[p] || ex.weight_norm_sq[p].defined()) continue;
      const LayerWeights& lw = weights_.layers[l];
      const Tensor& W = p == 0 ? lw.experts_gate : p == 1 ? lw.experts_up : lw.experts_down;
      Tensor norms = Tensor::empty({W.dim(0), W.dim(1)});
      for (int64_t e = 0; e < W.dim(0); ++e)
        norms.rows(e, e + 1).copy_from(weight_row_norms(expert_matrix(W, e), true).reshape({1, W.dim(1)}));
      ex.weight_norm_sq[p] = norms.to(W.device());
    }
  // DoRA: the frozen base rows' squared norms, once, beside the weight (ops/linear.h "DoRA").
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (int r = 0; r < kNumLinearRoles; ++r) {
      auto& m = lora_.layers[static_cast<size_t>(l)][static_cast<size_t>(r)];
      if (!m.M || m.weight_norm_sq.defined()) continue;
      const Tensor& W = layer_matrix(weights_.layers[static_cast<size_t>(l)], static_cast<LinearRole>(r));
      m.weight_norm_sq = weight_row_norms(W, true).to(W.device());
    }
  // Each input group's A matrices as rows of one tensor (lora_group_A), where they are not already.
  for (auto& layer : lora_.layers)
    for (const LinearInputGroup& grp : kLinearInputGroups) {
      std::vector<const Tensor*> parts;
      int64_t rows = 0;
      for (int i = 0; i < grp.count; ++i) {
        const Tensor* A = layer[static_cast<size_t>(grp.first) + static_cast<size_t>(i)].A;
        if (!A || A->dtype() != DType::F32 || A->rank() != 2) break;
        if (!parts.empty() && (!(A->device() == parts[0]->device()) || A->dim(1) != parts[0]->dim(1))) break;
        parts.push_back(A);
        rows += A->dim(0);
      }
      if (static_cast<int>(parts.size()) != grp.count || Tensor::joined_rows(parts).defined()) continue;
      bool shared = true;  // a fused module's one A: kept as it is (lora_group_shared)
      for (const Tensor* A : parts) shared = shared && same_tensor(*A, *parts[0]);
      if (shared) continue;
      Tensor all = Tensor::empty({rows, parts[0]->dim(1)}, DType::F32, parts[0]->device());
      int64_t at = 0;
      for (int i = 0; i < grp.count; ++i) {
        Tensor& A = *layer[static_cast<size_t>(grp.first) + static_cast<size_t>(i)].A;
        Tensor view = all.rows(at, at + A.dim(0));
        view.copy_from(A);
        at += A.dim(0);
        A = std::move(view);
      }
    }
  allocate_grads();
}

Tensor Model::lora_group_A(int64_t l, const LinearInputGroup& g) const {
  if (lora_group_shared(l, g)) return *lora_.layers[static_cast<size_t>(l)][static_cast<size_t>(g.first)].A;
  std::vector<const Tensor*> parts;
  for (int i = 0; i < g.count; ++i) {
    const Tensor* A = lora_.layers[static_cast<size_t>(l)][static_cast<size_t>(g.first) + static_cast<size_t>(i)].A;
    if (!A) return Tensor();
    parts.push_back(A);
  }
  return Tensor::joined_rows(parts);
}

bool Model::lora_group_shared(int64_t l, const LinearInputGroup& g) const {
  const auto& layer = lora_.layers[static_cast<size_t>(l)];
  const Tensor* first = layer[static_cast<size_t>(g.first)].A;
  if (!first || g.count < 2) return false;
  for (int i = 1; i < g.count; ++i) {
    const Tensor* A = layer[static_cast<size_t>(g.first) + static_cast<size_t>(i)].A;
    if (!A || !same_tensor(*A, *first)) return false;
  }
  return true;
}

LoraGroupDropout Model::lora_group_dropout(int64_t l, const LinearInputGroup& g, bool train, uint64_t seed) const {
  LoraGroupDropout d;
  if (!train || lora_.dropout <= 0.0f) return d;
  d.p = lora_.dropout;
  if (lora_group_shared(l, g)) {  // a fused module: one A, one mask (its first member's)
    d.members.push_back({lora_.layers[static_cast<size_t>(l)][static_cast<size_t>(g.first)].A->dim(0),
                         lora_weights(l, g.first, train, seed).dropout_seed});
    return d;
  }
  for (int i = 0; i < g.count; ++i) {
    const auto role = static_cast<LinearRole>(static_cast<int>(g.first) + i);
    const Tensor* A = lora_.layers[static_cast<size_t>(l)][static_cast<size_t>(role)].A;
    if (A) d.members.push_back({A->dim(0), lora_weights(l, role, train, seed).dropout_seed});
  }
  return d;
}

int64_t Model::lora_group_col(int64_t l, const LinearInputGroup& g, LinearRole r) const {
  int64_t col = 0;
  if (lora_group_shared(l, g)) return col;  // a fused module: every member reads the one xa
  for (int i = static_cast<int>(g.first); i < static_cast<int>(r); ++i)
    col += lora_.layers[static_cast<size_t>(l)][static_cast<size_t>(i)].A->dim(0);
  return col;
}

static_assert(kNumLoraTargets == kNumLinearRoles &&
                  static_cast<int>(LoraTarget::Down) == static_cast<int>(LinearRole::Down),
              "LoraTarget and LinearRole must list the projections in the same order");
static_assert(static_cast<int>(kLoraFusedModules[0].first) == static_cast<int>(kQkvGroup.first) &&
                  kLoraFusedModules[0].count == kQkvGroup.count &&
                  static_cast<int>(kLoraFusedModules[1].first) == static_cast<int>(kGateUpGroup.first) &&
                  kLoraFusedModules[1].count == kGateUpGroup.count,
              "PEFT's fused modules are the input groups, in the same order");

LoraView LoraView::of(LoraAdapter& adapter) {
  LoraView v;
  v.scale = adapter.config.scale();
  v.dropout = adapter.config.dropout;
  v.rank = adapter.config.r;
  v.layers.resize(adapter.layers.size());
  for (size_t l = 0; l < adapter.layers.size(); ++l)
    for (size_t r = 0; r < kNumLinearRoles; ++r) {
      auto& layer = adapter.layers[l];
      if (layer.enabled[r] && layer.A[r].defined())
        v.layers[l][r] = {&layer.A[r], &layer.B[r], layer.M[r].defined() ? &layer.M[r] : nullptr};
    }
  v.experts.resize(adapter.layers.size());
  for (size_t l = 0; l < adapter.layers.size(); ++l)
    for (size_t p = 0; p < 3; ++p)
      if (adapter.layers[l].expert_A[p].defined()) {
        v.experts[l].A[p] = &adapter.layers[l].expert_A[p];
        v.experts[l].B[p] = &adapter.layers[l].expert_B[p];
        if (adapter.layers[l].expert_M[p].defined()) v.experts[l].M[p] = &adapter.layers[l].expert_M[p];
      }
  for (size_t l = 0; l < adapter.layers.size(); ++l)
    if (adapter.layers[l].router_A.defined()) {
      v.experts[l].router_A = &adapter.layers[l].router_A;
      v.experts[l].router_B = &adapter.layers[l].router_B;
    }
  return v;
}

void Model::attach_lora(LoraAdapter& adapter) {
  attach_lora(LoraView::of(adapter));
}

const LoraWeights* Model::lora_for(int64_t layer, LinearRole role, LoraWeights* storage) const {
  *storage = lora_weights(layer, role, false, 0);
  return storage->A ? storage : nullptr;
}

LoraWeights Model::lora_weights(int64_t l, LinearRole role, bool train, uint64_t seed) const {
  LoraWeights w;
  const auto& m = lora_.layers[static_cast<size_t>(l)][static_cast<size_t>(role)];
  if (!m.A) return w;
  w.A = m.A;
  w.B = m.B;
  w.scale = lora_.scale;
  w.dropout = train ? lora_.dropout : 0.0f;
  w.training = train;
  LinearRole mask_of = role;  // a fused module's members: one dropout mask, its first member's
  for (const LinearInputGroup& g : kLinearInputGroups)
    if (g.contains(role) && lora_group_shared(l, g)) mask_of = g.first;
  w.dropout_seed = lora_dropout_seed(seed, l, mask_of);
  if (m.M) {
    w.magnitude = m.M;
    w.weight_norm_sq = &m.weight_norm_sq;
  }
  return w;
}

void Model::allocate_grads() {
  grads_ = ModelGrads{};
  grads_.layers.resize(weights_.layers.size());
  auto like = [](const Tensor& t) { return t.defined() ? Tensor::zeros(t.shape(), DType::F32, t.device()) : Tensor(); };
  if (options_.mode == TrainMode::Full) {
    grads_.embed = like(weights_.embed);
    grads_.final_norm = like(weights_.final_norm);
    if (!weights_.config.tie_word_embeddings) grads_.lm_head = like(weights_.lm_head);
    for (size_t l = 0; l < weights_.layers.size(); ++l) {
      const auto& w = weights_.layers[l];
      auto& g = grads_.layers[l].w;
      g.input_norm = like(w.input_norm);
      g.q = like(w.q), g.k = like(w.k), g.v = like(w.v), g.o = like(w.o);
      g.q_bias = like(w.q_bias), g.k_bias = like(w.k_bias), g.v_bias = like(w.v_bias);
      g.q_norm = like(w.q_norm), g.k_norm = like(w.k_norm);
      g.post_norm = like(w.post_norm);
      g.gate = like(w.gate), g.up = like(w.up), g.down = like(w.down);
      g.pre_ffn_norm = like(w.pre_ffn_norm), g.post_ffn_norm = like(w.post_ffn_norm);
      g.router = like(w.router);
      g.experts_gate = like(w.experts_gate), g.experts_up = like(w.experts_up), g.experts_down = like(w.experts_down);
    }
  } else if (options_.mode == TrainMode::Lora) {
    for (size_t l = 0; l < lora_.layers.size(); ++l) {
      auto& lg = grads_.layers[l].lora;
      // A fused module: one dA for its members (they accumulate into it: the sum), and its B's
      // gradient laid out like B, rows of one tensor.
      for (size_t gi = 0; gi < kLinearInputGroups.size(); ++gi) {
        const LinearInputGroup& grp = kLinearInputGroups[gi];
        if (!lora_group_shared(static_cast<int64_t>(l), grp)) continue;
        const Tensor& A = *lora_.layers[l][static_cast<size_t>(grp.first)].A;
        std::vector<const Tensor*> bs;
        for (int i = 0; i < grp.count; ++i) bs.push_back(lora_.layers[l][static_cast<size_t>(grp.first) + i].B);
        const Tensor B_all = Tensor::joined_rows(bs);
        if (!B_all.defined())
          throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                      fmt::format("[lora] layer {}: the members of a fused LoRA module share A but their B are not "
                                  "rows of one tensor (model/lora.h)",
                                  l));
        const Tensor dA = Tensor::zeros(A.shape(), DType::F32, A.device());
        const Tensor dB_all = Tensor::zeros(B_all.shape(), DType::F32, B_all.device());
        grads_.layers[l].fused_B[gi] = B_all;
        grads_.layers[l].fused_dB[gi] = dB_all;
        // DoRA: the module's one magnitude [Σout] (init_dora_magnitudes, load_peft_adapter lay it out so)
        std::vector<const Tensor*> ms;
        for (int i = 0; i < grp.count; ++i)
          if (const Tensor* M = lora_.layers[l][static_cast<size_t>(grp.first) + i].M) ms.push_back(M);
        const Tensor M_all = ms.size() == static_cast<size_t>(grp.count) ? Tensor::joined_rows(ms) : Tensor();
        if (!ms.empty() && !M_all.defined())
          throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                      fmt::format("[lora] layer {}: the DoRA magnitudes of a fused LoRA module are not rows of one "
                                  "tensor (model/lora.h)",
                                  l));
        const Tensor dM_all = M_all.defined() ? Tensor::zeros(M_all.shape(), DType::F32, M_all.device()) : Tensor();
        grads_.layers[l].fused_M[gi] = M_all;
        grads_.layers[l].fused_dM[gi] = dM_all;
        int64_t at = 0;
        for (int i = 0; i < grp.count; ++i) {
          const size_t r = static_cast<size_t>(grp.first) + static_cast<size_t>(i);
          const int64_t rows = bs[static_cast<size_t>(i)]->dim(0);
          lg[r].dA = dA;
          lg[r].dB = dB_all.rows(at, at + rows);
          if (dM_all.defined()) lg[r].dM = dM_all.rows(at, at + rows);
          at += rows;
        }
      }
      // A group's dA laid out like its A: rows of one tensor, for lora_group_backward's one GEMM.
      for (const LinearInputGroup& grp : kLinearInputGroups) {
        const Tensor A_all = lora_group_A(static_cast<int64_t>(l), grp);
        if (!A_all.defined() || lora_group_shared(static_cast<int64_t>(l), grp)) continue;  // shared: above
        Tensor dA_all = Tensor::zeros(A_all.shape(), DType::F32, A_all.device());
        int64_t at = 0;
        for (int i = 0; i < grp.count; ++i) {
          const size_t r = static_cast<size_t>(grp.first) + static_cast<size_t>(i);
          const int64_t rows = lora_.layers[l][r].A->dim(0);
          lg[r].dA = dA_all.rows(at, at + rows);
          at += rows;
        }
      }
      for (size_t r = 0; r < kNumLinearRoles; ++r) {
        const auto& m = lora_.layers[l][r];
        if (!m.A) continue;
        if (!lg[r].dA.defined()) lg[r].dA = Tensor::zeros(m.A->shape(), DType::F32, m.A->device());
        if (!lg[r].dB.defined()) lg[r].dB = Tensor::zeros(m.B->shape(), DType::F32, m.B->device());
        if (m.M && !lg[r].dM.defined()) lg[r].dM = Tensor::zeros(m.M->shape(), DType::F32, m.M->device());
      }
      if (l < lora_.experts.size())
        for (size_t p = 0; p < 3; ++p)
          if (const Tensor* A = lora_.experts[l].A[p]) {
            grads_.layers[l].expert_dA[p] = Tensor::zeros(A->shape(), DType::F32, A->device());
            grads_.layers[l].expert_dB[p] = Tensor::zeros(lora_.experts[l].B[p]->shape(), DType::F32, A->device());
            if (const Tensor* M = lora_.experts[l].M[p])
              grads_.layers[l].expert_dM[p] = Tensor::zeros(M->shape(), DType::F32, A->device());
          }
      if (l < lora_.experts.size())
        if (const Tensor* A = lora_.experts[l].router_A) {
          grads_.layers[l].router_dA = Tensor::zeros(A->shape(), DType::F32, A->device());
          grads_.layers[l].router_dB = Tensor::zeros(lora_.experts[l].router_B->shape(), DType::F32, A->device());
        }
    }
  }
}

namespace {
// Every base tensor with its HF name, paired with the same field of a second LayerWeights-shaped
// set (the full-mode gradients), so names are written once.
template <class Fn>
void for_each_weight(ModelWeights& w, ModelGrads* g, Fn&& fn) {
  static Tensor none;
  auto G = [&](Tensor& t) -> Tensor& { return g ? t : none; };
  fn("model.embed_tokens.weight", w.embed, g ? g->embed : none);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    auto& lw = w.layers[l];
    LayerWeights dummy;
    auto& lg = g ? g->layers[l].w : dummy;
    const std::string p = fmt::format("model.layers.{}.", l);
    fn(p + "input_layernorm.weight", lw.input_norm, G(lg.input_norm));
    fn(p + "self_attn.q_proj.weight", lw.q, G(lg.q));
    fn(p + "self_attn.k_proj.weight", lw.k, G(lg.k));
    fn(p + "self_attn.v_proj.weight", lw.v, G(lg.v));
    fn(p + "self_attn.o_proj.weight", lw.o, G(lg.o));
    fn(p + "self_attn.q_proj.bias", lw.q_bias, G(lg.q_bias));
    fn(p + "self_attn.k_proj.bias", lw.k_bias, G(lg.k_bias));
    fn(p + "self_attn.v_proj.bias", lw.v_bias, G(lg.v_bias));
    fn(p + "self_attn.q_norm.weight", lw.q_norm, G(lg.q_norm));
    fn(p + "self_attn.k_norm.weight", lw.k_norm, G(lg.k_norm));
    fn(p + "post_attention_layernorm.weight", lw.post_norm, G(lg.post_norm));
    fn(p + "pre_feedforward_layernorm.weight", lw.pre_ffn_norm, G(lg.pre_ffn_norm));
    fn(p + "mlp.gate_proj.weight", lw.gate, G(lg.gate));
    fn(p + "mlp.up_proj.weight", lw.up, G(lg.up));
    fn(p + "mlp.down_proj.weight", lw.down, G(lg.down));
    fn(p + "post_feedforward_layernorm.weight", lw.post_ffn_norm, G(lg.post_ffn_norm));
    if (lw.router.defined()) {  // a sparse layer: the router and the stacked experts (weight_names.h)
      const auto li = static_cast<int64_t>(l);
      fn(moe_router_hf_name(w.config, li), lw.router, G(lg.router));
      fn(stacked_expert_name(w.config, WeightRole::ExpertGate, li), lw.experts_gate, G(lg.experts_gate));
      fn(stacked_expert_name(w.config, WeightRole::ExpertUp, li), lw.experts_up, G(lg.experts_up));
      fn(stacked_expert_name(w.config, WeightRole::ExpertDown, li), lw.experts_down, G(lg.experts_down));
    }
  }
  fn("model.norm.weight", w.final_norm, g ? g->final_norm : none);
  fn("lm_head.weight", w.lm_head, g ? g->lm_head : none);
}
}  // namespace

std::vector<std::pair<std::string, Tensor*>> Model::named_weights() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for_each_weight(weights_, nullptr, [&](std::string name, Tensor& p, Tensor&) {
    if (p.defined()) out.emplace_back(std::move(name), &p);
  });
  return out;
}

std::vector<TrainableParam> Model::trainable_parameters() {
  std::vector<TrainableParam> out;
  auto add = [&](std::string name, Tensor& p, Tensor& g) {
    if (g.defined()) out.push_back({std::move(name), &p, &g});
  };
  if (options_.mode == TrainMode::Full) {
    for_each_weight(weights_, &grads_, add);
    // Each bf16 GEMM copy beside its master (matmul_dtype bf16), for the optimizer to rewrite.
    std::map<const Tensor*, Tensor*> copy_of;
    for (size_t l = 0; l < gemm_copies_.size(); ++l)
      for (int r = 0; r < kNumLinearRoles; ++r)
        copy_of[&layer_matrix(weights_.layers[l], static_cast<LinearRole>(r))] =
            &gemm_copies_[l][static_cast<size_t>(r)];
    if (head_copy_.defined()) copy_of[&weights_.output_weight()] = &head_copy_;
    for (TrainableParam& p : out)
      if (auto it = copy_of.find(p.param); it != copy_of.end()) p.gemm_copy = it->second;
  } else if (options_.mode == TrainMode::Lora) {
    for (size_t l = 0; l < lora_.layers.size(); ++l)
      for (size_t r = 0; r < kNumLinearRoles; ++r) {
        auto& m = lora_.layers[l][r];
        if (!m.A) continue;
        const char* module = r < 4 ? "self_attn" : "mlp";
        const auto role = static_cast<LinearRole>(r);
        int fused = -1;  // a fused module: its A and its one B, under PEFT's name, once
        for (size_t gi = 0; gi < kLinearInputGroups.size(); ++gi)
          if (kLinearInputGroups[gi].contains(role) && grads_.layers[l].fused_B[gi].defined())
            fused = static_cast<int>(gi);
        if (fused >= 0 && kLinearInputGroups[static_cast<size_t>(fused)].first != role) continue;
        const std::string p =
            fmt::format("base_model.model.model.layers.{}.{}.{}.", l, module,
                        fused >= 0 ? kLoraFusedModules[static_cast<size_t>(fused)].name : linear_role_name(role));
        add(p + "lora_A.weight", *m.A, grads_.layers[l].lora[r].dA);
        if (fused >= 0)
          add(p + "lora_B.weight", grads_.layers[l].fused_B[static_cast<size_t>(fused)],
              grads_.layers[l].fused_dB[static_cast<size_t>(fused)]);
        else
          add(p + "lora_B.weight", *m.B, grads_.layers[l].lora[r].dB);
        if (fused >= 0 && m.M)
          add(p + "lora_magnitude_vector", grads_.layers[l].fused_M[static_cast<size_t>(fused)],
              grads_.layers[l].fused_dM[static_cast<size_t>(fused)]);
        else if (m.M)
          add(p + "lora_magnitude_vector", *m.M, grads_.layers[l].lora[r].dM);
      }
    // The experts' stacked A and B (checkpoints name them so; the PEFT files per expert: model/peft.h).
    for (size_t l = 0; l < lora_.experts.size(); ++l)
      for (size_t p = 0; p < 3; ++p)
        if (Tensor* A = lora_.experts[l].A[p]) {
          const std::string name =
              "base_model.model." +
              stacked_expert_name(
                  weights_.config,
                  static_cast<WeightRole>(static_cast<int>(WeightRole::ExpertGate) + static_cast<int>(p)),
                  static_cast<int64_t>(l));
          add(name + ".lora_A.weight", *A, grads_.layers[l].expert_dA[p]);
          add(name + ".lora_B.weight", *lora_.experts[l].B[p], grads_.layers[l].expert_dB[p]);
          if (Tensor* M = lora_.experts[l].M[p])
            add(name + ".lora_magnitude_vector", *M, grads_.layers[l].expert_dM[p]);
        }
    // The routers' A and B under PEFT's module names (mlp.gate; Mixtral's block_sparse_moe.gate).
    for (size_t l = 0; l < lora_.experts.size(); ++l)
      if (Tensor* A = lora_.experts[l].router_A) {
        const std::string name = peft_router_module(weights_.config.arch == Arch::Mixtral, static_cast<int64_t>(l));
        add(name + ".lora_A.weight", *A, grads_.layers[l].router_dA);
        add(name + ".lora_B.weight", *lora_.experts[l].router_B, grads_.layers[l].router_dB);
      }
  }
  return out;
}

int64_t Model::num_trainable_parameters() const {
  int64_t n = 0;
  for (auto& p : const_cast<Model*>(this)->trainable_parameters()) n += p.param->numel();
  return n;
}

void Model::zero_grads() {
  for (auto& p : trainable_parameters()) p.grad->zero();
}

void Model::check_batch(const Batch& b) const {
  if (!b.tokens.defined() || b.tokens.rank() != 1 || b.tokens.dtype() != DType::I32 || b.tokens.dim(0) == 0)
    throw bad_batch("tokens must be a non-empty i32 [T] tensor");
  const int64_t T = b.tokens.dim(0);
  auto check_t = [&](const Tensor& t, const char* name) {
    if (!t.defined() || t.rank() != 1 || t.dtype() != DType::I32 || t.dim(0) != T)
      throw bad_batch(
          fmt::format("{} must be i32 [{}] like the tokens, got {}", name, T, t.defined() ? t.describe() : "nothing"));
  };
  check_t(b.positions, "positions");
  if (b.labels.defined()) check_t(b.labels, "labels");
  if (!b.cu_seqlens.defined() || b.cu_seqlens.rank() != 1 || b.cu_seqlens.dtype() != DType::I32 ||
      b.cu_seqlens.dim(0) < 2)
    throw bad_batch("cu_seqlens must be i32 [S+1] with S >= 1");
  std::vector<int32_t> cu_host, ids_host, lab_host, pos_host;  // the batch may live on a device
  const int32_t* cu = ops::host_ints(b.cu_seqlens, cu_host);
  const int64_t S = b.cu_seqlens.dim(0) - 1;
  if (cu[0] != 0 || cu[S] != T)
    throw bad_batch(fmt::format("cu_seqlens must run from 0 to {} tokens, got {}..{}", T, cu[0], cu[S]));
  for (int64_t s = 0; s < S; ++s)
    if (cu[s + 1] <= cu[s]) throw bad_batch(fmt::format("cu_seqlens is not increasing at sample {}", s));
  const int64_t V = weights_.config.vocab_size;
  const int32_t* ids = ops::host_ints(b.tokens, ids_host);
  for (int64_t t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= V)
      throw bad_batch(fmt::format("token id {} at position {} is outside the vocabulary of {}", ids[t], t, V));
  if (b.labels.defined()) {
    const int32_t* lab = ops::host_ints(b.labels, lab_host);
    for (int64_t t = 0; t < T; ++t)
      if (lab[t] != kIgnoreLabel && (lab[t] < 0 || lab[t] >= V))
        throw bad_batch(
            fmt::format("label {} at position {} is outside the vocabulary of {} (use -100 to ignore)", lab[t], t, V));
  }
  const int32_t* pos = ops::host_ints(b.positions, pos_host);
  for (int64_t t = 0; t < T; ++t)
    if (pos[t] < 0) throw bad_batch(fmt::format("position {} at token {} is negative", pos[t], t));
}

// ---- forward ----------------------------------------------------------------------------------

Tensor Model::forward_layer(int64_t l, const Tensor& x, const Batch& b, bool train, uint64_t seed, LayerActs* acts) {
  const auto& c = weights_.config;
  const auto& w = weights_.layers[static_cast<size_t>(l)];
  const int64_t T = x.dim(0);
  const int Hq = static_cast<int>(c.num_heads), Hkv = static_cast<int>(c.num_kv_heads);
  const int64_t d = c.head_dim;
  LayerActs local;
  LayerActs& a = acts ? *acts : local;
  auto saved = [&](LinearRole r) { return acts ? &a.lin[static_cast<size_t>(r)] : nullptr; };
  LoraWeights lw[kNumLinearRoles];
  const LoraWeights* lp[kNumLinearRoles];
  for (int r = 0; r < kNumLinearRoles; ++r) {
    lw[r] = lora_weights(l, static_cast<LinearRole>(r), train, seed);
    lp[r] = lw[r].A ? &lw[r] : nullptr;
  }
  auto opt = [](const Tensor& t) { return t.defined() ? &t : nullptr; };
  auto W = [&](LinearRole r) -> const Tensor& { return gemm_weight(l, r); };  // the bf16 copy or the weight
  // An input group's LoRA products of x in one GEMM (ops/linear.h lora_group_forward) where its A
  // matrices are joined: xa_all, whose columns its members' linear_forward read and keep.
  Tensor group_xa;
  auto group_forward = [&](const Tensor& x, const LinearInputGroup& g) {
    group_xa = Tensor();
    const Tensor A_all = lora_group_A(l, g);
    if (!A_all.defined()) return;
    const LoraGroupDropout dropout = lora_group_dropout(l, g, train, seed);
    group_xa = lora_group_forward(x, A_all, &dropout);
    for (int i = 0; i < g.count; ++i) {
      LoraWeights& m = lw[static_cast<int>(g.first) + i];
      m.group_xa = &group_xa;
      m.group_col = lora_group_col(l, g, static_cast<LinearRole>(static_cast<int>(g.first) + i));
    }
  };

  // Where the projections' GEMMs take bf16 (a card of compute capability 8.0+ over held weights or
  // bf16 GEMM copies), the norms, attention and SwiGLU write their output's bf16 copy too, which the
  // projections read instead of each rounding it (ops/linear.h x_bf16); dropped after its last GEMM,
  // except in full fine-tuning with `acts` (a backward follows), where dW's GEMMs read it again: kept
  // in `a`, and the f32 xn, hn and m it was rounded from are dropped instead, nothing else reading
  // them (attention's output stays: its backward reads o). A saving of 2 bytes per value of those
  // three, less attention output's copy: saved activations without checkpointing, one layer's
  // recompute with it.
  auto bf16_in = [&](std::initializer_list<LinearRole> roles) {
    for (LinearRole r : roles)
      if (held_gemms_read_bf16(W(r))) return true;
    return false;
  };
  Tensor x16;  // the bf16 copy of the GEMM input at hand (xn, attn, hn, then m), when made
  auto want16 = [&](std::initializer_list<LinearRole> roles) { return bf16_in(roles) ? &x16 : nullptr; };
  auto given16 = [&]() -> const Tensor* { return x16.defined() ? &x16 : nullptr; };
  const bool keep16 = acts && options_.mode == TrainMode::Full;
  auto done16 = [&](Tensor& kept, Tensor* f32) {  // after the copy's last forward GEMM
    if (keep16 && x16.defined()) {
      kept = std::move(x16);
      if (f32) *f32 = Tensor();
    }
    x16 = Tensor();
  };

  // Without `acts` (checkpointed forward, inference) each intermediate is dropped as soon as
  // nothing needs it; train/memory_plan.cpp mirrors this order.
  a.x = x;
  const bool sandwich = c.sandwich_norms;
  a.xn = rms_norm_forward(x, norm_weight(w.input_norm), c.rms_norm_eps, acts ? &a.rstd1 : nullptr,
                          want16({LinearRole::Q, LinearRole::K, LinearRole::V}));
  group_forward(a.xn, kQkvGroup);
  // q's and k's biases (Qwen2) ride in RoPE's launch (added before the rotation), except where
  // q/k norms come between the projection and RoPE (Qwen3).
  const bool bias_in_rope = !c.qk_norm;
  const Tensor* q_bias = opt(w.q_bias);
  const Tensor* k_bias = opt(w.k_bias);
  a.q = linear_forward(a.xn, W(LinearRole::Q), bias_in_rope ? nullptr : q_bias, lp[0], saved(LinearRole::Q), given16());
  a.k = linear_forward(a.xn, W(LinearRole::K), bias_in_rope ? nullptr : k_bias, lp[1], saved(LinearRole::K), given16());
  a.v = linear_forward(a.xn, W(LinearRole::V), opt(w.v_bias), lp[2], saved(LinearRole::V), given16());
  done16(a.xn16, &a.xn);
  group_xa = Tensor();  // kept by the members' LinearSaved where a backward follows
  if (c.qk_norm) {
    a.q_pre = std::move(a.q);
    a.q = rms_norm_forward(a.q_pre.reshape({T * Hq, d}), norm_weight(w.q_norm), c.rms_norm_eps,
                           acts ? &a.rstd_q : nullptr)
              .reshape({T, Hq * d});
    if (!acts) a.q_pre = Tensor();
    a.k_pre = std::move(a.k);
    a.k = rms_norm_forward(a.k_pre.reshape({T * Hkv, d}), norm_weight(w.k_norm), c.rms_norm_eps,
                           acts ? &a.rstd_k : nullptr)
              .reshape({T, Hkv * d});
    if (!acts) a.k_pre = Tensor();
  }
  rope_forward(a.q, a.k, b.positions, Hq, Hkv, c.rope_for_layer(l), bias_in_rope ? q_bias : nullptr,
               bias_in_rope ? k_bias : nullptr);
  const AttentionShape shape = c.attention_shape(l);  // the layer's window, scale, soft cap
  a.attn = attention_forward(a.q, a.k, a.v, b.cu_seqlens, shape, acts ? &a.lse : nullptr, want16({LinearRole::O}));
  if (!acts) a.q = a.k = a.v = Tensor();
  // h = x + o(attn) and out = h + down(m): the residual is the projection's GEMM's beta matrix, no add
  // (Gemma: h = x + post_norm(o(attn)), out = h + post_ffn_norm(down(m)), the norm's output plus x).
  if (sandwich) {
    a.o_out = linear_forward(a.attn, W(LinearRole::O), nullptr, lp[3], saved(LinearRole::O), given16());
    a.h = rms_norm_forward(a.o_out, norm_weight(w.post_norm), c.rms_norm_eps, acts ? &a.rstd_o : nullptr);
    add_inplace(a.h, x);
    if (!acts) a.o_out = Tensor();
  } else {
    a.h = linear_forward(a.attn, W(LinearRole::O), nullptr, lp[3], saved(LinearRole::O), given16(), &x);
  }
  done16(a.attn16, nullptr);
  if (!acts) a.attn = a.xn = Tensor();
  if (c.is_moe_layer(l)) {  // a sparse MLP (transformer_moe.cpp)
    a.hn = rms_norm_forward(a.h, norm_weight(w.post_norm), c.rms_norm_eps, acts ? &a.rstd2 : nullptr);
    Tensor out = moe_forward(l, a, acts != nullptr, train, seed);
    if (!acts) a.hn = a.h = Tensor();
    return out;
  }
  a.hn = rms_norm_forward(a.h, norm_weight(sandwich ? w.pre_ffn_norm : w.post_norm), c.rms_norm_eps,
                          acts ? &a.rstd2 : nullptr, want16({LinearRole::Gate, LinearRole::Up}));
  group_forward(a.hn, kGateUpGroup);
  a.gate = linear_forward(a.hn, W(LinearRole::Gate), nullptr, lp[4], saved(LinearRole::Gate), given16());
  a.up = linear_forward(a.hn, W(LinearRole::Up), nullptr, lp[5], saved(LinearRole::Up), given16());
  done16(a.hn16, &a.hn);
  group_xa = Tensor();
  if (!acts) a.hn = Tensor();
  a.m = c.hidden_act == GluActivation::GeluTanh ? geglu_forward(a.gate, a.up, want16({LinearRole::Down}))
                                                : swiglu_forward(a.gate, a.up, want16({LinearRole::Down}));
  if (!acts) a.gate = a.up = Tensor();
  Tensor out;
  if (sandwich) {
    a.down_out = linear_forward(a.m, W(LinearRole::Down), nullptr, lp[6], saved(LinearRole::Down), given16());
    out = rms_norm_forward(a.down_out, norm_weight(w.post_ffn_norm), c.rms_norm_eps, acts ? &a.rstd_f : nullptr);
    add_inplace(out, a.h);
    if (!acts) a.down_out = Tensor();
  } else {
    out = linear_forward(a.m, W(LinearRole::Down), nullptr, lp[6], saved(LinearRole::Down), given16(), &a.h);
  }
  done16(a.m16, &a.m);
  if (!acts) a.m = Tensor();
  return out;
}

Tensor Model::forward_trunk(const Batch& b, bool train, uint64_t seed, std::vector<Tensor>* layer_inputs,
                            std::vector<LayerActs>* acts) {
  Tensor x = embedding_forward(b.tokens, weights_.embed);
  if (config().embed_scale > 0) scale_inplace(x, config().embed_scale);  // Gemma: times sqrt(hidden_size)
  const int64_t L = config().num_layers;
  if (layer_inputs) layer_inputs->assign(static_cast<size_t>(L + 1), Tensor());
  if (acts) acts->resize(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    if (layer_inputs) (*layer_inputs)[static_cast<size_t>(l)] = x;
    x = forward_layer(l, x, b, train, seed, acts ? &(*acts)[static_cast<size_t>(l)] : nullptr);
  }
  if (layer_inputs) (*layer_inputs)[static_cast<size_t>(L)] = x;
  return x;
}

Tensor Model::hidden_states(const Batch& host_batch) {
  check_batch(host_batch);
  const Batch batch = host_batch.to(device());
  const HostMirrorScope mirror = batch.mirrored_by(host_batch);
  Tensor x = forward_trunk(batch, false, 0, nullptr, nullptr);
  return rms_norm_forward(x, norm_weight(weights_.final_norm), config().rms_norm_eps, nullptr);
}

Tensor Model::logits(const Batch& batch) {
  return lm_head_logits(hidden_states(batch), head_gemm_weight(), config().final_logit_softcap);
}

Tensor Model::logits(const Tensor& tokens, const Tensor& positions) {
  Batch b;
  b.tokens = tokens;
  b.positions = positions;
  b.cu_seqlens = Tensor::from_vector(std::vector<int32_t>{0, static_cast<int32_t>(tokens.dim(0))}, {2});
  return logits(b);
}

Model::SequenceLosses Model::sequence_losses(const Batch& batch) {
  if (!batch.labels.defined()) throw bad_batch("sequence_losses needs labels");
  Tensor xf = hidden_states(batch);
  const Tensor labels = batch.labels.to(device());
  const HostMirrorScope mirror({{&labels, &batch.labels}});
  const int32_t* cu = batch.cu_seqlens.data<int32_t>();
  SequenceLosses out;
  for (int64_t s = 0; s < batch.num_samples(); ++s) {
    const auto r =
        linear_cross_entropy_forward(xf.rows(cu[s], cu[s + 1]), head_gemm_weight(), labels.rows(cu[s], cu[s + 1]),
                                     options_.ce_chunk_tokens, config().final_logit_softcap);
    out.loss_sum.push_back(r.loss_sum);
    out.n_counted.push_back(r.n_counted);
  }
  return out;
}

void Model::set_lora_enabled(bool enabled) {
  if (enabled == lora_enabled()) return;
  if (enabled) {
    lora_ = std::move(*lora_off_);
    lora_off_.reset();
  } else {
    lora_off_ = std::move(lora_);
    lora_ = LoraView{};
    lora_.layers.resize(lora_off_->layers.size());
    lora_.experts.resize(lora_off_->layers.size());
  }
}

CrossEntropyResult Model::forward_loss(const Batch& batch) {
  if (!batch.labels.defined()) throw bad_batch("forward_loss needs labels");
  Tensor xf = hidden_states(batch);
  const Tensor labels = batch.labels.to(device());
  const HostMirrorScope mirror({{&labels, &batch.labels}});
  return linear_cross_entropy_forward(xf, head_gemm_weight(), labels, options_.ce_chunk_tokens,
                                      config().final_logit_softcap);
}

}  // namespace bp
