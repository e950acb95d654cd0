// CUDA Mixture-of-Experts ops (contract: ops/moe.h; CPU sibling: backend/cpu/moe.cpp, whose layout
// notes apply: T tokens, E experts, k per token, assignment a = t·k + j). f32 throughout.
//
//   route forward / backward   one thread per token: the row's max and 1/Σexp once, then each p_e
//                              recomputed as the CPU computes it (exp(l − max) · inv); the top k
//                              picked in k passes over E, each taking the largest p ordered after
//                              the previous pick (p descending, then index ascending: the CPU's
//                              partial_sort order, ties to the lower index), so no per-thread array
//   sort                       deterministic and stable like the CPU's counting sort, with one
//                              writer per output: a thread per expert counts its assignments, one
//                              thread scans them into offsets, then a thread per expert walks the
//                              assignments in order and places its own (rows offsets[e], +1, ...).
//                              O(E·T·k) reads, all broadcast within a warp: small beside the
//                              experts' GEMMs at the shapes MoE models have (E ≤ a few hundred).
//                              An id outside [0, E) is counted by no expert: offsets[E] < T·k,
//                              which the front-end checks on the copy it reads back (ops/moe.cpp).
//   gather / scatter and their backwards
//                              one block per row or token, threads over D; a token adds its k rows
//                              in j order as the CPU does (the same bits up to FMA contraction)
//   scatter backward's dweights  one block per assignment: a block sum of dout[t]·ys[row]
//   aux accumulate             a thread per token writes its row's (max, 1/Σexp) to scratch [T, 2];
//                              then a thread per expert adds its p over the tokens in order and its
//                              assignment count: the CPU's order, one writer per expert.
#pragma once

#include "backend/cuda/cuda_compat.cuh"

namespace bp::BP_CUDA_NS {

constexpr int kMoeThreads = 128;

// The softmax of a logits row as the CPU computes it: max, then inv = 1 / Σ exp(l − max).
__device__ __forceinline__ void moe_row_stats(const float* l, int64_t E, float& mx, float& inv) {
  mx = l[0];
  for (int64_t e = 1; e < E; ++e) mx = fmaxf(mx, l[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < E; ++e) sum += expf(l[e] - mx);
  inv = 1.0f / sum;
}

__global__ void moe_route_forward_kernel(const float* logits, int64_t T, int64_t E, int64_t k, bool renormalize,
                                         int32_t* expert_ids, float* weights) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const float* l = logits + t * E;
  float mx, inv;
  moe_row_stats(l, E, mx, inv);
  int64_t prev = -1;
  float prev_p = 0.0f, sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    float best_p = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      const float p = expf(l[e] - mx) * inv;
      const bool after_prev = prev < 0 || p < prev_p || (p == prev_p && e > prev);
      if (after_prev && (best < 0 || p > best_p)) best = e, best_p = p;
    }
    expert_ids[t * k + j] = static_cast<int32_t>(best);
    weights[t * k + j] = best_p;
    sum += best_p;
    prev = best, prev_p = best_p;
  }
  if (renormalize) {
    const float scale = 1.0f / sum;
    for (int64_t j = 0; j < k; ++j) weights[t * k + j] *= scale;
  }
}

// dp_e of token t (before the softmax's backward): aux_grad[e] plus, for e chosen as j, (dw_j − dot) / S.
__device__ __forceinline__ float moe_route_dp(int64_t e, const int32_t* ids, const float* dw, const float* aux_grad,
                                              int64_t k, float S, float dot) {
  float dp = aux_grad ? aux_grad[e] : 0.0f;
  for (int64_t j = 0; j < k; ++j)
    if (ids[j] == e) dp += (dw[j] - dot) / S;
  return dp;
}

