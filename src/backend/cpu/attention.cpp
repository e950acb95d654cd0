// Causal grouped-query attention over packed samples, flash-attention style, on the CPU.
//
// Layout: q/o/dq are [T, Hq·d], k/v/dk/dv are [T, Hkv·d] (token-major, heads side by side); query
// head h reads KV head h / (Hq/Hkv). Sample s owns tokens [cu[s], cu[s+1]) and a query at
// position i of its sample sees keys at positions 0..i of the same sample only.
//
// Forward, one task per (sample, query head, tile of 64 query rows), tasks in parallel: key tiles
// are visited in order; per query row an online softmax keeps the running max m and sum l,
// rescaling the accumulator (kept in the output rows, which the task owns) when m grows.
// Finally o = acc / l and lse = m + log l. Scratch is a few 64-float arrays on the stack.
//
// Backward recomputes probabilities from lse: p_ij = exp(s_ij − lse_i), with
// delta_i = Σ_c dO_ic·O_ic, dp_ij = dO_i·v_j, ds_ij = p_ij (dp_ij − delta_i):
//   dv_j = Σ_i p_ij dO_i,  dk_j = scale Σ_i ds_ij q_i,  dq_i = scale Σ_j ds_ij k_j.
// To stay race-free and deterministic without atomics it runs two passes: one task per
// (sample, KV head, key tile) owns those dk/dv rows and sums over every query head of the group
// and every later query in a fixed order; then one task per (sample, query head, query tile) owns
// its dq rows. Each pass recomputes s and dp (7 instead of 5 tile products, no reductions).
#include "backend/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cross_entropy.h"  // exp_approx

namespace bp::cpu {

namespace {

struct Task {
  int64_t sample, head, begin, end, cost;
};

inline float dot(const float* a, const float* b, int d) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int c = 0; c < d; ++c) s += a[c] * b[c];
  return s;
}

inline void axpy(float* y, float a, const float* x, int d) {
#pragma omp simd
  for (int c = 0; c < d; ++c) y[c] += a * x[c];
}

// Tasks over (sample, head, tile of rows) with a cost estimate; sorted costliest first so the
// dynamic schedule balances. The order of tasks never changes what any task computes.
template <class CostFn>
std::vector<Task> make_tasks(const int32_t* cu, int64_t n_samples, int n_heads, CostFn cost) {
  std::vector<Task> tasks;
  for (int64_t s = 0; s < n_samples; ++s) {
    const int64_t len = cu[s + 1] - cu[s];
    for (int h = 0; h < n_heads; ++h)
      for (int64_t b = 0; b < len; b += kAttentionTile) {
        const int64_t e = std::min(b + kAttentionTile, len);
        tasks.push_back({s, h, b, e, cost(len, b, e)});
      }
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.cost > b.cost; });
  return tasks;
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, const int32_t* cu, const AttentionDims& dims,
                       float* o, float* lse) {
  const int d = dims.head_dim, group = dims.n_heads / dims.n_kv_heads;
  const int64_t q_stride = int64_t{dims.n_heads} * d, kv_stride = int64_t{dims.n_kv_heads} * d, T = dims.tokens;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const auto tasks =
      make_tasks(cu, dims.n_samples, dims.n_heads, [](int64_t, int64_t b, int64_t e) { return (e - b) * e; });
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t ti = 0; ti < n_tasks; ++ti) {
    const Task& task = tasks[static_cast<size_t>(ti)];
    const int64_t base = cu[task.sample];
    const int h = static_cast<int>(task.head), g = h / group;
    const int64_t rows = task.end - task.begin;
    float m[kAttentionTile], l[kAttentionTile], sc[kAttentionTile];
    for (int64_t r = 0; r < rows; ++r) {
      m[r] = -std::numeric_limits<float>::infinity();
      l[r] = 0.0f;
      std::fill_n(o + (base + task.begin + r) * q_stride + int64_t{h} * d, d, 0.0f);
    }
    // Keys beyond the tile's last query are never visible to it.
    for (int64_t j0 = 0; j0 < task.end; j0 += kAttentionTile) {
      const int64_t j1 = std::min(j0 + kAttentionTile, task.end);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = task.begin + r;
        const int64_t jend = std::min(j1, i + 1);  // causal: keys j <= i
        if (jend <= j0) continue;
        const float* qi = q + (base + i) * q_stride + int64_t{h} * d;
        float* acc = o + (base + i) * q_stride + int64_t{h} * d;
        float tile_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = j0; j < jend; ++j) {
          const float s = scale * dot(qi, k + (base + j) * kv_stride + int64_t{g} * d, d);
          sc[j - j0] = s;
          tile_max = std::max(tile_max, s);
        }
        const float m_new = std::max(m[r], tile_max);
        if (m_new > m[r]) {  // rescale what was accumulated under the old max
          const float alpha = l[r] > 0.0f ? exp_approx(m[r] - m_new) : 0.0f;
          l[r] *= alpha;
#pragma omp simd
          for (int c = 0; c < d; ++c) acc[c] *= alpha;
          m[r] = m_new;
        }
        float sum = 0.0f;
        for (int64_t j = j0; j < jend; ++j) {
          const float p = exp_approx(sc[j - j0] - m_new);
          sum += p;
          axpy(acc, p, v + (base + j) * kv_stride + int64_t{g} * d, d);
        }
        l[r] += sum;
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = task.begin + r;
      float* acc = o + (base + i) * q_stride + int64_t{h} * d;
      const float inv = 1.0f / l[r];  // l >= 1: the row's max term contributes exp(0)
#pragma omp simd
      for (int c = 0; c < d; ++c) acc[c] *= inv;
      if (lse) lse[int64_t{h} * T + base + i] = m[r] + std::log(l[r]);
    }
  }
}

