// Causal grouped-query attention over packed samples, flash-attention style, on the CPU.
//
// Layout: q/o/dq are [T, Hq·d], k/v/dk/dv are [T, Hkv·d] (token-major, heads side by side); query
// head h reads KV head h / (Hq/Hkv). Sample s owns tokens [cu[s], cu[s+1]) and a query at
// position i of its sample sees keys at positions 0..i of the same sample only.
//
// Forward, one task per (sample, query head, tile of 64 query rows), tasks in parallel: key tiles
// are visited in order; per query row an online softmax keeps the running max m and sum l,
// rescaling the accumulator (kept in the output rows, which the task owns) when m grows.
// Finally o = acc / l and lse = m + log l. Per-row state is a few 64-float stack arrays.
//
// Backward recomputes probabilities from lse: p_ij = exp(s_ij − lse_i), with
// delta_i = Σ_c dO_ic·O_ic, dp_ij = dO_i·v_j, ds_ij = p_ij (dp_ij − delta_i):
//   dv_j = Σ_i p_ij dO_i,  dk_j = scale Σ_i ds_ij q_i,  dq_i = scale Σ_j ds_ij k_j.
// To stay race-free and deterministic without atomics it runs two passes: one task per
// (sample, KV head, key tile) owns those dk/dv rows and sums over every query head of the group
// and every later query in a fixed order; then one task per (sample, query head, query tile) owns
// its dq rows. Each pass recomputes s and dp (7 instead of 5 tile products, no atomics).
//
// Two versions of each (CONVENTIONS.md: the plain kernel is the reference): *_plain computes
// every score as its own dot product; the default (tiled) version copies each 64-key tile of K
// and V transposed to [d × 64] scratch so a row of 64 scores is d broadcast-FMAs over contiguous
// lanes, with exp, masking and softmax vectorised over the 64 lanes; 4 query rows share each
// loaded tile row (register blocking), and the dk/dv pass accumulates transposed with rank-4
// updates. Head dims 64 and 128 get compile-time kernels, others a generic path. Tests hold the
// tiled kernels to the plain ones. The scratch (four [d × 64] tiles per thread) comes from the
// CPU allocator.
#include "backend/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cross_entropy.h"  // exp_approx
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

