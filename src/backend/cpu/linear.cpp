// CPU linear: y = x·Wᵀ (+ b) (+ scale·(dropout(x)·Aᵀ)·Bᵀ). Every product is one sgemm call on the
// caller's buffers (no transposed copies: OpenBLAS takes the transpose flags), so forward and
// backward run at the BLAS rate; the LoRA products are skinny (rank r) GEMMs.
//
// Dropout mask: element i of the [T, in] LoRA input is kept when
//   u = top 24 bits of splitmix64(splitmix64(seed) ^ i) / 2^24  >=  p,
// and kept values are scaled by 1/(1-p) (inverted dropout, as torch.nn.Dropout). Mixing the seed
// first means seeds s and s^1 do not give shifted copies of one mask.
#include "backend/cpu/linear.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_engine.h"
#include "backend/cpu/kernel_variants.h"
#include "backend/cpu/quant_gemm.h"
#include "core/dtype.h"

namespace bp::cpu {

namespace {

inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline bool keep_mixed(uint64_t mixed_seed, uint64_t index, float p) {
  const uint64_t h = splitmix64(mixed_seed ^ index);
  const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1) in 2^-24 steps
  return u >= p;
}

constexpr int64_t kParallelMin = 1 << 14;
}  // namespace

bool dropout_keep(uint64_t seed, uint64_t index, float p) {
  return keep_mixed(splitmix64(seed), index, p);
}

uint64_t dropout_mixed_seed(uint64_t seed) {
  return splitmix64(seed);
}

uint64_t dropout_keep_threshold(float p) {
  // u = k / 2^24 is exact for k < 2^24, and so is p·2^24 in double: u >= p ⇔ k >= ceil(p·2^24).
  return p <= 0.0f ? 0 : static_cast<uint64_t>(std::ceil(static_cast<double>(p) * 16777216.0));
}

void dropout_forward(const float* x, float* xd, int64_t n, float p, uint64_t seed) {
  const uint64_t mixed = splitmix64(seed), threshold = dropout_keep_threshold(p);
  const float inv_keep = 1.0f / (1.0f - p);
  const KernelTable& k = cpu_kernels();
  constexpr int64_t kChunk = 4096;  // elements a call: an OpenMP thread's unit of work
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i += kChunk)
    k.dropout_apply(x + i, xd + i, n - i < kChunk ? n - i : kChunk, static_cast<uint64_t>(i), mixed, threshold,
                    inv_keep);
}

void dropout_backward_accumulate(const float* g, const float* x, const float* xd, float* dx, int64_t n, float p,
                                 uint64_t seed) {
  const uint64_t mixed = splitmix64(seed);
  const float inv_keep = 1.0f / (1.0f - p);
#pragma omp parallel if (n >= kParallelMin)
  {
    // Pass 1 (vectorised): every element whose mask shows in xd.
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      dx[i] += xd[i] != 0.0f ? g[i] * inv_keep : 0.0f;
    }
    // Pass 2: x == 0 exactly hides the mask; rehash those (rare) elements. The barrier at the
    // end of pass 1 orders the two updates of an element.
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      if (x[i] == 0.0f && keep_mixed(mixed, static_cast<uint64_t>(i), p)) dx[i] += g[i] * inv_keep;
  }
}

int64_t lora_dropout_scratch_floats(int64_t T, int64_t in, bool backward) {
  return (backward ? 2 : 1) * T * in;
}

int64_t lora_dropout_rank(const LoraDropoutMember* members, int n_members) {
  int64_t R = 0;
  for (int k = 0; k < n_members; ++k) R += members[k].r;
  return R;
}

void lora_dropout_xa(const float* x, const float* A, float p, const LoraDropoutMember* members, int n_members,
                     float* scratch, float* xa, int64_t T, int64_t in) {
  const int64_t R = lora_dropout_rank(members, n_members);
  for (int64_t k = 0, col = 0; k < n_members; col += members[k].r, ++k) {
    dropout_forward(x, scratch, T * in, p, members[k].seed);
    sgemm(false, true, T, members[k].r, in, 1.0f, scratch, in, A + col * in, in, 0.0f, xa + col, R);
  }
}

void lora_dropout_backward(const float* dxa, const float* x, const float* A, float p, const LoraDropoutMember* members,
                           int n_members, float* scratch, float* dA, float* dx, int64_t T, int64_t in) {
  float* xd = scratch;
  float* dxd = scratch + T * in;
  const int64_t R = lora_dropout_rank(members, n_members);
  for (int64_t k = 0, col = 0; k < n_members; col += members[k].r, ++k) {
    const int64_t r = members[k].r;
    // The mask loop first, then both GEMMs back to back (OpenBLAS's workers spin after a call).
    dropout_forward(x, xd, T * in, p, members[k].seed);
    if (dA) sgemm(true, false, r, in, T, 1.0f, dxa + col, R, xd, in, 1.0f, dA + col * in, in);
    if (!dx) continue;
    sgemm(false, false, T, in, r, 1.0f, dxa + col, R, A + col * in, in, 0.0f, dxd, in);
    dropout_backward_accumulate(dxd, x, xd, dx, T * in, p, members[k].seed);
  }
}