__global__ void moe_route_backward_kernel(const float* logits, const int32_t* expert_ids, const float* dweights,
                                          const float* aux_grad, int64_t T, int64_t E, int64_t k, bool renormalize,
                                          float* dlogits) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  const float* l = logits + t * E;
  const int32_t* ids = expert_ids + t * k;
  const float* dw = dweights + t * k;
  float mx, inv;
  moe_row_stats(l, E, mx, inv);
  float S = 1.0f, dot = 0.0f;
  if (renormalize) {
    S = 0.0f;
    for (int64_t j = 0; j < k; ++j) S += expf(l[ids[j]] - mx) * inv;
    for (int64_t j = 0; j < k; ++j) dot += dw[j] * (expf(l[ids[j]] - mx) * inv) / S;
  }
  float pdp = 0.0f;
  for (int64_t e = 0; e < E; ++e) pdp += (expf(l[e] - mx) * inv) * moe_route_dp(e, ids, dw, aux_grad, k, S, dot);
  for (int64_t e = 0; e < E; ++e) {
    const float p = expf(l[e] - mx) * inv;
    dlogits[t * E + e] = p * (moe_route_dp(e, ids, dw, aux_grad, k, S, dot) - pdp);
  }
}

// offsets[e + 1] = the number of assignments to expert e.
__global__ void moe_count_kernel(const int32_t* expert_ids, int64_t n, int64_t E, int32_t* offsets) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= E) return;
  int32_t c = 0;
  for (int64_t a = 0; a < n; ++a) c += expert_ids[a] == e;
  offsets[e + 1] = c;
}

// offsets[0] = 0 and the counts' running sum: E + 1 values, one thread.
__global__ void moe_scan_kernel(int64_t E, int32_t* offsets) {
  if (threadIdx.x != 0) return;
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
}

// Expert e's assignments, in order, to its rows offsets[e], offsets[e] + 1, ...
__global__ void moe_place_kernel(const int32_t* expert_ids, int64_t n, int64_t k, int64_t E, const int32_t* offsets,
                                 int32_t* row_token, int32_t* slot_of) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= E) return;
  int32_t row = offsets[e];
  for (int64_t a = 0; a < n; ++a)
    if (expert_ids[a] == e) {
      row_token[row] = static_cast<int32_t>(a / k);
      slot_of[a] = row++;
    }
}

__global__ void moe_gather_forward_kernel(const float* x, const int32_t* row_token, int64_t D, float* xs) {
  const float* src = x + static_cast<int64_t>(row_token[blockIdx.x]) * D;
  float* dst = xs + static_cast<int64_t>(blockIdx.x) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dst[d] = src[d];
}

__global__ void moe_gather_backward_kernel(const float* dxs, const int32_t* slot_of, int64_t k, int64_t D, float* dx) {
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = dx[t * D + d];
    for (int64_t j = 0; j < k; ++j) acc += dxs[static_cast<int64_t>(slot_of[t * k + j]) * D + d];
    dx[t * D + d] = acc;
  }
}

__global__ void moe_scatter_forward_kernel(const float* ys, const float* weights, const int32_t* slot_of, int64_t k,
                                           int64_t D, float* out) {
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = out[t * D + d];
    for (int64_t j = 0; j < k; ++j) acc += weights[t * k + j] * ys[static_cast<int64_t>(slot_of[t * k + j]) * D + d];
    out[t * D + d] = acc;
  }
}

__global__ void moe_scatter_backward_kernel(const float* dout, const float* ys, const float* weights,
                                            const int32_t* slot_of, int64_t k, int64_t D, float* dys, float* dweights) {
  __shared__ float scratch[32];
  const int64_t a = blockIdx.x, t = a / k, row = slot_of[a];
  const float w = weights[a];
  const float* g = dout + t * D;
  const float* y = ys + row * D;
  float* dy = dys + row * D;
  float dot = 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    dy[d] = w * g[d];
    dot += g[d] * y[d];
  }
  dot = block_sum(dot, scratch);
  if (threadIdx.x == 0) dweights[a] = dot;
}

__global__ void moe_row_stats_kernel(const float* logits, int64_t T, int64_t E, float* stats) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  moe_row_stats(logits + t * E, E, stats[2 * t], stats[2 * t + 1]);
}

__global__ void moe_aux_accumulate_kernel(const float* logits, const int32_t* expert_ids, const float* stats, int64_t T,
                                          int64_t E, int64_t k, float* counts, float* prob_sum) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= E) return;
  float p = prob_sum[e];
  for (int64_t t = 0; t < T; ++t) p += expf(logits[t * E + e] - stats[2 * t]) * stats[2 * t + 1];
  prob_sum[e] = p;
  float c = counts[e];
  for (int64_t a = 0; a < T * k; ++a)
    if (expert_ids[a] == e) c += 1.0f;
  counts[e] = c;
}

