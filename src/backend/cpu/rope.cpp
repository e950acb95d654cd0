// CPU RoPE, Hugging Face rotate_half layout: pair i of a head is (x[i], x[i + d/2]).
//   out[i]       = x[i]·cos − x[i+d/2]·sin
//   out[i+d/2]   = x[i+d/2]·cos + x[i]·sin
// The angle is formed as HF does, in f32: angle = float(pos) · inv_freq[i]; cos/sin of that f32
// angle are then taken in double and rounded, i.e. the correctly rounded f32 values.
// Parallel over tokens; each token computes its d/2 cos/sin once and applies them to all heads of
// both targets (q and k), then writes each row's bf16 copy when asked while it is in cache.
#include "backend/cpu/rope.h"

#include <cmath>
#include <vector>

#include "backend/cpu/elementwise.h"  // round_to_bf16_serial

namespace bp::cpu {

namespace {
// One head's pairs (lo[i], lo[i + half]) rotated in place; kBias: bias added first (the branch
// outside the vector loop). half = rot_dim/2; the dims from rot_dim to head_dim pass through.
template <bool kBias>
void rotate_head(float* lo, const float* bias, const float* cos_v, const float* sin_v, int64_t half, int64_t head_dim) {
  float* hi = lo + half;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float c = cos_v[i], s = sin_v[i];
    const float a = kBias ? lo[i] + bias[i] : lo[i], b = kBias ? hi[i] + bias[i + half] : hi[i];
    lo[i] = a * c - b * s;
    hi[i] = b * c + a * s;
  }
  if (kBias)
    for (int64_t i = 2 * half; i < head_dim; ++i) lo[i] += bias[i];
}

// One token's row of `t`: every head (+ its bias) rotated by the token's cos/sin, then its bf16 copy.
void rotate_row(const RopeTarget& t, int64_t token, const float* cos_v, const float* sin_v, int64_t head_dim,
                int64_t half) {
  const int64_t width = t.n_heads * head_dim;
  float* row = t.x + token * width;
  for (int64_t h = 0; h < t.n_heads; ++h) {
    if (t.bias)
      rotate_head<true>(row + h * head_dim, t.bias + h * head_dim, cos_v, sin_v, half, head_dim);
    else
      rotate_head<false>(row + h * head_dim, nullptr, cos_v, sin_v, half, head_dim);
  }
  if (t.x_bf16) round_to_bf16_serial(row, t.x_bf16 + token * width, width);
}
}  // namespace

void rope_apply(RopeTarget a, RopeTarget b, const int32_t* positions, const float* inv_freq, int64_t T,
                int64_t head_dim, int64_t rot_dim, float attn_scale, bool inverse) {
  const int64_t half = rot_dim / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  const int64_t heads = a.n_heads + (b.x ? b.n_heads : 0);
#pragma omp parallel if (T * heads * head_dim >= (1 << 14))
  {
    std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        // HF: cos(angle) in f32, then · attention_scaling (f32)
        cos_v[static_cast<size_t>(i)] = static_cast<float>(std::cos(static_cast<double>(angle))) * attn_scale;
        sin_v[static_cast<size_t>(i)] = sign * (static_cast<float>(std::sin(static_cast<double>(angle))) * attn_scale);
      }
      rotate_row(a, t, cos_v.data(), sin_v.data(), head_dim, half);
      if (b.x) rotate_row(b, t, cos_v.data(), sin_v.data(), head_dim, half);
    }
  }
}

}  // namespace bp::cpu
