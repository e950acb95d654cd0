// The body of every kernel variant (kernel_variants.h), included once by each of
// kernels_generic.cpp, kernels_avx2.cpp and kernels_avx512.cpp after they define
//   BP_KERNEL_NS         the variant's namespace (generic, avx2, avx512)
//   BP_KERNEL_VEC_BYTES  the vector width in bytes (16, 32, 64)
// and, for x86 variants with F16C, BP_KERNEL_F16C. The files are compiled with different target
// flags (CMakeLists.txt), so everything here lives in a per-variant namespace and calls only
// always-inline helpers: an out-of-line inline function (a COMDAT symbol shared by name) compiled
// for AVX-512 could be the copy the linker keeps for the generic code, and that would fault on
// CPUs without AVX-512. No std:: algorithm is used for the same reason.
//
// Vectors are GCC vector extensions: 16-lane vectors on an AVX2-only CPU compile to pairs of
// 256-bit instructions and scalar blends (issue 14), so each ISA gets its own native width.
#include <cstdint>
#include <cstring>

#include "backend/cpu/cross_entropy.h"  // exp_approx_t: one formula for every variant
#include "backend/cpu/kernel_variants.h"
#include "core/dtype.h"  // f16_to_f32 (out of line) for the dequantizers without F16C
#if defined(__x86_64__)
#include <immintrin.h>  // F16C and the byte widenings of dequant_kernels_impl.h
#endif

namespace bp::cpu::BP_KERNEL_NS {

namespace {

typedef float VecF __attribute__((vector_size(BP_KERNEL_VEC_BYTES)));
typedef int32_t VecI __attribute__((vector_size(BP_KERNEL_VEC_BYTES)));
constexpr int64_t kLanes = BP_KERNEL_VEC_BYTES / 4;

[[gnu::always_inline]] inline VecF load(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

[[gnu::always_inline]] inline void store(float* p, VecF v) {
  std::memcpy(p, &v, sizeof v);
}

[[gnu::always_inline]] inline VecF exp_of(VecF x) {
  return exp_approx_t<VecF, VecI>(x);
}

[[gnu::always_inline]] inline float exp_of(float x) {
  return exp_approx_t<float, int32_t>(x);
}

[[gnu::always_inline]] inline float hsum(VecF v) {
  float s = 0.0f;
  for (int64_t c = 0; c < kLanes; ++c) s += v[c];
  return s;
}

[[gnu::always_inline]] inline float max_of(float a, float b) {
  return a < b ? b : a;  // std::max's rule
}

float row_max(const float* row, int64_t n) {
  float m = row[0];
  int64_t j = 0;
  if (n >= kLanes) {
    VecF mv = load(row);
    for (j = kLanes; j + kLanes <= n; j += kLanes) {
      const VecF x = load(row + j);
      mv = x > mv ? x : mv;
    }
    for (int64_t c = 0; c < kLanes; ++c) m = max_of(m, mv[c]);
  }
  for (; j < n; ++j) m = max_of(m, row[j]);
  return m;
}

float exp_shifted_sum(float* row, int64_t n, float shift) {
  VecF acc{};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const VecF e = exp_of(load(row + j) - shift);
    store(row + j, e);
    acc += e;
  }
  float sum = hsum(acc);
  for (; j < n; ++j) sum += (row[j] = exp_of(row[j] - shift));
  return sum;
}

void probs_and_score_grads(float* p, float* ds, int64_t n, float lse, float delta, float scale) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const VecF e = exp_of(load(p + j) - lse);
    store(p + j, e);
    store(ds + j, scale * e * (load(ds + j) - delta));
  }
  for (; j < n; ++j) {
    p[j] = exp_of(p[j] - lse);
    ds[j] = scale * p[j] * (ds[j] - delta);
  }
}

void scale(float* x, int64_t n, float k) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) store(x + j, load(x + j) * k);
  for (; j < n; ++j) x[j] *= k;
}

// σ(g) = 1/(1 + e^(−g)); exp_approx clamps to [−87, 88], which gives the right limits in f32.
template <class F>
[[gnu::always_inline]] inline F sigmoid(F g) {
  return 1.0f / (1.0f + exp_of(-g));
}