void attention_backward_plain(const float* dout, const float* q, const float* k, const float* v, const float* o,
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

namespace {

constexpr int64_t kB = kAttentionTile;

// dst[c·64 + jj] = src row jj, column c, for jj < n; zero for n <= jj < 64.
void transpose_tile(const float* src, int64_t stride, int64_t n, int d, float* dst) {
  for (int c = 0; c < d; ++c) {
    float* row = dst + int64_t{c} * kB;
    for (int64_t jj = 0; jj < n; ++jj) row[jj] = src[jj * stride + c];
    for (int64_t jj = n; jj < kB; ++jj) row[jj] = 0.0f;
  }
}

// out[jj] = Σ_c a[c] · t[c·64 + jj]: one query row against a transposed 64-key tile.
// D > 0 is the head dimension known at compile time (64, 128: loops fully unrolled, accumulators
// in registers); D == 0 is the generic path with the runtime d_rt.
template <int D>
inline void row_times_tile(const float* a, const float* t, int d_rt, float* out) {
  const int d = D > 0 ? D : d_rt;
  alignas(64) float acc[kB] = {};
  for (int c = 0; c < d; ++c) {
    const float ac = a[c];
    const float* tr = t + int64_t{c} * kB;
#pragma omp simd aligned(acc : 64)
    for (int64_t jj = 0; jj < kB; ++jj) acc[jj] += ac * tr[jj];
  }
#pragma omp simd
  for (int64_t jj = 0; jj < kB; ++jj) out[jj] = acc[jj];
}

// Query rows handled together against one key tile.
constexpr int kRows = 4;

// 16 floats; GCC/Clang vector extension (a zmm register with AVX-512, two ymm with AVX2).
typedef float Vec16 __attribute__((vector_size(64)));

// out[r][jj] = Σ_c a[r][c] · t[c·64 + jj] for kRows query rows at once: each loaded tile row
// feeds 4 rows' accumulators, which stay in registers (register blocking).
template <int D>
inline void rows_times_tile(const float* const* a, const float* t, int d_rt, float (*out)[kB]) {
  if constexpr (D > 0) {
    Vec16 acc[kRows][kB / 16] = {};
    for (int c = 0; c < D; ++c) {
      Vec16 tv[kB / 16];
      std::memcpy(tv, t + int64_t{c} * kB, sizeof tv);
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) {
        const float x = a[r][c];
#pragma GCC unroll 4
        for (int b = 0; b < int(kB / 16); ++b) acc[r][b] += x * tv[b];
      }
    }
    for (int r = 0; r < kRows; ++r) std::memcpy(out[r], acc[r], sizeof acc[r]);
  } else {
    for (int r = 0; r < kRows; ++r) row_times_tile<0>(a[r], t, d_rt, out[r]);
  }
}

// Probabilities of kRows query rows over a key tile: p = exp(scale·s − lse) for the nv[r]
// visible keys, 0 beyond; then ds = scale · p · (dp − delta) with dp = dO·v.
template <int D>
inline void rows_grads(const float* const* qr, const float* const* dr, const float* kt, const float* vt, int d,
                       const int64_t* nv, float scale, const float* lse_r, const float* delta_r, float (*p)[kB],
                       float (*ds)[kB]) {
  alignas(64) float s[kRows][kB], dp[kRows][kB];
  rows_times_tile<D>(qr, kt, d, s);
  rows_times_tile<D>(dr, vt, d, dp);
  for (int r = 0; r < kRows; ++r) {
    const float lse_i = lse_r[r], delta_i = delta_r[r];
    const int64_t n = nv[r];
#pragma omp simd
    for (int64_t jj = 0; jj < kB; ++jj) {
      const float e = exp_approx(scale * s[r][jj] - lse_i);
      p[r][jj] = jj < n ? e : 0.0f;
      ds[r][jj] = scale * p[r][jj] * (dp[r][jj] - delta_i);
    }
  }
}

// acc[0..d) += Σ_{jj < n} w[jj] · rows[jj·stride + 0..d): the P·V product of one query row
// (and ds·K for dq). With D known the accumulator stays in registers across the keys.
template <int D>
inline void weighted_row_sum(float* acc, const float* w, const float* rows, int64_t stride, int64_t n, int d_rt) {
  if constexpr (D > 0) {
    alignas(64) float a[D];
    for (int c = 0; c < D; ++c) a[c] = acc[c];
    for (int64_t jj = 0; jj < n; ++jj) {
      const float wj = w[jj];
      const float* r = rows + jj * stride;
#pragma omp simd aligned(a : 64)
      for (int c = 0; c < D; ++c) a[c] += wj * r[c];
    }
    for (int c = 0; c < D; ++c) acc[c] = a[c];
  } else {
    for (int64_t jj = 0; jj < n; ++jj) axpy(acc, w[jj], rows + jj * stride, d_rt);
  }
}

// t[c·64 + jj] += Σ_r x[r][c] · w[r][jj]: kRows query rows' contributions to a transposed
// [d × 64] dk or dv accumulator; the kRows weight rows stay in registers across c.
template <int D>
inline void rank_update(float* __restrict t, const float (*__restrict w)[kB], const float* const* x, int d_rt) {
  const int d = D > 0 ? D : d_rt;
  for (int c = 0; c < d; ++c) {
    const float x0 = x[0][c], x1 = x[1][c], x2 = x[2][c], x3 = x[3][c];
    float* __restrict tr = t + int64_t{c} * kB;
#pragma omp simd
    for (int64_t jj = 0; jj < kB; ++jj) tr[jj] += x0 * w[0][jj] + x1 * w[1][jj] + x2 * w[2][jj] + x3 * w[3][jj];
  }
}

// Scratch floats per thread: transposed K and V tiles, and transposed dk and dv accumulators.
int64_t scratch_floats(int d) {
  return 4 * int64_t{d} * kB;
}

}  // namespace