void linear_base_forward(const float* x, const float* W, const float* bias, const float* residual, float* y, int64_t T,
                         int64_t in, int64_t out) {
  float beta = 0.0f;
  if (bias || residual) {
    // Start from the bias rows (and the residual) and let the GEMM accumulate (beta = 1): one pass
    // over y, not two.
#pragma omp parallel for schedule(static) if (T * out >= kParallelMin)
    for (int64_t t = 0; t < T; ++t) {
      float* row = y + t * out;
      if (residual && bias)
        for (int64_t j = 0; j < out; ++j) row[j] = residual[t * out + j] + bias[j];
      else if (residual)
        std::memcpy(row, residual + t * out, static_cast<size_t>(out) * sizeof(float));
      else
        std::memcpy(row, bias, static_cast<size_t>(out) * sizeof(float));
    }
    beta = 1.0f;
  }
  if (in == 0) {
    if (beta == 0.0f)
      for (int64_t i = 0; i < T * out; ++i) y[i] = 0.0f;
    return;
  }
  sgemm_weight_nt(T, out, in, 1.0f, x, in, W, in, beta, y, out);
}

void lora_forward(const float* xd, const float* A, const float* B, float scale, float* xa, float* y, int64_t T,
                  int64_t in, int64_t out, int64_t r) {
  sgemm(false, true, T, r, in, 1.0f, xd, in, A, in, 0.0f, xa, r);
  sgemm(false, true, T, out, r, scale, xa, r, B, r, 1.0f, y, out);
}

void linear_dx(const float* dy, const float* W, float beta, float* dx, int64_t T, int64_t in, int64_t out) {
  if (out == 0) {
    if (beta == 0.0f)
      for (int64_t i = 0; i < T * in; ++i) dx[i] = 0.0f;
    return;
  }
  sgemm(false, false, T, in, out, 1.0f, dy, out, W, in, beta, dx, in);
}

void linear_dW_accumulate(const float* dy, const float* x, float* dW, int64_t T, int64_t in, int64_t out) {
  if (T == 0) return;
  sgemm(true, false, out, in, T, 1.0f, dy, out, x, in, 1.0f, dW, in);
}

namespace {

// How this product against a held weight runs (gemm_engine.h decides): only bf16 weights take the
// bf16 paths; an empty product keeps the f32 one (it writes what held_gemm_xwt/xw write).
HeldBf16Path held_path(const HeldMatrix& W) {
  if (W.type != DType::BF16 || W.rows == 0 || W.cols == 0) return HeldBf16Path::F32;
  return cpu_gemm_choice().held_bf16;
}

// The activation operand [n] as bf16 (nearest even): the producer's copy when given, else rounded
// into `buf`.
const uint16_t* bf16_operand(const float* x, const uint16_t* x_bf16, int64_t n, std::vector<uint16_t>& buf) {
  if (x_bf16) return x_bf16;
  buf.resize(static_cast<size_t>(n));
  round_to_bf16(x, buf.data(), n);
  return buf.data();
}

// The activation operand [n] rounded to bf16 and widened back to f32 (the OpenBLAS path of the
// bf16 numerics): exactly the values oneDNN multiplies.
const float* bf16_rounded_f32(const float* x, const uint16_t* x_bf16, int64_t n, std::vector<float>& buf) {
  buf.resize(static_cast<size_t>(n));
  float* out = buf.data();
  if (x_bf16) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(x_bf16[i]);
  } else {
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(f32_to_bf16(x[i]));
  }
  return out;
}

}  // namespace

void held_linear_forward(const float* x, const uint16_t* x_bf16, const HeldMatrix& W, float beta, const float* y_in,
                         float* y, int64_t T) {
  if (y_in && y_in != y && beta != 0.0f) std::memcpy(y, y_in, static_cast<size_t>(T * W.rows) * sizeof(float));
  if (T == 0) return;
  switch (held_path(W)) {
    case HeldBf16Path::F32: return held_gemm_xwt(x, W, beta, y, T);
    case HeldBf16Path::Bf16Sgemm: {
      std::vector<float> buf;
      return held_gemm_xwt(bf16_rounded_f32(x, x_bf16, T * W.cols, buf), W, beta, y, T);
    }
    case HeldBf16Path::OneDnn: {
      std::vector<uint16_t> buf;
      return onednn_bf16_gemm_xwt(bf16_operand(x, x_bf16, T * W.cols, buf), static_cast<const uint16_t*>(W.data), beta,
                                  y, T, W.rows, W.cols);
    }
  }
}

void held_linear_backward(const float* dy, const uint16_t* dy_bf16, const float* x, const uint16_t* /*x_bf16: dW f32*/,
                          const HeldMatrix& W, float dx_beta, float* dx, float* dW, int64_t T) {
  if (dx && T > 0) switch (held_path(W)) {
      case HeldBf16Path::F32: held_gemm_xw(dy, W, dx_beta, dx, T); break;
      case HeldBf16Path::Bf16Sgemm: {
        std::vector<float> buf;
        held_gemm_xw(bf16_rounded_f32(dy, dy_bf16, T * W.rows, buf), W, dx_beta, dx, T);
        break;
      }
      case HeldBf16Path::OneDnn: {
        std::vector<uint16_t> buf;
        onednn_bf16_gemm_xw(bf16_operand(dy, dy_bf16, T * W.rows, buf), static_cast<const uint16_t*>(W.data), dx_beta,
                            dx, T, W.rows, W.cols);
        break;
      }
    }
  if (dW) linear_dW_accumulate(dy, x, dW, T, W.cols, W.rows);
}

}  // namespace bp::cpu
