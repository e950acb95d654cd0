// The sparse Mixture-of-Experts MLP of a layer (Qwen3-MoE, Mixtral; see transformer.h and ops/moe.h).
//
// Forward: the router's logits [T, E] (an f32 GEMM), top-k routing, the counting sort of the T·k
// assignments by expert, hn's rows gathered into that order (xs), then per expert e ONE GEMM for
// gate and one for up over its contiguous block of xs rows (the block is a row view: no per-token
// GEMMs, no copies of the inputs), SwiGLU over all T·k rows at once, one GEMM per expert for down,
// and the weighted scatter-add onto the residual h. Expert e's matrices are views of the stacked
// [E, out, in] tensors (weights.h expert_matrix), so held (bf16, q8_0, q4_K) experts are read as the
// dense path reads its held projections. The load-balancing loss's statistics are gathered here on
// the pass's first forward (Model::MoeAux).
// Backward: the scatter's (dys, dweights), per expert down's then gate's and up's linear_backward
// (dx into rows of one [T·k, ·] tensor, dW into the expert's slab of the stacked gradient), the
// gather's (dhn), and the routing's through the router (dlogits, plus the aux loss's gradient), whose
// dx adds into dhn: the router's gradient reaches hn even where the router is frozen (LoRA).
#include "model/transformer.h"
#include "model/transformer_acts.h"
#include "ops/moe.h"
#include "ops/swiglu.h"

namespace bp {

const LoraWeights* Model::expert_lora(int64_t l, int p, int64_t e, bool train, uint64_t seed, ExpertLora& out) const {
  if (static_cast<size_t>(l) >= lora_.experts.size()) return nullptr;
  const LoraView::Experts& ex = lora_.experts[static_cast<size_t>(l)];
  const auto pi = static_cast<size_t>(p);
  if (!ex.A[pi]) return nullptr;
  out.A = expert_matrix(*ex.A[pi], e);
  out.B = expert_matrix(*ex.B[pi], e);
  LoraWeights& lw = out.w;
  lw = LoraWeights{};
  lw.A = &out.A;
  lw.B = &out.B;
  lw.scale = lora_.scale;
  lw.dropout = train ? lora_.dropout : 0.0f;
  lw.training = train;
  // Each expert's own mask (PEFT: one dropout module per expert's projection), the same in a recompute.
  lw.dropout_seed = lora_dropout_seed(seed ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(e + 1)), l,
                                      static_cast<LinearRole>(static_cast<int>(LinearRole::Gate) + p));
  if (ex.M[pi]) {  // DoRA: expert e's magnitude and base row norms, rows of the stacked [E, out]
    const int64_t rows = ex.M[pi]->dim(1);
    out.M = ex.M[pi]->rows(e, e + 1).reshape({rows});
    out.norm_sq = ex.weight_norm_sq[pi].rows(e, e + 1).reshape({rows});
    lw.magnitude = &out.M;
    lw.weight_norm_sq = &out.norm_sq;
  }
  return &lw;
}

const LoraWeights* Model::router_lora(int64_t l, bool train, uint64_t seed, LoraWeights& lw) const {
  if (static_cast<size_t>(l) >= lora_.experts.size()) return nullptr;
  const LoraView::Experts& ex = lora_.experts[static_cast<size_t>(l)];
  if (!ex.router_A) return nullptr;
  lw = LoraWeights{};
  lw.A = ex.router_A;
  lw.B = ex.router_B;
  lw.scale = lora_.scale;
  lw.dropout = train ? lora_.dropout : 0.0f;
  lw.training = train;
  // The router's own mask (PEFT: mlp.gate's dropout module), the same in a recompute.
  lw.dropout_seed = lora_dropout_seed(seed ^ 0x94D049BB133111EBull, l, LinearRole::Gate);
  return &lw;
}

bool Model::router_trains() const {
  if (options_.mode == TrainMode::Full) return true;
  for (const LoraView::Experts& ex : lora_.experts)
    if (ex.router_A) return true;
  return false;
}

float Model::router_aux_coef() const {
  const ModelConfig& c = weights_.config;
  if (!c.is_moe() || !router_trains()) return 0.0f;
  return options_.router_aux_loss_coef < 0 ? c.router_aux_loss_coef : options_.router_aux_loss_coef;
}

Tensor Model::sparse_mlp(int64_t layer, const Tensor& h, const Tensor& hn) const {
  LayerActs a;
  a.h = h;
  a.hn = hn;
  return moe_forward(layer, a, false, false, 0);
}