void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                        const float* lse, const int32_t* cu, const AttentionDims& dims, float* delta, float* dq,
                        float* dk, float* dv) {
  const int d = dims.head_dim, group = dims.n_heads / dims.n_kv_heads;
  const int64_t q_stride = int64_t{dims.n_heads} * d, kv_stride = int64_t{dims.n_kv_heads} * d, T = dims.tokens;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  // delta[h, t] = dO·O for each query row.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < dims.n_heads; ++h) {
      const int64_t off = t * q_stride + int64_t{h} * d;
      delta[int64_t{h} * T + t] = dot(dout + off, o + off, d);
    }

  // Pass 1: dk, dv. A task owns KV head g's rows of one key tile of one sample.
  const auto kv_tasks = make_tasks(cu, dims.n_samples, dims.n_kv_heads,
                                   [](int64_t len, int64_t b, int64_t e) { return (e - b) * (len - b); });
  const int64_t n_kv_tasks = static_cast<int64_t>(kv_tasks.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t ti = 0; ti < n_kv_tasks; ++ti) {
    const Task& task = kv_tasks[static_cast<size_t>(ti)];
    const int64_t base = cu[task.sample], len = cu[task.sample + 1] - base;
    const int g = static_cast<int>(task.head);
    for (int64_t j = task.begin; j < task.end; ++j) {
      std::fill_n(dk + (base + j) * kv_stride + int64_t{g} * d, d, 0.0f);
      std::fill_n(dv + (base + j) * kv_stride + int64_t{g} * d, d, 0.0f);
    }
    for (int h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = task.begin; i < len; ++i) {  // queries that see at least key task.begin
        const int64_t qoff = (base + i) * q_stride + int64_t{h} * d;
        const float* qi = q + qoff;
        const float* doi = dout + qoff;
        const float lse_i = lse[int64_t{h} * T + base + i], delta_i = delta[int64_t{h} * T + base + i];
        const int64_t jend = std::min(task.end, i + 1);
        for (int64_t j = task.begin; j < jend; ++j) {
          const int64_t koff = (base + j) * kv_stride + int64_t{g} * d;
          const float p = exp_approx(scale * dot(qi, k + koff, d) - lse_i);
          const float dp = dot(doi, v + koff, d);
          const float ds = p * (dp - delta_i);
          axpy(dv + koff, p, doi, d);
          axpy(dk + koff, scale * ds, qi, d);
        }
      }
    }
  }

  // Pass 2: dq. A task owns query head h's rows of one query tile of one sample.
  const auto q_tasks =
      make_tasks(cu, dims.n_samples, dims.n_heads, [](int64_t, int64_t b, int64_t e) { return (e - b) * e; });
  const int64_t n_q_tasks = static_cast<int64_t>(q_tasks.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t ti = 0; ti < n_q_tasks; ++ti) {
    const Task& task = q_tasks[static_cast<size_t>(ti)];
    const int64_t base = cu[task.sample];
    const int h = static_cast<int>(task.head), g = h / group;
    for (int64_t i = task.begin; i < task.end; ++i) std::fill_n(dq + (base + i) * q_stride + int64_t{h} * d, d, 0.0f);
    for (int64_t j0 = 0; j0 < task.end; j0 += kAttentionTile) {
      const int64_t j1 = std::min(j0 + kAttentionTile, task.end);
      for (int64_t i = std::max(task.begin, j0); i < task.end; ++i) {
        const int64_t qoff = (base + i) * q_stride + int64_t{h} * d;
        const float* qi = q + qoff;
        const float* doi = dout + qoff;
        float* dqi = dq + qoff;
        const float lse_i = lse[int64_t{h} * T + base + i], delta_i = delta[int64_t{h} * T + base + i];
        const int64_t jend = std::min(j1, i + 1);
        for (int64_t j = j0; j < jend; ++j) {
          const int64_t koff = (base + j) * kv_stride + int64_t{g} * d;
          const float p = exp_approx(scale * dot(qi, k + koff, d) - lse_i);
          const float ds = p * (dot(doi, v + koff, d) - delta_i);
          axpy(dqi, scale * ds, k + koff, d);
        }
      }
    }
  }
}

}  // namespace bp::cpu
