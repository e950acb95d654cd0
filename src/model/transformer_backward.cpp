// Transformer backward pass and gradient checkpointing (see transformer.h).
//
// forward_backward order, with checkpointing (default):
//   1. forward every layer keeping only its input (L+1 tensors [T, D]);
//   2. final norm + fused linear cross-entropy: loss and dx in one pass, no [T × V] logits;
//   3. for l = L−1 … 0: recompute layer l keeping its activations, backpropagate through it,
//      drop its activations and its output checkpoint.
// Without checkpointing step 1 keeps every layer's activations and step 3 skips the recompute.
// Parameter gradients accumulate (+=). Activation gradients are fresh tensors, except where a
// tensor feeds two paths: the dx of q/k/v (and of gate/up) is summed in place by the GEMMs
// (beta = 1, LinearGrads::accumulate_dx), and each residual's gradient is the buffer the RMSNorm
// backward adds into (accumulate_dx): a layer's incoming gradient becomes dh, dh becomes the
// layer's dx. No temporaries and no separate additions (5 fewer launches and T×D buffers a layer).
#include <fmt/format.h>

#include "model/layer_hook.h"
#include "model/transformer.h"
#include "model/transformer_acts.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/moe.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"

namespace bp {

namespace {
Tensor* opt(Tensor& t) {
  return t.defined() ? &t : nullptr;
}
}  // namespace

// (Gemma's sandwich norms: down's dy is the post-feed-forward norm's dx, not the layer's dout, whose
// copy nobody reads: the norm's backward writes down's.)
bool Model::down_reads_bf16(int64_t l) const {
  return l >= 0 && !weights_.config.sandwich_norms && held_gemms_read_bf16(gemm_weight(l, LinearRole::Down));
}

Tensor Model::backward_layer(int64_t l, Tensor dout, Tensor& dout16, const Batch& b, uint64_t seed, LayerActs& a) {
  const auto& c = weights_.config;
  const auto& w = weights_.layers[static_cast<size_t>(l)];
  auto& g = grads_.layers[static_cast<size_t>(l)];
  const int64_t T = dout.dim(0);
  const int Hq = static_cast<int>(c.num_heads), Hkv = static_cast<int>(c.num_kv_heads);
  const int64_t d = c.head_dim, D = c.hidden_size, F = c.intermediate_size;
  const bool full = options_.mode == TrainMode::Full;
  const Device dev = device();

  // An input group's LoRA backward in one GEMM each for dA and dx's LoRA term (ops/linear.h
  // lora_group_backward) where its A matrices are joined: its members write their dxa into dxa's
  // columns, finish() runs the two GEMMs once the last member is done.
  struct GroupBack {
    const LinearInputGroup* of = nullptr;
    Tensor A_all, dA_all, dxa;
    LoraGroupDropout dropout;
    bool shared = false;  // a fused module: its members sum their dxa into the one [T, r]
  } group;
  auto group_start = [&](const LinearInputGroup& grp) {
    group = GroupBack{};
    group.of = &grp;
    group.A_all = lora_group_A(l, grp);
    group.dropout = lora_group_dropout(l, grp, training_, seed);
    std::vector<const Tensor*> dAs;
    for (int i = 0; i < grp.count; ++i)
      dAs.push_back(&g.lora[static_cast<size_t>(grp.first) + static_cast<size_t>(i)].dA);
    group.shared = lora_group_shared(l, grp);
    // allocate_grads laid them out so (a fused module: its members' dA are its one dA)
    group.dA_all = group.shared ? g.lora[static_cast<size_t>(grp.first)].dA : Tensor::joined_rows(dAs);
    if (!group.A_all.defined() || !group.dA_all.defined()) return;  // each projection alone
    group.dxa = group.shared ? Tensor::zeros({T, group.A_all.dim(0)}, DType::F32, dev)
                             : Tensor::empty({T, group.A_all.dim(0)}, DType::F32, dev);
  };
  auto group_finish = [&](const Tensor& x, Tensor& dx) {
    if (group.dxa.defined()) lora_group_backward(x, group.A_all, group.dxa, &group.dA_all, &dx, &group.dropout);
    group = GroupBack{};
  };

  // Linear backward for one role: dx (= or, with add_dx, +=) into *dx, weight/bias/LoRA grads (+=).
  constexpr bool kAssignDx = false, kAddDx = true;
  // dy16, x16: dy's and x's bf16 copies where their producers made them (ops/linear.h).
  auto lin_back = [&](LinearRole role, const Tensor& dy, const Tensor& x, const Tensor& W, Tensor* dx, bool add_dx,
                      Tensor* dW, Tensor* db, const Tensor* dy16, const Tensor* x16) {
    const auto r = static_cast<size_t>(role);
    LoraWeights lw = lora_weights(l, role, training_, seed);
    LinearGrads lg;
    lg.dx = dx;
    lg.accumulate_dx = add_dx;
    lg.dW = full ? dW : nullptr;
    lg.db = full ? db : nullptr;
    if (lw.A) {
      lg.dA = opt(g.lora[r].dA);
      lg.dB = opt(g.lora[r].dB);
      if (lw.magnitude) lg.dm = opt(g.lora[r].dM);
      if (group.dxa.defined() && group.of->contains(role)) {  // dA and dx's LoRA term: group.finish
        lw.group_dxa = &group.dxa;
        lw.group_col = lora_group_col(l, *group.of, role);
        lw.group_dxa_accumulate = group.shared;
        lg.dA = nullptr;
      }
    }
    linear_backward(dy, x, W, lw.A ? &lw : nullptr, &a.lin[r], lg, dy16, x16);
    a.lin[r] = LinearSaved{};  // this projection's LoRA activations are no longer needed
  };

  // ---- MLP: out = h + down(swiglu(gate(hn), up(hn)))   (Gemma: h + post_ffn_norm(down(geglu(...))))
  // A sparse layer: out = h + the experts' weighted sum (transformer_moe.cpp).
  const bool sandwich = c.sandwich_norms;
  Tensor dhn;
  if (c.is_moe_layer(l)) {
    dhn = Tensor::empty({T, D}, DType::F32, dev);
    moe_backward(l, dout, a, dhn, seed);
    dout16 = Tensor();
  } else {
    const Tensor& Wdown = gemm_weight(l, LinearRole::Down);
    Tensor ddown;  // Gemma: the gradient of down's output, through post_feedforward_layernorm
    if (sandwich) {
      ddown = Tensor::empty({T, D}, DType::F32, dev);
      rms_norm_backward(dout, a.down_out, norm_weight(w.post_ffn_norm), a.rstd_f, ddown,
                        full ? &g.w.post_ffn_norm : nullptr, false, held_gemms_read_bf16(Wdown) ? &dout16 : nullptr);
      a.down_out = a.rstd_f = Tensor();
    }
    Tensor dm = Tensor::empty({T, F}, DType::F32, dev);
    lin_back(LinearRole::Down, sandwich ? ddown : dout, a.m, Wdown, &dm, kAssignDx, &g.w.down, nullptr, opt(dout16),
             opt(a.m16));
    dout16 = ddown = Tensor();
    a.m = a.m16 = Tensor();
    // SwiGLU's backward also writes the bf16 copies of dgate and dup where gate's and up's GEMMs take
    // bf16 (ops/linear.h dy_bf16): their dx (and a GEMM copy's dW) read them instead of rounding.
    Tensor dgate = Tensor::empty({T, F}, DType::F32, dev), dup = Tensor::empty({T, F}, DType::F32, dev);
    const Tensor& Wgate = gemm_weight(l, LinearRole::Gate);
    const Tensor& Wup = gemm_weight(l, LinearRole::Up);
    Tensor dgate16, dup16;
    const bool gate16 = held_gemms_read_bf16(Wgate), up16 = held_gemms_read_bf16(Wup);
    if (c.hidden_act == GluActivation::GeluTanh)
      geglu_backward(dm, a.gate, a.up, dgate, dup, gate16 ? &dgate16 : nullptr, up16 ? &dup16 : nullptr);
    else
      swiglu_backward(dm, a.gate, a.up, dgate, dup, gate16 ? &dgate16 : nullptr, up16 ? &dup16 : nullptr);
    dm = Tensor();
    a.gate = a.up = Tensor();
    dhn = Tensor::empty({T, D}, DType::F32, dev);
    group_start(kGateUpGroup);
    lin_back(LinearRole::Gate, dgate, a.hn, Wgate, &dhn, kAssignDx, &g.w.gate, nullptr, opt(dgate16), opt(a.hn16));
    dgate = dgate16 = Tensor();
    lin_back(LinearRole::Up, dup, a.hn, Wup, &dhn, kAddDx, &g.w.up, nullptr, opt(dup16), opt(a.hn16));
    dup = dup16 = Tensor();
    group_finish(a.hn, dhn);
  }
  a.hn = a.hn16 = Tensor();
  // dh = dout (residual h -> out) + the post-norm's backward, added into dout's buffer: nothing
  // reads dout after the down projection's backward. Its bf16 copy is o's dy where o reads bf16.
  Tensor dh = std::move(dout);
  const Tensor& Wo = gemm_weight(l, LinearRole::O);
  Tensor dh16;
  Tensor& mlp_norm_grad = sandwich ? g.w.pre_ffn_norm : g.w.post_norm;
  rms_norm_backward(dhn, a.h, norm_weight(sandwich ? w.pre_ffn_norm : w.post_norm), a.rstd2, dh,
                    full ? &mlp_norm_grad : nullptr, /*accumulate_dx=*/true,
                    !sandwich && held_gemms_read_bf16(Wo) ? &dh16 : nullptr);
  dhn = Tensor();
  a.h = Tensor();

  // ---- attention: h = x + o(attn(rope(q), rope(k), v))   (Gemma: h = x + post_norm(o(...)))
  Tensor dattn = Tensor::empty({T, Hq * d}, DType::F32, dev);
  Tensor do_out;  // Gemma: the gradient of o's output, through post_attention_layernorm
  if (sandwich) {
    do_out = Tensor::empty({T, D}, DType::F32, dev);
    rms_norm_backward(dh, a.o_out, norm_weight(w.post_norm), a.rstd_o, do_out, full ? &g.w.post_norm : nullptr, false,
                      held_gemms_read_bf16(Wo) ? &dh16 : nullptr);
    a.o_out = a.rstd_o = Tensor();
  }
  lin_back(LinearRole::O, sandwich ? do_out : dh, a.attn, Wo, &dattn, kAssignDx, &g.w.o, nullptr, opt(dh16),
           opt(a.attn16));
  dh16 = a.attn16 = do_out = Tensor();
  Tensor dq = Tensor::empty({T, Hq * d}, DType::F32, dev), dk = Tensor::empty({T, Hkv * d}, DType::F32, dev),
         dv = Tensor::empty({T, Hkv * d}, DType::F32, dev);
  // The last writer of dq, dk and dv writes the bf16 copy the GEMMs of q, k and v read as their dy
  // (where they read bf16): the attention backward dv's, RoPE's backward dq's and dk's, or, with
  // q/k norms, those norms' backward.
  const Tensor& Wq = gemm_weight(l, LinearRole::Q);
  const Tensor& Wk = gemm_weight(l, LinearRole::K);
  const Tensor& Wv = gemm_weight(l, LinearRole::V);
  Tensor dq16, dk16, dv16;
  auto want16 = [](const Tensor& W, Tensor& t16) { return held_gemms_read_bf16(W) ? &t16 : nullptr; };
  const AttentionShape shape = c.attention_shape(l);
  attention_backward(dattn, a.q, a.k, a.v, a.attn, a.lse, b.cu_seqlens, shape, dq, dk, dv, want16(Wv, dv16));
  dattn = Tensor();
  a.q = a.k = a.v = a.attn = a.lse = Tensor();
  const bool qk = c.qk_norm;
  rope_backward(dq, dk, b.positions, Hq, Hkv, c.rope_for_layer(l), qk ? nullptr : want16(Wq, dq16),
                qk ? nullptr : want16(Wk, dk16));
  if (qk) {
    Tensor dq_pre = Tensor::empty({T * Hq, d}, DType::F32, dev);
    rms_norm_backward(dq.reshape({T * Hq, d}), a.q_pre.reshape({T * Hq, d}), norm_weight(w.q_norm), a.rstd_q, dq_pre,
                      full ? &g.w.q_norm : nullptr, false, want16(Wq, dq16));
    dq = dq_pre.reshape({T, Hq * d});
    if (dq16.defined()) dq16 = dq16.reshape({T, Hq * d});
    Tensor dk_pre = Tensor::empty({T * Hkv, d}, DType::F32, dev);
    rms_norm_backward(dk.reshape({T * Hkv, d}), a.k_pre.reshape({T * Hkv, d}), norm_weight(w.k_norm), a.rstd_k, dk_pre,
                      full ? &g.w.k_norm : nullptr, false, want16(Wk, dk16));
    dk = dk_pre.reshape({T, Hkv * d});
    if (dk16.defined()) dk16 = dk16.reshape({T, Hkv * d});
    a.q_pre = a.k_pre = Tensor();
  }
  Tensor dxn = Tensor::empty({T, D}, DType::F32, dev);
  group_start(kQkvGroup);
  lin_back(LinearRole::Q, dq, a.xn, Wq, &dxn, kAssignDx, &g.w.q, opt(g.w.q_bias), opt(dq16), opt(a.xn16));
  dq = dq16 = Tensor();
  lin_back(LinearRole::K, dk, a.xn, Wk, &dxn, kAddDx, &g.w.k, opt(g.w.k_bias), opt(dk16), opt(a.xn16));
  dk = dk16 = Tensor();
  lin_back(LinearRole::V, dv, a.xn, Wv, &dxn, kAddDx, &g.w.v, opt(g.w.v_bias), opt(dv16), opt(a.xn16));
  dv = dv16 = Tensor();
  group_finish(a.xn, dxn);
  a.xn = a.xn16 = Tensor();
  // dx = dh (residual x -> h) + the input norm's backward, added into dh's buffer; its bf16 copy is
  // the dy of layer l−1's down projection where that reads bf16.
  rms_norm_backward(dxn, a.x, norm_weight(w.input_norm), a.rstd1, dh, full ? &g.w.input_norm : nullptr,
                    /*accumulate_dx=*/true, down_reads_bf16(l - 1) ? &dout16 : nullptr);
  return dh;
}

CrossEntropyResult Model::forward_backward(const Batch& host_batch, float grad_scale, uint64_t dropout_seed) {
  // The aux loss enters with this micro-batch's share of the step (its label tokens × grad_scale:
  // 1 for a step of one micro-batch, where the loss is HF's mean cross-entropy + coef · aux).
  moe_aux_.scale = grad_scale * static_cast<float>(host_batch.num_label_tokens());
  return train_pass(host_batch, dropout_seed, [&](const Tensor& xf, const Tensor& labels, Tensor& dxf, Tensor* dW) {
    return linear_cross_entropy_forward_backward(xf, head_gemm_weight(), labels, grad_scale, dxf, dW,
                                                 options_.ce_chunk_tokens, config().final_logit_softcap);
  });
}

Model::SequenceLosses Model::forward_backward_sequences(const Batch& host_batch, const SequenceGradFn& grad_of,
                                                        uint64_t dropout_seed) {
  const int64_t S = host_batch.num_samples();
  const int32_t* cu = host_batch.cu_seqlens.data<int32_t>();
  SequenceLosses out;
  moe_aux_.scale = 1.0f;  // preference methods: the aux loss once per micro-batch
  train_pass(host_batch, dropout_seed, [&](const Tensor& xf, const Tensor& labels, Tensor& dxf, Tensor* dW) {
    const Tensor& W = head_gemm_weight();
    const int64_t chunk = options_.ce_chunk_tokens;
    CrossEntropyResult total;
    auto note = [&](const CrossEntropyResult& r) {
      out.loss_sum.push_back(r.loss_sum);
      out.n_counted.push_back(r.n_counted);
      total.loss_sum += r.loss_sum;
      total.n_counted += r.n_counted;
    };
    for (int64_t s = 0; s < S; ++s) {
      const Tensor x_s = xf.rows(cu[s], cu[s + 1]), l_s = labels.rows(cu[s], cu[s + 1]);
      if (dW) {
        note(linear_cross_entropy_forward(x_s, W, l_s, chunk, config().final_logit_softcap));
      } else {
        Tensor dx_s = dxf.rows(cu[s], cu[s + 1]);
        note(linear_cross_entropy_forward_backward(x_s, W, l_s, 1.0f, dx_s, nullptr, chunk,
                                                   config().final_logit_softcap));
      }
    }
    const std::vector<float> scale = grad_of(out);
    if (static_cast<int64_t>(scale.size()) != S)
      throw Error(ErrorCode::RUNTIME_INTERNAL,
                  fmt::format("[model] {} sequence gradients for {} sequences", scale.size(), S));
    for (int64_t s = 0; s < S; ++s) {
      const Tensor x_s = xf.rows(cu[s], cu[s + 1]), l_s = labels.rows(cu[s], cu[s + 1]);
      Tensor dx_s = dxf.rows(cu[s], cu[s + 1]);
      if (dW)
        linear_cross_entropy_forward_backward(x_s, W, l_s, scale[static_cast<size_t>(s)], dx_s, dW, chunk,
                                              config().final_logit_softcap);
      else
        scale_inplace(dx_s, scale[static_cast<size_t>(s)]);
    }
    return total;
  });
  return out;
}

namespace {
thread_local std::function<void(int64_t)> t_layer_hook;  // model/layer_hook.h
}  // namespace

void set_layer_backward_hook(std::function<void(int64_t)> hook) {
  t_layer_hook = std::move(hook);
}

CrossEntropyResult Model::train_pass(const Batch& host_batch, uint64_t dropout_seed, const HeadStep& head) {
  check_batch(host_batch);
  if (!host_batch.labels.defined())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[model] forward_backward needs labels");
  if (options_.mode == TrainMode::Frozen)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[model] forward_backward on a model with nothing to train");
  if (options_.mode == TrainMode::Lora && !lora_.any())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[model] LoRA mode but no adapter is attached");
  const auto& c = weights_.config;
  const int64_t L = c.num_layers, T = host_batch.num_tokens(), D = c.hidden_size;
  const bool full = options_.mode == TrainMode::Full;
  const bool ckpt = options_.gradient_checkpointing;
  const bool train = training_;
  const Device dev = device();
  const Batch batch = host_batch.to(dev);
  const HostMirrorScope mirror = batch.mirrored_by(host_batch);  // the ops' checks read host_batch

  std::vector<Tensor> inputs;   // checkpointing: layer inputs (+ final output)
  std::vector<LayerActs> acts;  // no checkpointing: every layer's activations
  // Mixture-of-Experts: the load-balancing loss's statistics from this forward (not the recompute).
  const float aux_scale = moe_aux_.scale;
  moe_aux_ = MoeAux{};
  if (c.is_moe()) {
    moe_aux_.collect = true;
    moe_aux_.counts = Tensor::zeros({c.num_experts}, DType::F32, dev);
    moe_aux_.prob_sum = Tensor::zeros({c.num_experts}, DType::F32, dev);
  }
  Tensor x = forward_trunk(batch, train, dropout_seed, ckpt ? &inputs : nullptr, ckpt ? nullptr : &acts);
  if (c.is_moe()) {
    const std::vector<float> counts = moe_aux_.counts.to_vector();
    moe_aux_.loss = moe_aux_loss(counts, moe_aux_.prob_sum.to_vector(), moe_aux_.tokens);
    if (const float coef = router_aux_coef(); coef > 0)
      moe_aux_.grad = Tensor::from_vector(moe_aux_grad(counts, moe_aux_.tokens, static_cast<double>(coef) * aux_scale),
                                          {c.num_experts})
                          .to(dev);
    moe_aux_.collect = false;
  }
  if (ckpt) inputs.resize(static_cast<size_t>(L));  // x holds the last output

  // Final norm + fused LM head / cross-entropy (dx and the head's dW in the same pass).
  Tensor rstd;
  Tensor final_norm = norm_weight(weights_.final_norm);
  Tensor xf = rms_norm_forward(x, final_norm, c.rms_norm_eps, &rstd);
  Tensor dxf = Tensor::empty({T, D}, DType::F32, dev);
  Tensor* dW_head = nullptr;
  if (full) dW_head = c.tie_word_embeddings ? &grads_.embed : &grads_.lm_head;
  CrossEntropyResult res = head(xf, batch.labels, dxf, dW_head);
  xf = Tensor();
  Tensor dx = Tensor::empty({T, D}, DType::F32, dev), dx16;  // dx16: its bf16 copy for the top layer's down
  rms_norm_backward(dxf, x, final_norm, rstd, dx, full ? &grads_.final_norm : nullptr, false,
                    down_reads_bf16(L - 1) ? &dx16 : nullptr);
  dxf = rstd = x = final_norm = Tensor();
  if (t_layer_hook) t_layer_hook(L);

  for (int64_t l = L - 1; l >= 0; --l) {
    const auto li = static_cast<size_t>(l);
    if (ckpt) {
      LayerActs a;
      forward_layer(l, inputs[li], batch, train, dropout_seed, &a);  // recompute; output dropped
      inputs[li] = Tensor();
      dx = backward_layer(l, std::move(dx), dx16, batch, dropout_seed, a);
    } else {
      dx = backward_layer(l, std::move(dx), dx16, batch, dropout_seed, acts[li]);
      acts[li] = LayerActs{};
    }
    if (t_layer_hook) t_layer_hook(l);
  }
  moe_aux_.counts = moe_aux_.prob_sum = moe_aux_.grad = Tensor();  // the pass's loss value stays
  if (full) {
    if (c.embed_scale > 0) scale_inplace(dx, c.embed_scale);  // the forward's x·embed_scale
    embedding_backward(dx, batch.tokens, grads_.embed);
  }
  return res;
}

}  // namespace bp