Tensor Model::moe_forward(int64_t l, LayerActs& a, bool keep, bool train, uint64_t seed) const {
  const ModelConfig& c = weights_.config;
  const LayerWeights& w = weights_.layers[static_cast<size_t>(l)];
  const int64_t E = c.num_experts, k = c.num_experts_per_tok, Fe = c.moe_intermediate_size, D = c.hidden_size;
  const Device dev = device();
  LoraWeights rlw;  // the router's LoRA (when adapted): logits += s·dropout(hn)·Aᵀ·Bᵀ
  Tensor logits =
      linear_forward(a.hn, w.router, nullptr, router_lora(l, train, seed, rlw), keep ? &a.router_lin : nullptr);
  MoeRouting routing = moe_route_forward(logits, k, c.norm_topk_prob);
  if (moe_aux_.collect) {
    moe_aux_accumulate(logits, routing.expert_ids, moe_aux_.counts, moe_aux_.prob_sum);
    moe_aux_.tokens += logits.dim(0);
  }
  MoeDispatch dispatch = moe_sort(routing.expert_ids, E);
  const int64_t N = dispatch.rows();
  Tensor xs = moe_gather_forward(a.hn, dispatch);
  Tensor gate = Tensor::empty({N, Fe}, DType::F32, dev), up = Tensor::empty({N, Fe}, DType::F32, dev);
  auto block = [&](int64_t e) {
    return std::pair{static_cast<int64_t>(dispatch.host_offsets[static_cast<size_t>(e)]),
                     static_cast<int64_t>(dispatch.host_offsets[static_cast<size_t>(e) + 1])};
  };
  // Each expert's LoRA (when adapted) runs over its own block of rows, in its linear_forward.
  ExpertLora el;
  auto saved = [&](int p, int64_t e) -> LinearSaved* {
    if (!keep) return nullptr;
    auto& v = a.moe_lin[static_cast<size_t>(p)];
    if (v.empty()) v.resize(static_cast<size_t>(E));
    return &v[static_cast<size_t>(e)];
  };
  for (int64_t e = 0; e < E; ++e) {
    const auto [r0, r1] = block(e);
    if (r0 == r1) continue;  // no token chose this expert
    const Tensor xe = xs.rows(r0, r1);
    Tensor ge = gate.rows(r0, r1), ue = up.rows(r0, r1);
    ge.copy_from(linear_forward(xe, expert_matrix(w.experts_gate, e), nullptr, expert_lora(l, 0, e, train, seed, el),
                                saved(0, e)));
    ue.copy_from(linear_forward(xe, expert_matrix(w.experts_up, e), nullptr, expert_lora(l, 1, e, train, seed, el),
                                saved(1, e)));
  }
  xs = Tensor();
  Tensor m = swiglu_forward(gate, up);
  if (!keep) gate = up = Tensor();
  Tensor ys = Tensor::empty({N, D}, DType::F32, dev);
  for (int64_t e = 0; e < E; ++e) {
    const auto [r0, r1] = block(e);
    if (r0 == r1) continue;
    Tensor ye = ys.rows(r0, r1);
    ye.copy_from(linear_forward(m.rows(r0, r1), expert_matrix(w.experts_down, e), nullptr,
                                expert_lora(l, 2, e, train, seed, el), saved(2, e)));
  }
  Tensor out = a.h.clone();
  moe_scatter_forward(ys, routing.weights, dispatch, out);
  if (keep) {
    a.router_logits = std::move(logits);
    a.routing = std::move(routing);
    a.dispatch = std::move(dispatch);
    a.moe_gate = std::move(gate);
    a.moe_up = std::move(up);
    a.moe_m = std::move(m);
    a.moe_ys = std::move(ys);
  }
  return out;
}

