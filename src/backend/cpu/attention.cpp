// Causal grouped-query attention over packed samples on the CPU: the bulk of the work as sgemm.
//
// Layout: q/o/dq are [T, Hq·d], k/v/dk/dv are [T, Hkv·d] (token-major, heads side by side); query
// head h reads KV head g = h / (Hq/Hkv). Sample s owns tokens [cu[s], cu[s+1]) and a query at
// position i of its sample sees keys at positions 0..i of the same sample only. A head's slice of
// q, k, v is a strided row-major matrix (leading dimension Hq·d or Hkv·d), so the GEMMs read and
// write the tensors in place, without copies.
//
// Forward, one task per (sample, query head, block of up to 64 query rows [i0, i1)), in parallel:
//   S = scale · Q[i0:i1] · K[0:i1]ᵀ               (sgemm; keys past the block's last row are never
//                                                  visible to it, so they are not computed)
//   per row i: m = max_{j<=i} S_ij, P_ij = exp(S_ij − m) for j <= i, 0 beyond; l = Σ_j P_ij;
//   lse_i = m + log l;  O[i0:i1] = P · V[0:i1] (sgemm), then each row divided by its l.
// The scores of one block live in a [rows × i1] per-thread workspace: memory grows with the
// sample length, never with its square.
//
// Backward (FlashAttention-2 math, probabilities recomputed from lse), one task per (sample,
// query head), visiting its query blocks from the last to the first:
//   P = exp(scale · Q_blk·Kᵀ − lse) (masked), dP = dO_blk · Vᵀ, delta_i = Σ_c dO_ic·O_ic,
//   dS = scale · P ∘ (dP − delta);  dQ_blk = dS · K;  dK[0:i1] += dSᵀ · Q_blk;  dV[0:i1] += Pᵀ · dO_blk.
// The last block spans every key of the sample, so it initialises dK/dV (beta 0) and the earlier
// ones accumulate (beta 1). With grouped heads several query heads feed one KV head: rather than
// one task per KV head (SmolLM: 3 tasks for 2 threads), each query head writes its own partial
// dK/dV into a [T, Hq·d] buffer and a last pass sums the group in a fixed order, so results do
// not depend on the thread count or the schedule. With Hq = Hkv the tasks write dk/dv directly.
//
// BLAS inside OpenMP regions: the project links Debian's OpenMP build of OpenBLAS. That build
// checks omp_in_parallel() and runs a call made inside an active parallel region on the calling
// thread only (no nested team, no shared BLAS thread pool to race on), which is what per-task
// GEMMs want; outside a region (1 thread) it uses omp_get_max_threads() = 1. This file relies on
// that; gemm.h's "never inside an OpenMP region" rule stands everywhere else. (With the pthread
// build the calls would all go through one thread pool — serialised and slower, still correct.)
//
// Options (AttentionDims): a window W restricts query i to keys i-W < j <= i: the blocked forward
// computes a block's scores only over keys [first key of its first row, i1) (at most 64 + W - 1
// of them, so the scratch shrinks too), the backward likewise, and the plain kernels skip the key
// tiles no row of theirs sees. dK/dV rows a later (higher) block already wrote are accumulated
// (beta 1), the others initialised (beta 0): with a window, an earlier block reaches keys no later
// block did. scale replaces 1/sqrt(d); a soft cap c maps each scaled score s to c·tanh(s/c)
// before the mask and softmax, and the backward multiplies dS by 1 - tanh².
//
// The softmax rows of the blocked kernels (max, exp and sum; probabilities and score gradients)
// are hand-vectorised, one variant per instruction set (kernel_variants.h): GCC does not vectorise
// exp_approx inside these loops (the omp simd versions ran scalar and took 60% of the forward).
// So are the soft cap's tanh and its slope (softcap, capped_probs_and_score_grads: tanh_approx_t);
// the plain kernels keep std::tanh.
//
// Two versions of each (CONVENTIONS.md: the plain kernel is the reference): *_plain computes
// every score as its own dot product with an online softmax over 64-key tiles; the default
// (blocked) version above. Tests hold the blocked kernels to the plain ones. The workspaces come
// from the CPU allocator (sizes: attention_*_scratch_floats, used by the memory plan).
#include "backend/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "backend/cpu/cross_entropy.h"  // exp_approx
#include "backend/cpu/elementwise.h"    // round_to_bf16
#include "backend/cpu/gemm.h"
#include "backend/cpu/kernel_variants.h"  // the softmax rows, per instruction set
#include "core/tensor.h"

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