void swiglu_forward(const float* gate, const float* up, float* h, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VecF g = load(gate + i);
    store(h + i, g * sigmoid(g) * load(up + i));
  }
  for (; i < n; ++i) h[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

void swiglu_backward(const float* dh, const float* gate, const float* up, float* dgate, float* dup, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VecF g = load(gate + i), s = sigmoid(g), d = load(dh + i);
    store(dup + i, d * g * s);
    store(dgate + i, d * load(up + i) * s * (1.0f + g * (1.0f - s)));
  }
  for (; i < n; ++i) {
    const float g = gate[i], s = sigmoid(g);
    dup[i] = dh[i] * g * s;
    dgate[i] = dh[i] * up[i] * s * (1.0f + g * (1.0f - s));
  }
}

// Plain loop (vectorised by the compiler for this variant's ISA; the TU is built with
// -fno-math-errno so sqrt needs no library call). The order of operations is optim.cpp's.
void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float decay, float beta1, float beta2,
           float one_minus_b1, float one_minus_b2, float step_size, float bc2_sqrt, float eps) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    float p = param[i] * decay;
    const float mi = m[i] * beta1 + one_minus_b1 * g;
    const float vi = v[i] * beta2 + one_minus_b2 * (g * g);
    const float denom = __builtin_sqrtf(vi) / bc2_sqrt + eps;
    p = p - step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
  }
}

// splitmix64 (backend/cpu/linear.cpp) on one lane type: uint64_t or a vector of them.
template <class U>
[[gnu::always_inline]] inline U splitmix64_of(U z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Half as many 64-bit lanes as float lanes: a vector of hashes per half vector of x.
typedef uint64_t VecU64 __attribute__((vector_size(BP_KERNEL_VEC_BYTES)));
typedef float HalfF __attribute__((vector_size(BP_KERNEL_VEC_BYTES / 2)));
typedef int32_t HalfI __attribute__((vector_size(BP_KERNEL_VEC_BYTES / 2)));
constexpr int64_t kLanes64 = BP_KERNEL_VEC_BYTES / 8;

void dropout_apply(const float* x, float* xd, int64_t n, uint64_t first, uint64_t mixed, uint64_t threshold,
                   float inv_keep) {
  VecU64 index;
  for (int64_t c = 0; c < kLanes64; ++c) index[c] = first + static_cast<uint64_t>(c);
  int64_t i = 0;
  for (; i + kLanes64 <= n; i += kLanes64) {
    const VecU64 kept = (splitmix64_of(mixed ^ index) >> 40) >= threshold;  // all ones where kept
    HalfF v;
    std::memcpy(&v, x + i, sizeof v);
    v *= inv_keep;
    HalfI bits;
    std::memcpy(&bits, &v, sizeof bits);
    bits &= __builtin_convertvector(kept, HalfI);  // 0.0f where dropped
    std::memcpy(xd + i, &bits, sizeof bits);
    index += static_cast<uint64_t>(kLanes64);
  }
  for (; i < n; ++i)
    xd[i] = (splitmix64_of(mixed ^ (first + static_cast<uint64_t>(i))) >> 40) >= threshold ? x[i] * inv_keep : 0.0f;
}

int64_t f32_to_f16_prefix(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
#if defined(BP_KERNEL_F16C)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  return i;
}

[[gnu::always_inline]] inline VecF tanh_of(VecF x) {
  return tanh_approx_t<VecF, VecI>(x);
}

[[gnu::always_inline]] inline float tanh_of(float x) {
  return tanh_approx_t<float, int32_t>(x);
}

void softcap(float* x, float* th, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const VecF t = tanh_of(load(x + j) * inv);
    if (th) store(th + j, t);
    store(x + j, cap * t);
  }
  for (; j < n; ++j) {
    const float t = tanh_of(x[j] * inv);
    if (th) th[j] = t;
    x[j] = cap * t;
  }
}