size_t attention_scratch_bytes(int head_dim) {
  return static_cast<size_t>(omp_get_max_threads() * scratch_floats(head_dim)) * sizeof(float);
}

namespace {

template <int D>
void forward_tiled(const float* q, const float* k, const float* v, const int32_t* cu, const AttentionDims& dims,
                   float* o, float* lse) {
  const int d = D > 0 ? D : dims.head_dim, group = dims.n_heads / dims.n_kv_heads;
  const int64_t q_stride = int64_t{dims.n_heads} * d, kv_stride = int64_t{dims.n_kv_heads} * d, T = dims.tokens;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const auto tasks =
      make_tasks(cu, dims.n_samples, dims.n_heads, [](int64_t, int64_t b, int64_t e) { return (e - b) * e; });
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  const int threads = omp_get_max_threads();
  Tensor scratch = Tensor::empty({threads, scratch_floats(d)});
  float* scratch_base = scratch.data<float>();

#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t ti = 0; ti < n_tasks; ++ti) {
    const Task& task = tasks[static_cast<size_t>(ti)];
    float* kt = scratch_base + omp_get_thread_num() * scratch_floats(d);
    const int64_t base = cu[task.sample];
    const int h = static_cast<int>(task.head), g = h / group;
    const int64_t rows = task.end - task.begin;
    float m[kB], l[kB];
    alignas(64) float sc4[kRows][kB], p[kB];
    for (int64_t r = 0; r < rows; ++r) {
      m[r] = -std::numeric_limits<float>::infinity();
      l[r] = 0.0f;
      std::fill_n(o + (base + task.begin + r) * q_stride + int64_t{h} * d, d, 0.0f);
    }
    for (int64_t j0 = 0; j0 < task.end; j0 += kB) {
      const int64_t n = std::min(kB, task.end - j0);
      transpose_tile(k + (base + j0) * kv_stride + int64_t{g} * d, kv_stride, n, d, kt);
      const float* vj0 = v + (base + j0) * kv_stride + int64_t{g} * d;
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        // Scores of up to kRows rows at once (a short last group repeats its last row).
        const float* qr[kRows];
        for (int r = 0; r < kRows; ++r)
          qr[r] = q + (base + task.begin + std::min(r0 + r, rows - 1)) * q_stride + int64_t{h} * d;
        if (task.begin + std::min(r0 + kRows, rows) - 1 < j0) continue;  // no row of the group sees this tile
        rows_times_tile<D>(qr, kt, d, sc4);
        for (int64_t row = r0; row < std::min(r0 + kRows, rows); ++row) {
          const int64_t i = task.begin + row;
          const int64_t nv = std::min(n, i + 1 - j0);  // causal: keys j <= i
          if (nv <= 0) continue;
          float* sc = sc4[row - r0];
          float* acc = o + (base + i) * q_stride + int64_t{h} * d;
          float tile_max = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : tile_max)
          for (int64_t jj = 0; jj < kB; ++jj) {
            sc[jj] *= scale;
            tile_max = std::max(tile_max, jj < nv ? sc[jj] : -std::numeric_limits<float>::infinity());
          }
          const float m_new = std::max(m[row], tile_max);
          if (m_new > m[row]) {
            const float alpha = l[row] > 0.0f ? exp_approx(m[row] - m_new) : 0.0f;
            l[row] *= alpha;
#pragma omp simd
            for (int c = 0; c < d; ++c) acc[c] *= alpha;
            m[row] = m_new;
          }
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t jj = 0; jj < kB; ++jj) {
            const float e = exp_approx(sc[jj] - m_new);
            p[jj] = jj < nv ? e : 0.0f;
            sum += p[jj];
          }
          l[row] += sum;
          weighted_row_sum<D>(acc, p, vj0, kv_stride, nv, d);
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = task.begin + r;
      float* acc = o + (base + i) * q_stride + int64_t{h} * d;
      const float inv = 1.0f / l[r];
#pragma omp simd
      for (int c = 0; c < d; ++c) acc[c] *= inv;
      if (lse) lse[int64_t{h} * T + base + i] = m[r] + std::log(l[r]);
    }
  }
}

