// Mixture-of-Experts ops (Qwen3-MoE, Mixtral: model/transformer.h "Mixture-of-Experts"). A sparse
// MLP over T tokens, E experts, k per token, is
//   logits = x·Wrᵀ [T, E] (linear)         routing = moe_route_forward(logits)   ids, weights [T, k]
//   dispatch = moe_sort(ids)               xs = moe_gather_forward(x, dispatch)  [T·k, D], expert order
//   per expert e, ONE GEMM over its rows [offsets[e], offsets[e+1]) of xs (gate/up, SwiGLU, down) -> ys
//   out += moe_scatter_forward(ys, weights)   out[t] += Σ_j w[t, j] · ys[row of (t, j)]
// and backward the reverse. No per-token GEMM: each expert's tokens are one contiguous block.
//
// Routing follows Hugging Face (modeling_qwen3_moe.py, modeling_mixtral.py; read, not copied):
// softmax over all E in f32, the top k probabilities in decreasing order (equal ones: the lower
// expert index first, deterministic), divided by their sum when `renormalize` (Qwen3-MoE's
// norm_topk_prob; always for Mixtral, whose code does softmax, topk, then /= sum).
// The load-balancing loss (transformers' load_balancing_loss_func, without an attention mask: our
// packed batches have no padding) over the N tokens of every sparse layer together is
//   aux = E · Σ_e f_e · P_e,   f_e = count_e / N (assignments to e), P_e = Σ_t p_te / N,
// its gradient flowing only through P (counts come from a top-k): d aux / d p_te = E · count_e / N²
// =: g_e for every token, which moe_route_backward folds into the router logits' gradient.
//
// All float tensors f32, indices i32. CPU kernels in backend/cpu/moe.cpp, CUDA kernels in
// backend/cuda/moe.cuh (deterministic: the same expert choices and the same stable sort as the
// CPU's). moe_sort fills host_offsets for the host's per-expert GEMM loop: on a device, one copy of
// E + 1 ints back, which also checks every id was in range (offsets[E] = T·k).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace bp {

struct MoeRouting {
  Tensor expert_ids;  // i32 [T, k]
  Tensor weights;     // f32 [T, k]
};
// Saved for backward: the logits (the caller keeps them) and expert_ids.
MoeRouting moe_route_forward(const Tensor& logits, int64_t k, bool renormalize);
// dlogits [T, E] (=) from dweights [T, k]; aux_grad [E] (may be null): g above, already scaled by
// the loss's coefficient, added for every token.
void moe_route_backward(const Tensor& logits, const Tensor& expert_ids, const Tensor& dweights, const Tensor* aux_grad,
                        bool renormalize, Tensor& dlogits);

struct MoeDispatch {
  Tensor offsets;                     // i32 [E + 1]: expert e's rows are [offsets[e], offsets[e+1])
  Tensor row_token;                   // i32 [T·k]: the token of each expert-ordered row
  Tensor slot_of;                     // i32 [T·k]: the expert-ordered row of assignment t·k + j
  std::vector<int32_t> host_offsets;  // offsets, readable by host code (the per-expert GEMM loop)
  int64_t rows() const { return row_token.defined() ? row_token.dim(0) : 0; }
};
// Counting sort of the assignments by expert (stable: within an expert, by token then choice).
// An expert id outside [0, num_experts) is RUNTIME_INTERNAL.
MoeDispatch moe_sort(const Tensor& expert_ids, int64_t num_experts);
// xs = x's rows in expert order [T·k, D];  backward: dx[t] += Σ_j dxs[row of (t, j)].
Tensor moe_gather_forward(const Tensor& x, const MoeDispatch& d);
void moe_gather_backward(const Tensor& dxs, const MoeDispatch& d, Tensor& dx);
// out[t] += Σ_j weights[t, j] · ys[row of (t, j)] (out [T, D], typically the residual h);
// backward: dys (=) [T·k, D] and dweights (=) [T, k]. Saved: ys and weights (the caller keeps them).
void moe_scatter_forward(const Tensor& ys, const Tensor& weights, const MoeDispatch& d, Tensor& out);
void moe_scatter_backward(const Tensor& dout, const Tensor& ys, const Tensor& weights, const MoeDispatch& d,
                          Tensor& dys, Tensor& dweights);

// The load-balancing loss's statistics of one layer's routing, accumulated (+=) over the sparse
// layers: counts [E] (assignments) and prob_sum [E] (Σ_t softmax(logits[t])).
void moe_aux_accumulate(const Tensor& logits, const Tensor& expert_ids, Tensor& counts, Tensor& prob_sum);
// aux = E · Σ_e (counts_e / N) · (prob_sum_e / N), N = tokens summed over the sparse layers.
double moe_aux_loss(const std::vector<float>& counts, const std::vector<float>& prob_sum, int64_t n_tokens);
// g_e = coef · E · counts_e / N² (moe_route_backward's aux_grad for a loss coef · aux).
std::vector<float> moe_aux_grad(const std::vector<float>& counts, int64_t n_tokens, double coef);

}  // namespace bp
