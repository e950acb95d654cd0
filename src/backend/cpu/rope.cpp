// CPU RoPE, Hugging Face rotate_half layout: pair i of a head is (x[i], x[i + d/2]).
//   out[i]       = x[i]·cos − x[i+d/2]·sin
//   out[i+d/2]   = x[i+d/2]·cos + x[i]·sin
// The angle is formed as HF does, in f32: angle = float(pos) · inv_freq[i]; cos/sin of that f32
// angle are then taken in double and rounded, i.e. the correctly rounded f32 values.
// Parallel over tokens; each token computes its d/2 cos/sin once and applies them to all heads,
// then writes the row's bf16 copy when asked while it is in cache.
#include "backend/cpu/rope.h"

#include <cmath>
#include <vector>

#include "backend/cpu/elementwise.h"  // round_to_bf16_serial

namespace bp::cpu {

void rope_apply(float* x, const int32_t* positions, const float* inv_freq, int64_t T, int64_t n_heads, int64_t head_dim,
                bool inverse, uint16_t* x_bf16) {
  const int64_t half = head_dim / 2;
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel if (T * n_heads * head_dim >= (1 << 14))
  {
    std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float pos = static_cast<float>(positions[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * inv_freq[i];
        cos_v[static_cast<size_t>(i)] = static_cast<float>(std::cos(static_cast<double>(angle)));
        sin_v[static_cast<size_t>(i)] = sign * static_cast<float>(std::sin(static_cast<double>(angle)));
      }
      float* row = x + t * n_heads * head_dim;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* lo = row + h * head_dim;
        float* hi = lo + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float c = cos_v[static_cast<size_t>(i)], s = sin_v[static_cast<size_t>(i)];
          const float a = lo[i], b = hi[i];
          lo[i] = a * c - b * s;
          hi[i] = b * c + a * s;
        }
      }
      if (x_bf16) round_to_bf16_serial(row, x_bf16 + t * n_heads * head_dim, n_heads * head_dim);
    }
  }
}

}  // namespace bp::cpu