void capped_probs_and_score_grads(float* p, float* ds, int64_t n, float lse, float delta, float scale, float cap) {
  const float inv = 1.0f / cap;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const VecF t = tanh_of(load(p + j) * inv), e = exp_of(cap * t - lse);
    store(p + j, e);
    store(ds + j, scale * e * (load(ds + j) - delta) * (1.0f - t * t));
  }
  for (; j < n; ++j) {
    const float t = tanh_of(p[j] * inv);
    p[j] = exp_of(cap * t - lse);
    ds[j] = scale * p[j] * (ds[j] - delta) * (1.0f - t * t);
  }
}

// gelu_tanh(g) = g/2·(1 + tanh(k·(g + 0.044715·g³))), k = sqrt(2/π); its derivative
// (1 + t)/2 + g/2·(1 − t²)·k·(1 + 3·0.044715·g²).
constexpr float kGeluK = 0.7978845608028654f, kGeluA = 0.044715f;

template <class F>
[[gnu::always_inline]] inline F gelu_t_of(F g) {
  return tanh_of(kGeluK * (g + kGeluA * g * g * g));
}

void geglu_forward(const float* gate, const float* up, float* h, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VecF g = load(gate + i);
    store(h + i, 0.5f * g * (1.0f + gelu_t_of(g)) * load(up + i));
  }
  for (; i < n; ++i) h[i] = 0.5f * gate[i] * (1.0f + gelu_t_of(gate[i])) * up[i];
}

void geglu_backward(const float* dh, const float* gate, const float* up, float* dgate, float* dup, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const VecF g = load(gate + i), d = load(dh + i), t = gelu_t_of(g);
    const VecF dact = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluA * g * g);
    store(dgate + i, d * load(up + i) * dact);
    store(dup + i, d * 0.5f * g * (1.0f + t));
  }
  for (; i < n; ++i) {
    const float g = gate[i], t = gelu_t_of(g), d = dh[i];
    const float dact = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluA * g * g);
    dgate[i] = d * up[i] * dact;
    dup[i] = d * 0.5f * g * (1.0f + t);
  }
}

// a·b + c: one rounding where the variant has FMA (its TU is built with -mfma), else two.
[[gnu::always_inline]] inline VecF fma_of(VecF a, VecF b, VecF c) {
#if BP_KERNEL_VEC_BYTES == 64 && defined(__AVX512F__)
  return (VecF)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif BP_KERNEL_VEC_BYTES == 32 && defined(__FMA__)
  return (VecF)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return a * b + c;
#endif
}

// s in every lane (one broadcast instruction; `VecF{} + s` would add 0.0 first).
[[gnu::always_inline]] inline VecF splat(float s) {
#if defined(__clang__)
  VecF v;  // clang has no __builtin_shuffle; it makes this loop one broadcast
  for (int i = 0; i < static_cast<int>(sizeof(VecF) / sizeof(float)); ++i) v[i] = s;
  return v;
#else
  const VecF v = {s};
  return __builtin_shuffle(v, VecI{});
#endif
}

// gemm_nt_few_rows (kernel_variants.h): tiles of kFewMr weight rows × one panel of kFewPanel x
// rows (kNv vectors: 2, or 1 for a last panel of at most kLanes rows), K in chunks of kFewKc so
// the tile's six weight-row pieces stay in L1 while every panel passes over them.
constexpr int64_t kFewMr = 6, kFewPanel = 2 * kLanes, kFewKc = 256;

