// CPU kernel of fused linear + cross-entropy (contract: ops/cross_entropy.h).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/quant_gemm.h"

namespace bp::cpu {

struct CrossEntropyTotals {
  double loss_sum = 0.0;
  int64_t n_counted = 0;
};

// x [T, D], W [V, D] (f32, or a weight held in bf16/f16/a block type: backend/cpu/quant_gemm.h; dW
// only for f32 or the bf16 GEMM copy of a trainable head, and it does not read W), labels [T] (already validated: −100
// or in [0, V)). logits_chunk is the workspace, at least cross_entropy_max_window(labels, T, chunk)·V floats. When dx
// is non-null it is overwritten with grad_scale·(softmax − onehot)·W (zero rows for ignored tokens); when dW is
// non-null it gets grad_scale·(softmax − onehot)ᵀ·x added.
CrossEntropyTotals linear_cross_entropy(const float* x, const HeldMatrix& W, const int32_t* labels, int64_t T,
                                        int64_t D, int64_t V, int64_t chunk, float* logits_chunk, float grad_scale,
                                        float* dx, float* dW, float softcap = 0.0f);

// The rows the kernel computes logits for come in windows: from token t, skip ignored labels to
// `begin`, then take at most `chunk` rows trimmed after their last labelled one, [begin, end).
// begin == T when no labelled token is left. Spans of −100 labels (SFT prompts) are never inside
// a window unless a labelled token follows them within the same `chunk` rows.
struct CrossEntropyWindow {
  int64_t begin = 0, end = 0;
};
CrossEntropyWindow cross_entropy_window(const int32_t* labels, int64_t T, int64_t t, int64_t chunk);
// The most rows of any window over these labels (0 when none is labelled, at most min(chunk, T)):
// the logits workspace the kernel needs, in rows of V floats.
int64_t cross_entropy_max_window(const int32_t* labels, int64_t T, int64_t chunk);

// exp(x) for x <= 0-ish arguments in softmax loops: Cephes-style range reduction and a degree-6
// polynomial (relative error ~2e-7). Inputs below −87 return ~1e-38 instead of an underflowing 0.
// F is float or a GCC vector of floats (attention's 16-lane VecF), I the int32 of the same width:
// one formula for the scalar and the hand-vectorised loops. n = round(x·log2 e) comes from adding
// and subtracting 1.5·2^23 (the sum's low mantissa bits hold n), not from floor() and a float->int
// conversion, which GCC does not vectorise while FP traps must be kept (measured: the floor()
// form compiled to scalar code in every loop that used it). Needs IEEE arithmetic: -ffast-math
// could fold (t − 1.5·2^23) back to x·log2 e.
// Always inlined: kernels_avx2/avx512.cpp instantiate it under other target flags, and an
// out-of-line copy shared by name could be the one generic code ends up calling.
template <class F, class I>
[[gnu::always_inline]] inline F exp_approx_t(F x) {
  const F lo = F{} - 87.0f, hi = F{} + 88.0f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  constexpr float kShift = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer in the low bits
  const F t = x * 1.44269504088896341f + kShift;
  const F n = t - kShift;
  // x − n·ln2 with ln2 split in a high part exact in f32 and a low correction.
  const F r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const I bits = (std::bit_cast<I>(t) - 0x4B400000 + 127) << 23;  // 2^n: n + 127 in the exponent field
  return p * std::bit_cast<F>(bits);
}

// tanh(x) for float or a GCC float vector F (I: int32 of the same width), the formula of every
// variant's kernels and their scalar tails: |x| < 0.4, the odd Taylor series to x¹³ (truncation
// below 4e-9 relative); else sign(x)·(1 − 2/(e^(2|x|) + 1)) with exp_approx_t (relative error
// ~2e-7; the cancellation near 0.4 costs under 2 bits). Clamped exp: ±1 beyond |x| ≈ 44.
template <class F, class I>
[[gnu::always_inline]] inline F tanh_approx_t(F x) {
  const F a = x < 0.0f ? -x : x;
  const F x2 = x * x;
  F p = F{} + 21844.0f / 6081075.0f;
  p = p * x2 - 1382.0f / 155925.0f;
  p = p * x2 + 62.0f / 2835.0f;
  p = p * x2 - 17.0f / 315.0f;
  p = p * x2 + 2.0f / 15.0f;
  p = p * x2 - 1.0f / 3.0f;
  const F small = x + x * x2 * p;
  const F big = 1.0f - 2.0f / (exp_approx_t<F, I>(a + a) + 1.0f);
  return a < 0.4f ? small : (x < 0.0f ? -big : big);
}

[[gnu::always_inline]] inline float exp_approx(float x) {
  return exp_approx_t<float, int32_t>(x);
}

[[gnu::always_inline]] inline float tanh_approx(float x) {
  return tanh_approx_t<float, int32_t>(x);
}

}  // namespace bp::cpu
