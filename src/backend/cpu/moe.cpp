// CPU kernels of the Mixture-of-Experts ops (see backend/cpu/moe.h and ops/moe.h).
#include "backend/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace bp::cpu {

namespace {
// p = softmax(l) over E values, in f32 with the max subtracted (torch's softmax(dtype=float)).
void softmax_row(const float* l, int64_t E, float* p) {
  float mx = l[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < E; ++e) {
    p[e] = std::exp(l[e] - mx);
    sum += p[e];
  }
  const float inv = 1.0f / sum;
  for (int64_t e = 0; e < E; ++e) p[e] *= inv;
}
}  // namespace

void moe_route_forward(const float* logits, int64_t T, int64_t E, int64_t k, bool renormalize, int32_t* expert_ids,
                       float* weights) {
#pragma omp parallel if (T * E >= 4096)
  {
    std::vector<float> p(static_cast<size_t>(E));
    std::vector<int32_t> order(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      softmax_row(logits + t * E, E, p.data());
      for (int64_t e = 0; e < E; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
      // The k largest, in decreasing order; equal probabilities: the lower index first.
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)] ||
               (p[static_cast<size_t>(a)] == p[static_cast<size_t>(b)] && a < b);
      });
      float sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) sum += p[static_cast<size_t>(order[static_cast<size_t>(j)])];
      const float scale = renormalize ? 1.0f / sum : 1.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = order[static_cast<size_t>(j)];
        expert_ids[t * k + j] = e;
        weights[t * k + j] = p[static_cast<size_t>(e)] * scale;
      }
    }
  }
}

void moe_route_backward(const float* logits, const int32_t* expert_ids, const float* dweights, const float* aux_grad,
                        int64_t T, int64_t E, int64_t k, bool renormalize, float* dlogits) {
#pragma omp parallel if (T * E >= 4096)
  {
    std::vector<float> p(static_cast<size_t>(E)), dp(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      softmax_row(logits + t * E, E, p.data());
      const int32_t* ids = expert_ids + t * k;
      const float* dw = dweights + t * k;
      // dp: w_j = p_{i_j} / S (S = Σ_j p_{i_j} when renormalising, else 1):
      //   dp_{i_j} = (dw_j − Σ_m dw_m · w_m) / S.
      for (int64_t e = 0; e < E; ++e) dp[static_cast<size_t>(e)] = aux_grad ? aux_grad[e] : 0.0f;
      float S = 1.0f, dot = 0.0f;
      if (renormalize) {
        S = 0.0f;
        for (int64_t j = 0; j < k; ++j) S += p[static_cast<size_t>(ids[j])];
        for (int64_t j = 0; j < k; ++j) dot += dw[j] * p[static_cast<size_t>(ids[j])] / S;
      }
      for (int64_t j = 0; j < k; ++j) dp[static_cast<size_t>(ids[j])] += (dw[j] - dot) / S;
      // Softmax backward: dl_e = p_e · (dp_e − Σ_i p_i dp_i).
      float pdp = 0.0f;
      for (int64_t e = 0; e < E; ++e) pdp += p[static_cast<size_t>(e)] * dp[static_cast<size_t>(e)];
      for (int64_t e = 0; e < E; ++e)
        dlogits[t * E + e] = p[static_cast<size_t>(e)] * (dp[static_cast<size_t>(e)] - pdp);
    }
  }
}

void moe_sort(const int32_t* expert_ids, int64_t T, int64_t k, int64_t E, int32_t* offsets, int32_t* row_token,
              int32_t* slot_of) {
  const int64_t n = T * k;
  std::fill(offsets, offsets + E + 1, 0);
  for (int64_t a = 0; a < n; ++a) ++offsets[expert_ids[a] + 1];
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] += offsets[e];
  std::vector<int32_t> next(offsets, offsets + E);
  for (int64_t a = 0; a < n; ++a) {  // ascending a: stable within an expert
    const int32_t row = next[static_cast<size_t>(expert_ids[a])]++;
    row_token[row] = static_cast<int32_t>(a / k);
    slot_of[a] = row;
  }
}

void moe_gather_forward(const float* x, const int32_t* row_token, int64_t rows, int64_t D, float* xs) {
#pragma omp parallel for schedule(static) if (rows * D >= (int64_t{1} << 16))
  for (int64_t i = 0; i < rows; ++i) std::copy_n(x + row_token[i] * D, D, xs + i * D);
}

void moe_gather_backward(const float* dxs, const int32_t* slot_of, int64_t T, int64_t k, int64_t D, float* dx) {
#pragma omp parallel for schedule(static) if (T * k * D >= (int64_t{1} << 16))
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const float* src = dxs + static_cast<int64_t>(slot_of[t * k + j]) * D;
      float* dst = dx + t * D;
      for (int64_t d = 0; d < D; ++d) dst[d] += src[d];
    }
}

void moe_scatter_forward(const float* ys, const float* weights, const int32_t* slot_of, int64_t T, int64_t k, int64_t D,
                         float* out) {
#pragma omp parallel for schedule(static) if (T * k * D >= (int64_t{1} << 16))
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const float w = weights[t * k + j];
      const float* src = ys + static_cast<int64_t>(slot_of[t * k + j]) * D;
      float* dst = out + t * D;
      for (int64_t d = 0; d < D; ++d) dst[d] += w * src[d];
    }
}

void moe_scatter_backward(const float* dout, const float* ys, const float* weights, const int32_t* slot_of, int64_t T,
                          int64_t k, int64_t D, float* dys, float* dweights) {
#pragma omp parallel for schedule(static) if (T * k * D >= (int64_t{1} << 16))
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = slot_of[t * k + j];
      const float w = weights[t * k + j];
      const float* g = dout + t * D;
      const float* y = ys + row * D;
      float* dy = dys + row * D;
      float dot = 0.0f;
      for (int64_t d = 0; d < D; ++d) {
        dy[d] = w * g[d];
        dot += g[d] * y[d];
      }
      dweights[t * k + j] = dot;
    }
}

void moe_aux_accumulate(const float* logits, const int32_t* expert_ids, int64_t T, int64_t E, int64_t k, float* counts,
                        float* prob_sum) {
  std::vector<float> p(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    softmax_row(logits + t * E, E, p.data());
    for (int64_t e = 0; e < E; ++e) prob_sum[e] += p[static_cast<size_t>(e)];
    for (int64_t j = 0; j < k; ++j) counts[expert_ids[t * k + j]] += 1.0f;
  }
}

}  // namespace bp::cpu