BP_HOST_FN void moe_route_forward(const float* logits, int64_t T, int64_t E, int64_t k, bool renormalize,
                                  int32_t* expert_ids, float* weights, cudaStream_t stream = nullptr) {
  if (T > 0) BP_LAUNCH(blocks_for(T, kMoeThreads), kMoeThreads, 0, stream, moe_route_forward_kernel)
  (logits, T, E, k, renormalize, expert_ids, weights);
}

BP_HOST_FN void moe_route_backward(const float* logits, const int32_t* expert_ids, const float* dweights,
                                   const float* aux_grad, int64_t T, int64_t E, int64_t k, bool renormalize,
                                   float* dlogits, cudaStream_t stream = nullptr) {
  if (T > 0) BP_LAUNCH(blocks_for(T, kMoeThreads), kMoeThreads, 0, stream, moe_route_backward_kernel)
  (logits, expert_ids, dweights, aux_grad, T, E, k, renormalize, dlogits);
}

BP_HOST_FN void moe_sort(const int32_t* expert_ids, int64_t T, int64_t k, int64_t E, int32_t* offsets,
                         int32_t* row_token, int32_t* slot_of, cudaStream_t stream = nullptr) {
  const unsigned blocks = blocks_for(E, kMoeThreads);
  BP_LAUNCH(blocks, kMoeThreads, 0, stream, moe_count_kernel)(expert_ids, T * k, E, offsets);
  BP_LAUNCH(1u, 32u, 0, stream, moe_scan_kernel)(E, offsets);
  BP_LAUNCH(blocks, kMoeThreads, 0, stream, moe_place_kernel)(expert_ids, T * k, k, E, offsets, row_token, slot_of);
}

BP_HOST_FN void moe_gather_forward(const float* x, const int32_t* row_token, int64_t rows, int64_t D, float* xs,
                                   cudaStream_t stream = nullptr) {
  if (rows > 0 && D > 0)
    BP_LAUNCH(static_cast<unsigned>(rows), kMoeThreads, 0, stream, moe_gather_forward_kernel)(x, row_token, D, xs);
}

BP_HOST_FN void moe_gather_backward(const float* dxs, const int32_t* slot_of, int64_t T, int64_t k, int64_t D,
                                    float* dx, cudaStream_t stream = nullptr) {
  if (T > 0 && D > 0)
    BP_LAUNCH(static_cast<unsigned>(T), kMoeThreads, 0, stream, moe_gather_backward_kernel)(dxs, slot_of, k, D, dx);
}

BP_HOST_FN void moe_scatter_forward(const float* ys, const float* weights, const int32_t* slot_of, int64_t T, int64_t k,
                                    int64_t D, float* out, cudaStream_t stream = nullptr) {
  if (T > 0 && D > 0) BP_LAUNCH(static_cast<unsigned>(T), kMoeThreads, 0, stream, moe_scatter_forward_kernel)
  (ys, weights, slot_of, k, D, out);
}

BP_HOST_FN void moe_scatter_backward(const float* dout, const float* ys, const float* weights, const int32_t* slot_of,
                                     int64_t T, int64_t k, int64_t D, float* dys, float* dweights,
                                     cudaStream_t stream = nullptr) {
  if (T > 0 && k > 0) BP_LAUNCH(static_cast<unsigned>(T * k), kMoeThreads, 0, stream, moe_scatter_backward_kernel)
  (dout, ys, weights, slot_of, k, D, dys, dweights);
}

// stats: device scratch of 2·T floats (the rows' max and 1/Σexp).
BP_HOST_FN void moe_aux_accumulate(const float* logits, const int32_t* expert_ids, int64_t T, int64_t E, int64_t k,
                                   float* counts, float* prob_sum, float* stats, cudaStream_t stream = nullptr) {
  if (T > 0) BP_LAUNCH(blocks_for(T, kMoeThreads), kMoeThreads, 0, stream, moe_row_stats_kernel)(logits, T, E, stats);
  BP_LAUNCH(blocks_for(E, kMoeThreads), kMoeThreads, 0, stream, moe_aux_accumulate_kernel)
  (logits, expert_ids, stats, T, E, k, counts, prob_sum);
}

}  // namespace bp::BP_CUDA_NS