template <int kMr, int kNv>
[[gnu::always_inline]] inline void few_rows_tile(const float* xt, const float* w, int64_t ldw, int64_t kc, float* acc) {
  VecF a[kMr][kNv];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < kNv; ++v) a[r][v] = VecF{};
  for (int64_t k = 0; k < kc; ++k) {
    VecF xv[kNv];
#pragma GCC unroll 2
    for (int v = 0; v < kNv; ++v) xv[v] = load(xt + k * kFewPanel + v * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const VecF b = splat(w[r * ldw + k]);
#pragma GCC unroll 2
      for (int v = 0; v < kNv; ++v) a[r][v] = fma_of(b, xv[v], a[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < kNv; ++v) {
      float* p = acc + r * kFewPanel + v * kLanes;
      store(p, load(p) + a[r][v]);
    }
}

template <int kMr>
void few_rows_tiles(const float* xt, const float* w, int64_t ldw, int64_t kc, float* acc, bool half) {
  if (half)
    few_rows_tile<kMr, 1>(xt, w, ldw, kc, acc);
  else
    few_rows_tile<kMr, 2>(xt, w, ldw, kc, acc);
}

void gemm_nt_few_rows(const float* x, int64_t ldx, int64_t n, int64_t K, const float* w, int64_t ldw, int64_t f0,
                      int64_t f1, float alpha, float beta, float* y, int64_t ldy, float* scratch) {
  if (n <= 0 || f1 <= f0) return;
  const int64_t np = (n + kFewPanel - 1) / kFewPanel;
  float* xt = scratch;                        // [np][K][kFewPanel]: x transposed, zero rows past n
  float* acc = scratch + np * K * kFewPanel;  // [np][kFewMr][kFewPanel]
  for (int64_t p = 0; p < np; ++p)
    for (int64_t c = 0; c < kFewPanel; ++c) {
      const int64_t i = p * kFewPanel + c;
      float* dst = xt + p * K * kFewPanel + c;
      if (i < n)
        for (int64_t k = 0; k < K; ++k) dst[k * kFewPanel] = x[i * ldx + k];
      else
        for (int64_t k = 0; k < K; ++k) dst[k * kFewPanel] = 0.0f;
    }
  for (int64_t f = f0; f < f1; f += kFewMr) {
    const int64_t mr = f1 - f < kFewMr ? f1 - f : kFewMr;
    for (int64_t j = 0; j < np * kFewMr * kFewPanel; ++j) acc[j] = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += kFewKc) {
      const int64_t kc = K - k0 < kFewKc ? K - k0 : kFewKc;
      const float* wk = w + f * ldw + k0;
      for (int64_t p = 0; p < np; ++p) {
        const float* xp = xt + (p * K + k0) * kFewPanel;
        float* ap = acc + p * kFewMr * kFewPanel;
        const bool half = n - p * kFewPanel <= kLanes;
        switch (mr) {
          case 6: few_rows_tiles<6>(xp, wk, ldw, kc, ap, half); break;
          case 5: few_rows_tiles<5>(xp, wk, ldw, kc, ap, half); break;
          case 4: few_rows_tiles<4>(xp, wk, ldw, kc, ap, half); break;
          case 3: few_rows_tiles<3>(xp, wk, ldw, kc, ap, half); break;
          case 2: few_rows_tiles<2>(xp, wk, ldw, kc, ap, half); break;
          default: few_rows_tiles<1>(xp, wk, ldw, kc, ap, half); break;
        }
      }
    }
    for (int64_t p = 0; p < np; ++p)
      for (int64_t c = 0; c < kFewPanel && p * kFewPanel + c < n; ++c) {
        float* yr = y + (p * kFewPanel + c) * ldy + f;
        const float* ar = acc + p * kFewMr * kFewPanel + c;
        for (int64_t r = 0; r < mr; ++r)
          yr[r] = beta == 0.0f ? alpha * ar[r * kFewPanel] : alpha * ar[r * kFewPanel] + beta * yr[r];
      }
  }
}

// Dequantizers of held block formats (vector code with this variant's VecF and kLanes).
#include "backend/cpu/dequant_kernels_impl.h"

}  // namespace

const KernelTable& table() {
  static const KernelTable t{row_max, exp_shifted_sum, probs_and_score_grads, scale, swiglu_forward, swiglu_backward,
                             adamw, dropout_apply, f32_to_f16_prefix,
                             // dequant_kernels_impl.h
                             dequantize_q8_0, dequantize_q4_0, dequantize_q5_0, dequantize_q4_k, softcap,
                             capped_probs_and_score_grads, geglu_forward, geglu_backward, gemm_nt_few_rows};
  return t;
}

}  // namespace bp::cpu::BP_KERNEL_NS
