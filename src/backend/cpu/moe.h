// CPU kernels of the Mixture-of-Experts ops (contract: ops/moe.h). Plain reference loops: routing
// and the bookkeeping are O(T·E) and O(T·k·D), small beside the experts' GEMMs.
//
// Layout: T tokens, E experts, k experts per token; the T·k assignments a = t·k + j (token t's j-th
// choice, j in order of decreasing weight). The counting sort orders them by expert (stable: by a
// within an expert), giving expert e the contiguous rows [offsets[e], offsets[e+1]) of the
// expert-ordered activations; row_token[i] is the token of sorted row i and slot_of[a] the sorted
// row of assignment a.
#pragma once

#include <cstdint>

namespace bp::cpu {

// p = softmax(logits[t]) over E (f32, max-subtracted); the k largest p in decreasing order, ties to
// the lower expert index; weights = those p, divided by their sum when `renormalize`.
void moe_route_forward(const float* logits, int64_t T, int64_t E, int64_t k, bool renormalize, int32_t* expert_ids,
                       float* weights);
// dlogits (=) from dweights [T, k] through the renormalisation and the softmax; with aux_grad [E]
// (may be null) the gradient g of a loss linear in the mean probabilities adds p ⊙ (g − ⟨p, g⟩).
void moe_route_backward(const float* logits, const int32_t* expert_ids, const float* dweights, const float* aux_grad,
                        int64_t T, int64_t E, int64_t k, bool renormalize, float* dlogits);
// Counting sort of the T·k assignments by expert: offsets [E+1], row_token [T·k], slot_of [T·k].
void moe_sort(const int32_t* expert_ids, int64_t T, int64_t k, int64_t E, int32_t* offsets, int32_t* row_token,
              int32_t* slot_of);
// xs[i] = x[row_token[i]]: [T·k, D] rows in expert order.
void moe_gather_forward(const float* x, const int32_t* row_token, int64_t rows, int64_t D, float* xs);
// dx[t] += Σ_j dxs[slot_of[t·k + j]] (per token, in j order: deterministic).
void moe_gather_backward(const float* dxs, const int32_t* slot_of, int64_t T, int64_t k, int64_t D, float* dx);
// out[t] += Σ_j weights[t, j] · ys[slot_of[t·k + j]].
void moe_scatter_forward(const float* ys, const float* weights, const int32_t* slot_of, int64_t T, int64_t k, int64_t D,
                         float* out);
// dys[slot_of[t·k + j]] = weights[t, j] · dout[t] (=);  dweights[t, j] = ⟨dout[t], ys[slot_of[t·k + j]]⟩ (=).
void moe_scatter_backward(const float* dout, const float* ys, const float* weights, const int32_t* slot_of, int64_t T,
                          int64_t k, int64_t D, float* dys, float* dweights);
// The load-balancing loss's statistics (+=): counts[e] = assignments to e, prob_sum[e] = Σ_t softmax(logits[t])[e].
void moe_aux_accumulate(const float* logits, const int32_t* expert_ids, int64_t T, int64_t E, int64_t k, float* counts,
                        float* prob_sum);

}  // namespace bp::cpu