template <int D>
void backward_tiled(const float* dout, const float* q, const float* k, const float* v, const float* o, const float* lse,
                    const int32_t* cu, const AttentionDims& dims, float* delta, float* dq, float* dk, float* dv) {
  const int d = D > 0 ? D : dims.head_dim, group = dims.n_heads / dims.n_kv_heads;
  const int64_t q_stride = int64_t{dims.n_heads} * d, kv_stride = int64_t{dims.n_kv_heads} * d, T = dims.tokens;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int threads = omp_get_max_threads();
  Tensor scratch = Tensor::empty({threads, scratch_floats(d)});
  float* scratch_base = scratch.data<float>();

#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < dims.n_heads; ++h) {
      const int64_t off = t * q_stride + int64_t{h} * d;
      delta[int64_t{h} * T + t] = dot(dout + off, o + off, d);
    }

  // Pass 1: dk, dv; a task owns KV head g's rows of one key tile of one sample.
  const auto kv_tasks = make_tasks(cu, dims.n_samples, dims.n_kv_heads,
                                   [](int64_t len, int64_t b, int64_t e) { return (e - b) * (len - b); });
  const int64_t n_kv_tasks = static_cast<int64_t>(kv_tasks.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t ti = 0; ti < n_kv_tasks; ++ti) {
    const Task& task = kv_tasks[static_cast<size_t>(ti)];
    float* kt = scratch_base + omp_get_thread_num() * scratch_floats(d);
    float* vt = kt + int64_t{d} * kB;
    const int64_t base = cu[task.sample], len = cu[task.sample + 1] - base;
    const int g = static_cast<int>(task.head);
    const int64_t j0 = task.begin, n = task.end - task.begin;
    const int64_t koff0 = (base + j0) * kv_stride + int64_t{g} * d;
    transpose_tile(k + koff0, kv_stride, n, d, kt);
    transpose_tile(v + koff0, kv_stride, n, d, vt);
    // dk, dv accumulate transposed ([d × 64], like kt/vt) so that 4 query rows at a time update
    // them with a rank-4 product instead of one store per (row, key) pair.
    float* dkt = vt + int64_t{d} * kB;
    float* dvt = dkt + int64_t{d} * kB;
    std::fill_n(dkt, 2 * int64_t{d} * kB, 0.0f);
    alignas(64) float p[kRows][kB], ds[kRows][kB];
    for (int h = g * group; h < (g + 1) * group; ++h)
      for (int64_t i0 = j0; i0 < len; i0 += kRows) {
        const float* qr[kRows];
        const float* dr[kRows];
        int64_t nv[kRows];
        float lse_r[kRows], delta_r[kRows];
        for (int r = 0; r < kRows; ++r) {  // rows past the sample repeat the last one with no keys
          const int64_t i = std::min(i0 + r, len - 1);
          const int64_t qoff = (base + i) * q_stride + int64_t{h} * d;
          qr[r] = q + qoff;
          dr[r] = dout + qoff;
          nv[r] = i0 + r < len ? std::min(n, i + 1 - j0) : 0;
          lse_r[r] = lse[int64_t{h} * T + base + i];
          delta_r[r] = delta[int64_t{h} * T + base + i];
        }
        rows_grads<D>(qr, dr, kt, vt, d, nv, scale, lse_r, delta_r, p, ds);
        rank_update<D>(dvt, p, dr, d);
        rank_update<D>(dkt, ds, qr, d);
      }
    for (int64_t jj = 0; jj < n; ++jj)
      for (int c = 0; c < d; ++c) {
        dk[koff0 + jj * kv_stride + c] = dkt[int64_t{c} * kB + jj];
        dv[koff0 + jj * kv_stride + c] = dvt[int64_t{c} * kB + jj];
      }
  }

  // Pass 2: dq; a task owns query head h's rows of one query tile of one sample.
  const auto q_tasks =
      make_tasks(cu, dims.n_samples, dims.n_heads, [](int64_t, int64_t b, int64_t e) { return (e - b) * e; });
  const int64_t n_q_tasks = static_cast<int64_t>(q_tasks.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t ti = 0; ti < n_q_tasks; ++ti) {
    const Task& task = q_tasks[static_cast<size_t>(ti)];
    float* kt = scratch_base + omp_get_thread_num() * scratch_floats(d);
    float* vt = kt + int64_t{d} * kB;
    const int64_t base = cu[task.sample];
    const int h = static_cast<int>(task.head), g = h / group;
    for (int64_t i = task.begin; i < task.end; ++i) std::fill_n(dq + (base + i) * q_stride + int64_t{h} * d, d, 0.0f);
    alignas(64) float p[kRows][kB], ds[kRows][kB];
    for (int64_t j0 = 0; j0 < task.end; j0 += kB) {
      const int64_t n = std::min(kB, task.end - j0);
      const int64_t koff0 = (base + j0) * kv_stride + int64_t{g} * d;
      transpose_tile(k + koff0, kv_stride, n, d, kt);
      transpose_tile(v + koff0, kv_stride, n, d, vt);
      for (int64_t i0 = std::max(task.begin, j0); i0 < task.end; i0 += kRows) {
        const float* qr[kRows];
        const float* dr[kRows];
        int64_t nv[kRows];
        float lse_r[kRows], delta_r[kRows];
        for (int r = 0; r < kRows; ++r) {  // rows past the tile repeat the last one with no keys
          const int64_t i = std::min(i0 + r, task.end - 1);
          const int64_t qoff = (base + i) * q_stride + int64_t{h} * d;
          qr[r] = q + qoff;
          dr[r] = dout + qoff;
          nv[r] = i0 + r < task.end ? std::min(n, i + 1 - j0) : 0;
          lse_r[r] = lse[int64_t{h} * T + base + i];
          delta_r[r] = delta[int64_t{h} * T + base + i];
        }
        rows_grads<D>(qr, dr, kt, vt, d, nv, scale, lse_r, delta_r, p, ds);
        for (int r = 0; r < kRows && i0 + r < task.end; ++r)
          weighted_row_sum<D>(dq + (base + i0 + r) * q_stride + int64_t{h} * d, ds[r], k + koff0, kv_stride, nv[r], d);
      }
    }
  }
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, const int32_t* cu, const AttentionDims& dims,
                       float* o, float* lse) {
  switch (dims.head_dim) {
    case 64: return forward_tiled<64>(q, k, v, cu, dims, o, lse);
    case 128: return forward_tiled<128>(q, k, v, cu, dims, o, lse);
    default: return forward_tiled<0>(q, k, v, cu, dims, o, lse);
  }
}

void attention_backward(const float* dout, const float* q, const float* k, const float* v, const float* o,
                        const float* lse, const int32_t* cu, const AttentionDims& dims, float* delta, float* dq,
                        float* dk, float* dv) {
  switch (dims.head_dim) {
    case 64: return backward_tiled<64>(dout, q, k, v, o, lse, cu, dims, delta, dq, dk, dv);
    case 128: return backward_tiled<128>(dout, q, k, v, o, lse, cu, dims, delta, dq, dk, dv);
    default: return backward_tiled<0>(dout, q, k, v, o, lse, cu, dims, delta, dq, dk, dv);
  }
}

}  // namespace bp::cpu