// A scaled score after the soft cap c (none when c = 0).
inline float capped(float s, float cap) {
  return cap > 0.0f ? cap * std::tanh(s / cap) : s;
}

// d capped / d s at a capped score s = c·tanh(x): 1 - tanh(x)²; 1 without a cap.
inline float cap_slope(float s, float cap) {
  if (cap <= 0.0f) return 1.0f;
  const float t = s / cap;
  return 1.0f - t * t;
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

void attention_forward_plain(const float* q, const float* k, const float* v, const int32_t* cu,
                             const AttentionDims& dims, float* o, float* lse) {
  const int d = dims.head_dim, group = dims.n_heads / dims.n_kv_heads;
  const int64_t q_stride = int64_t{dims.n_heads} * d, kv_stride = int64_t{dims.n_kv_heads} * d, T = dims.tokens;
  const float scale = attention_scale(dims), cap = dims.softcap;
  const auto tasks = make_tasks(cu, dims.n_samples, dims.n_heads, [&](int64_t, int64_t b, int64_t e) {
    return (e - b) * (e - attention_first_key(dims, b));
  });
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
    // Keys beyond the tile's last query, or before its first query's window, are never visible to it.
    for (int64_t j0 = attention_first_key(dims, task.begin) / kAttentionTile * kAttentionTile; j0 < task.end;
         j0 += kAttentionTile) {
      const int64_t j1 = std::min(j0 + kAttentionTile, task.end);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = task.begin + r;
        const int64_t jbeg = std::max(j0, attention_first_key(dims, i)), jend = std::min(j1, i + 1);  // causal: j <= i
        if (jend <= jbeg) continue;
        const float* qi = q + (base + i) * q_stride + int64_t{h} * d;
        float* acc = o + (base + i) * q_stride + int64_t{h} * d;
        float tile_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = jbeg; j < jend; ++j) {
          const float s = capped(scale * dot(qi, k + (base + j) * kv_stride + int64_t{g} * d, d), cap);
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
        for (int64_t j = jbeg; j < jend; ++j) {
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

void attention_backward_plain(const float* dout, const float* q, const float* k, const float* v, const float* o,
                              const float* lse, const int32_t* cu, const AttentionDims& dims, float* delta, float* dq,
                              float* dk, float* dv) {
  const int d = dims.head_dim, group = dims.n_heads / dims.n_kv_heads;
  const int64_t q_stride = int64_t{dims.n_heads} * d, kv_stride = int64_t{dims.n_kv_heads} * d, T = dims.tokens;
  const float scale = attention_scale(dims), cap = dims.softcap;

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
    // Queries that see at least one key of the tile: i >= task.begin, and i < task.end - 1 + W.
    const int64_t i_end = dims.window > 0 ? std::min(len, task.end - 1 + dims.window) : len;
    for (int h = g * group; h < (g + 1) * group; ++h) {
      for (int64_t i = task.begin; i < i_end; ++i) {
        const int64_t qoff = (base + i) * q_stride + int64_t{h} * d;
        const float* qi = q + qoff;
        const float* doi = dout + qoff;
        const float lse_i = lse[int64_t{h} * T + base + i], delta_i = delta[int64_t{h} * T + base + i];
        const int64_t jend = std::min(task.end, i + 1);
        for (int64_t j = std::max(task.begin, attention_first_key(dims, i)); j < jend; ++j) {
          const int64_t koff = (base + j) * kv_stride + int64_t{g} * d;
          const float s = capped(scale * dot(qi, k + koff, d), cap);
          const float p = exp_approx(s - lse_i);
          const float dp = dot(doi, v + koff, d);
          const float ds = p * (dp - delta_i) * cap_slope(s, cap);
          axpy(dv + koff, p, doi, d);
          axpy(dk + koff, scale * ds, qi, d);
        }
      }
    }
  }

  // Pass 2: dq. A task owns query head h's rows of one query tile of one sample.
  const auto q_tasks = make_tasks(cu, dims.n_samples, dims.n_heads, [&](int64_t, int64_t b, int64_t e) {
    return (e - b) * (e - attention_first_key(dims, b));
  });
  const int64_t n_q_tasks = static_cast<int64_t>(q_tasks.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t ti = 0; ti < n_q_tasks; ++ti) {
    const Task& task = q_tasks[static_cast<size_t>(ti)];
    const int64_t base = cu[task.sample];
    const int h = static_cast<int>(task.head), g = h / group;
    for (int64_t i = task.begin; i < task.end; ++i) std::fill_n(dq + (base + i) * q_stride + int64_t{h} * d, d, 0.0f);
    for (int64_t j0 = attention_first_key(dims, task.begin) / kAttentionTile * kAttentionTile; j0 < task.end;
         j0 += kAttentionTile) {
      const int64_t j1 = std::min(j0 + kAttentionTile, task.end);
      for (int64_t i = std::max(task.begin, j0); i < task.end; ++i) {
        const int64_t qoff = (base + i) * q_stride + int64_t{h} * d;
        const float* qi = q + qoff;
        const float* doi = dout + qoff;
        float* dqi = dq + qoff;
        const float lse_i = lse[int64_t{h} * T + base + i], delta_i = delta[int64_t{h} * T + base + i];
        const int64_t jend = std::min(j1, i + 1);
        for (int64_t j = std::max(j0, attention_first_key(dims, i)); j < jend; ++j) {
          const int64_t koff = (base + j) * kv_stride + int64_t{g} * d;
          const float s = capped(scale * dot(qi, k + koff, d), cap);
          const float p = exp_approx(s - lse_i);
          const float ds = p * (dot(doi, v + koff, d) - delta_i) * cap_slope(s, cap);
          axpy(dqi, scale * ds, k + koff, d);
        }
      }
    }
  }
}

namespace {

constexpr int64_t kB = kAttentionTile;  // query rows per block

int64_t max_sample_length(const int32_t* cu, int64_t n_samples) {
  int64_t m = 0;
  for (int64_t s = 0; s < n_samples; ++s) m = std::max<int64_t>(m, cu[s + 1] - cu[s]);
  return m;
}

// One block's [rows × keys] score matrix for samples of at most max_len tokens: a block of up to
// 64 rows sees at most 64 + W - 1 keys with a window W, the whole sample without.
int64_t block_floats(int64_t max_len, int64_t window) {
  const int64_t keys = window > 0 ? std::min(max_len, kB + window - 1) : max_len;
  return std::min(kB, max_len) * keys;
}

}  // namespace

int64_t attention_forward_scratch_floats(int64_t max_len, const AttentionDims& dims, int threads) {
  return int64_t{threads} * block_floats(max_len, dims.window);
}

int64_t attention_backward_scratch_floats(int64_t max_len, const AttentionDims& dims, int threads) {
  const int64_t partials = dims.n_heads > dims.n_kv_heads ? 2 * dims.tokens * dims.n_heads * dims.head_dim : 0;
  return int64_t{threads} * 2 * block_floats(max_len, dims.window) + partials;
}

void attention_forward(const float* q, const float* k, const float* v, const int32_t* cu, const AttentionDims& dims,
                       float* o, uint16_t* o_bf16, float* lse) {
  const int d = dims.head_dim, group = dims.n_heads / dims.n_kv_heads;
  const int64_t q_stride = int64_t{dims.n_heads} * d, kv_stride = int64_t{dims.n_kv_heads} * d, T = dims.tokens;
  const float scale = attention_scale(dims), cap = dims.softcap;
  const auto tasks = make_tasks(cu, dims.n_samples, dims.n_heads, [&](int64_t, int64_t b, int64_t e) {
    return (e - b) * (e - attention_first_key(dims, b));
  });
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  const int64_t max_len = max_sample_length(cu, dims.n_samples), per_thread = block_floats(max_len, dims.window);
  const int threads = omp_get_max_threads();
  Tensor scratch = Tensor::empty({attention_forward_scratch_floats(max_len, dims, threads)});
  float* scratch_base = scratch.data<float>();
  const KernelTable& kern = cpu_kernels();

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t ti = 0; ti < n_tasks; ++ti) {
    const Task& task = tasks[static_cast<size_t>(ti)];
    float* s = scratch_base + omp_get_thread_num() * per_thread;
    const int64_t base = cu[task.sample];
    const int h = static_cast<int>(task.head), g = h / group;
    // Keys klo..end-1 of the sample: klo is the first row's first visible key (0 without a window).
    const int64_t klo = attention_first_key(dims, task.begin);
    const int64_t rows = task.end - task.begin, keys = task.end - klo;
    const float* qb = q + (base + task.begin) * q_stride + int64_t{h} * d;
    const float* kb = k + (base + klo) * kv_stride + int64_t{g} * d;
    const float* vb = v + (base + klo) * kv_stride + int64_t{g} * d;
    float* ob = o + (base + task.begin) * q_stride + int64_t{h} * d;
    sgemm(false, true, rows, keys, d, scale, qb, q_stride, kb, kv_stride, 0.0f, s, keys);
    float inv_l[kB];
    for (int64_t r = 0; r < rows; ++r) {
      float* row = s + r * keys;
      const int64_t i = task.begin + r;
      const int64_t lo = attention_first_key(dims, i) - klo, n = i + 1 - klo;  // row's keys [lo, n)
      if (cap > 0.0f) kern.softcap(row + lo, nullptr, n - lo, cap);
      const float m = kern.row_max(row + lo, n - lo);
      const float l = kern.exp_shifted_sum(row + lo, n - lo, m);
      std::fill(row, row + lo, 0.0f);
      std::fill(row + n, row + keys, 0.0f);
      inv_l[r] = 1.0f / l;  // l >= 1: the row's max term contributes exp(0)
      if (lse) lse[int64_t{h} * T + base + task.begin + r] = m + std::log(l);
    }
    sgemm(false, false, rows, d, keys, 1.0f, s, keys, vb, kv_stride, 0.0f, ob, q_stride);
    for (int64_t r = 0; r < rows; ++r) {
      float* orow = ob + r * q_stride;
#pragma omp simd
      for (int c = 0; c < d; ++c) orow[c] *= inv_l[r];
    }
  }
  if (o_bf16) round_to_bf16(o, o_bf16, T * q_stride);
}

void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                        const float* lse, const int32_t* cu, const AttentionDims& dims, float* delta, float* dq,
                        float* dk, float* dv, uint16_t* dv_bf16) {
  const int d = dims.head_dim, group = dims.n_heads / dims.n_kv_heads;
  const int64_t q_stride = int64_t{dims.n_heads} * d, kv_stride = int64_t{dims.n_kv_heads} * d, T = dims.tokens;
  const float scale = attention_scale(dims), cap = dims.softcap;
  const int64_t max_len = max_sample_length(cu, dims.n_samples), per_thread = 2 * block_floats(max_len, dims.window);
  const int threads = omp_get_max_threads();
  Tensor scratch = Tensor::empty({attention_backward_scratch_floats(max_len, dims, threads)});
  float* scratch_base = scratch.data<float>();
  // Partial dk/dv of each query head, [T, Hq·d] each, after the per-thread blocks; with Hq = Hkv
  // the tasks write dk/dv themselves.
  float* dk_part = group > 1 ? scratch_base + threads * per_thread : dk;
  float* dv_part = group > 1 ? dk_part + T * q_stride : dv;
  const int64_t part_stride = group > 1 ? q_stride : kv_stride;
  const KernelTable& kern = cpu_kernels();

#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < dims.n_heads; ++h) {
      const int64_t off = t * q_stride + int64_t{h} * d;
      delta[int64_t{h} * T + t] = dot(dout + off, o + off, d);
    }

  // One task per (sample, query head); cost ~ len × the keys a row sees.
  std::vector<Task> tasks;
  for (int64_t s = 0; s < dims.n_samples; ++s) {
    const int64_t len = cu[s + 1] - cu[s];
    const int64_t span = dims.window > 0 ? std::min(len, dims.window + kB) : len;
    if (len > 0)
      for (int h = 0; h < dims.n_heads; ++h) tasks.push_back({s, h, 0, len, len * span});
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.cost > b.cost; });
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t ti = 0; ti < n_tasks; ++ti) {
    const Task& task = tasks[static_cast<size_t>(ti)];
    float* p = scratch_base + omp_get_thread_num() * per_thread;
    float* ds = p + per_thread / 2;
    const int64_t base = cu[task.sample], len = task.end;
    const int h = static_cast<int>(task.head), g = h / group;
    const float* kb = k + base * kv_stride + int64_t{g} * d;
    const float* vb = v + base * kv_stride + int64_t{g} * d;
    // This head's partial dk/dv rows of the sample (or dk/dv themselves when group == 1).
    float* dkb = dk_part + base * part_stride + int64_t{group > 1 ? h : g} * d;
    float* dvb = dv_part + base * part_stride + int64_t{group > 1 ? h : g} * d;
    const int64_t last = (len - 1) / kB * kB;
    for (int64_t i0 = last; i0 >= 0; i0 -= kB) {
      // The block's keys [klo, i1): klo is its first row's first visible key (0 without a window).
      const int64_t rows = std::min(kB, len - i0), i1 = i0 + rows, klo = attention_first_key(dims, i0), keys = i1 - klo;
      const int64_t qoff = (base + i0) * q_stride + int64_t{h} * d;
      const float* qb = q + qoff;
      const float* dob = dout + qoff;
      sgemm(false, true, rows, keys, d, scale, qb, q_stride, kb + klo * kv_stride, kv_stride, 0.0f, p, keys);
      sgemm(false, true, rows, keys, d, 1.0f, dob, q_stride, vb + klo * kv_stride, kv_stride, 0.0f, ds, keys);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r, lo = attention_first_key(dims, i) - klo, n = i + 1 - klo;  // keys [lo, n)
        const float lse_i = lse[int64_t{h} * T + base + i], delta_i = delta[int64_t{h} * T + base + i];
        float* prow = p + r * keys;
        float* dsrow = ds + r * keys;
        if (cap > 0.0f) {
          kern.capped_probs_and_score_grads(prow + lo, dsrow + lo, n - lo, lse_i, delta_i, scale, cap);
        } else {
          kern.probs_and_score_grads(prow + lo, dsrow + lo, n - lo, lse_i, delta_i, scale);
        }
        std::fill(prow, prow + lo, 0.0f);
        std::fill(dsrow, dsrow + lo, 0.0f);
        std::fill(prow + n, prow + keys, 0.0f);
        std::fill(dsrow + n, dsrow + keys, 0.0f);
      }
      sgemm(false, false, rows, d, keys, 1.0f, ds, keys, kb + klo * kv_stride, kv_stride, 0.0f, dq + qoff, q_stride);
      // The later blocks wrote dK/dV rows [klo_next, len) (all of them without a window): those
      // accumulate (beta 1), rows [klo, klo_next) are initialised (beta 0).
      const int64_t klo_next = i0 == last ? i1 : attention_first_key(dims, i0 + kB), fresh = klo_next - klo;
      const std::tuple<int64_t, int64_t, float> parts[] = {{klo, fresh, 0.0f}, {klo_next, keys - fresh, 1.0f}};
      for (const auto& [rows0, n_keys, beta] : parts) {
        if (n_keys <= 0) continue;
        const int64_t col = rows0 - klo;
        sgemm(true, false, n_keys, d, rows, 1.0f, ds + col, keys, qb, q_stride, beta, dkb + rows0 * part_stride,
              part_stride);
        sgemm(true, false, n_keys, d, rows, 1.0f, p + col, keys, dob, q_stride, beta, dvb + rows0 * part_stride,
              part_stride);
      }
    }
  }

  if (group > 1) {
    // dk/dv of KV head g = Σ of its query heads' partials, in head order.
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t)
      for (int g = 0; g < dims.n_kv_heads; ++g) {
        float* dkt = dk + t * kv_stride + int64_t{g} * d;
        float* dvt = dv + t * kv_stride + int64_t{g} * d;
        const float* pk = dk_part + t * q_stride + int64_t{g} * group * d;
        const float* pv = dv_part + t * q_stride + int64_t{g} * group * d;
        std::copy(pk, pk + d, dkt);
        std::copy(pv, pv + d, dvt);
        for (int j = 1; j < group; ++j) {
          axpy(dkt, 1.0f, pk + int64_t{j} * d, d);
          axpy(dvt, 1.0f, pv + int64_t{j} * d, d);
        }
      }
  }
  if (dv_bf16) round_to_bf16(dv, dv_bf16, T * kv_stride);
}

}  // namespace bp::cpu