void Model::moe_backward(int64_t l, const Tensor& dout, LayerActs& a, Tensor& dhn, uint64_t seed) {
  const ModelConfig& c = weights_.config;
  const LayerWeights& w = weights_.layers[static_cast<size_t>(l)];
  LayerWeights& g = grads_.layers[static_cast<size_t>(l)].w;
  const bool full = options_.mode == TrainMode::Full;
  const int64_t E = c.num_experts, Fe = c.moe_intermediate_size, D = c.hidden_size, T = dout.dim(0);
  const Device dev = device();
  const MoeDispatch& dispatch = a.dispatch;
  const int64_t N = dispatch.rows();
  auto block = [&](int64_t e) {
    return std::pair{static_cast<int64_t>(dispatch.host_offsets[static_cast<size_t>(e)]),
                     static_cast<int64_t>(dispatch.host_offsets[static_cast<size_t>(e) + 1])};
  };
  // One expert's projection backward over its rows: dx (= or +=) into rows of dx_all, dW (+=) into
  // the expert's slab of the stacked gradient (full fine-tuning).
  // (LoRA: dA and dB into the expert's slabs of the stacked gradients, from the xa its forward kept.)
  auto expert_back = [&](int p, const Tensor& dy, const Tensor& x, const Tensor& stacked_W, Tensor& stacked_dW,
                         int64_t e, Tensor& dx_rows, bool add_dx) {
    LinearGrads lg;
    lg.dx = &dx_rows;
    lg.accumulate_dx = add_dx;
    Tensor dW, dA, dB, dM;
    if (full) {
      dW = expert_matrix(stacked_dW, e);
      lg.dW = &dW;
    }
    ExpertLora el;
    const LoraWeights* lora = expert_lora(l, p, e, training_, seed, el);
    const LinearSaved* saved = nullptr;
    if (lora) {
      LayerGrads& lgr = grads_.layers[static_cast<size_t>(l)];
      dA = expert_matrix(lgr.expert_dA[static_cast<size_t>(p)], e);
      dB = expert_matrix(lgr.expert_dB[static_cast<size_t>(p)], e);
      lg.dA = &dA;
      lg.dB = &dB;
      if (lora->magnitude) {  // DoRA: expert e's row of the stacked magnitude gradient
        const Tensor& stacked_dM = lgr.expert_dM[static_cast<size_t>(p)];
        dM = stacked_dM.rows(e, e + 1).reshape({stacked_dM.dim(1)});
        lg.dm = &dM;
      }
      saved = &a.moe_lin[static_cast<size_t>(p)][static_cast<size_t>(e)];
    }
    linear_backward(dy, x, expert_matrix(stacked_W, e), lora, saved, lg);
  };

  Tensor dys = Tensor::empty({N, D}, DType::F32, dev),
         dweights = Tensor::empty({T, c.num_experts_per_tok}, DType::F32, dev);
  moe_scatter_backward(dout, a.moe_ys, a.routing.weights, dispatch, dys, dweights);
  a.moe_ys = Tensor();
  Tensor dm = Tensor::empty({N, Fe}, DType::F32, dev);
  for (int64_t e = 0; e < E; ++e) {
    const auto [r0, r1] = block(e);
    if (r0 == r1) continue;
    Tensor dm_e = dm.rows(r0, r1);
    expert_back(2, dys.rows(r0, r1), a.moe_m.rows(r0, r1), w.experts_down, g.experts_down, e, dm_e, false);
  }
  dys = a.moe_m = Tensor();
  a.moe_lin[2].clear();  // down's LoRA activations
  Tensor dgate = Tensor::empty({N, Fe}, DType::F32, dev), dup = Tensor::empty({N, Fe}, DType::F32, dev);
  swiglu_backward(dm, a.moe_gate, a.moe_up, dgate, dup);
  dm = a.moe_gate = a.moe_up = Tensor();
  Tensor xs = moe_gather_forward(a.hn, dispatch);  // hn's rows in expert order, again
  Tensor dxs = Tensor::empty({N, D}, DType::F32, dev);
  for (int64_t e = 0; e < E; ++e) {
    const auto [r0, r1] = block(e);
    if (r0 == r1) continue;
    Tensor dx_e = dxs.rows(r0, r1);
    const Tensor xe = xs.rows(r0, r1);
    expert_back(0, dgate.rows(r0, r1), xe, w.experts_gate, g.experts_gate, e, dx_e, false);
    expert_back(1, dup.rows(r0, r1), xe, w.experts_up, g.experts_up, e, dx_e, true);
  }
  dgate = dup = xs = Tensor();
  a.moe_lin[0].clear(), a.moe_lin[1].clear();
  dhn.zero();
  moe_gather_backward(dxs, dispatch, dhn);
  dxs = Tensor();
  // The routing weights' gradient through the renormalised top-k softmax (and the aux loss's) into
  // the router's logits, then through the router into hn.
  Tensor dlogits = Tensor::empty({T, E}, DType::F32, dev);
  moe_route_backward(a.router_logits, a.routing.expert_ids, dweights,
                     moe_aux_.grad.defined() ? &moe_aux_.grad : nullptr, c.norm_topk_prob, dlogits);
  LinearGrads lg;
  lg.dx = &dhn;
  lg.accumulate_dx = true;
  lg.dW = full ? &g.router : nullptr;
  LoraWeights rlw;
  const LoraWeights* rlora = router_lora(l, training_, seed, rlw);
  if (rlora) {
    LayerGrads& lgr = grads_.layers[static_cast<size_t>(l)];
    lg.dA = &lgr.router_dA;
    lg.dB = &lgr.router_dB;
  }
  linear_backward(dlogits, a.hn, w.router, rlora, rlora ? &a.router_lin : nullptr, lg);
  a.router_lin = LinearSaved{};
  a.router_logits = Tensor();
  a.routing = MoeRouting{};
  a.dispatch = MoeDispatch{};
  for (auto& v : a.moe_lin) v.clear();
}

}  // namespace bp
