// Internal to the transformer (transformer.cpp, transformer_backward.cpp): what one layer's
// forward keeps for its backward. Not a public contract.
//
// Per layer, [T] tokens, D hidden, F intermediate, Hq/Hkv heads of d:
//   xn [T,D], q/k/v [T,Hq·d]/[T,Hkv·d] (after q/k norm and RoPE), attn [T,Hq·d], lse [Hq,T],
//   h [T,D], hn [T,D], gate/up/m [T,F], rstd1/rstd2 [T];
//   Qwen3: q_pre/k_pre (before q/k norm) and rstd_q [T·Hq], rstd_k [T·Hkv];
//   Gemma (sandwich norms): o_out [T,D] (o_proj's output, before post_attention_layernorm), rstd_o [T],
//   down_out [T,D] (down_proj's output, before post_feedforward_layernorm), rstd_f [T];
//   LoRA: per targeted module xa [T,r] (dropout regenerates its mask: no dropped input kept), see ops/linear.h;
//   full fine-tuning through bf16 GEMM copies on a card: the bf16 copies xn16, attn16, hn16, m16 the
//   producers wrote for the forward's GEMMs, kept for dW's (ops/linear.h x_bf16); xn, hn and m are then
//   undefined (their copies are all the backward reads of them).
//   Mixture-of-Experts (a sparse layer, model/transformer_moe.cpp): router_logits [T,E], the routing
//   (expert ids, weights [T,k]) and its dispatch (the counting sort: offsets [E+1], rows [T·k]), and in
//   expert order gate/up/m [T·k,Fe] and ys [T·k,D] (each expert's down output, before the weighted
//   sum); gate, up, m above stay undefined. xs (hn's rows in expert order) is gathered again in backward.
// The layer input x is referenced (it is the previous layer's output or a checkpoint).
#pragma once

#include <array>
#include <vector>

#include "core/tensor.h"
#include "model/transformer.h"
#include "ops/linear.h"
#include "ops/moe.h"

namespace bp {

struct Model::LayerActs {
  Tensor x;
  Tensor rstd1, xn;
  Tensor q_pre, k_pre, rstd_q, rstd_k;
  Tensor q, k, v;
  Tensor attn, lse;
  Tensor h, rstd2, hn;
  Tensor gate, up, m;
  Tensor o_out, rstd_o, down_out, rstd_f;
  Tensor xn16, attn16, hn16, m16;
  std::array<LinearSaved, kNumLinearRoles> lin;
  Tensor router_logits;
  MoeRouting routing;
  MoeDispatch dispatch;
  Tensor moe_gate, moe_up, moe_m, moe_ys;
  std::array<std::vector<LinearSaved>, 3> moe_lin;  // the experts' LoRA xa, per projection and expert
  LinearSaved router_lin;                           // the router's LoRA xa
};

// Deterministic per-(layer, module) dropout seed from the micro-batch seed (splitmix64), so the
// recomputed forward of gradient checkpointing sees the same masks.
uint64_t lora_dropout_seed(uint64_t seed, int64_t layer, LinearRole role);

}  // namespace bp
