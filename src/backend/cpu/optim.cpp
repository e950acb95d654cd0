// CPU kernels for AdamW, gradient norms and non-finite detection.
//
// AdamW follows torch.optim.AdamW's single-tensor path operation by operation so the two agree
// to the last bit or two: scalars (1 − lr·wd, bias corrections, step size) are formed in double
// as Python does, then each elementwise op rounds to f32 like a PyTorch f32 kernel:
//   p ← p·(1 − lr·wd)
//   m ← m·β1 + (1−β1)·g
//   v ← v·β2 + (1−β2)·g·g
//   denom ← sqrt(v) / sqrt(1−β2^t) + eps
//   p ← p − (lr/(1−β1^t)) · m / denom
// The elementwise loop is kernel_variants_impl.h's adamw (one per instruction set).
#include "backend/cpu/optim.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/kernel_variants.h"  // the AdamW loop, per instruction set

namespace bp::cpu {

// Below this many values a parallel region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;

void adamw_step(float* param, const float* grad, float* m, float* v, uint16_t* copy, int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, int64_t step) {
  const double lr_d = lr, b1 = beta1, b2 = beta2;
  const float decay = static_cast<float>(1.0 - lr_d * static_cast<double>(weight_decay));
  const float one_minus_b1 = static_cast<float>(1.0 - b1);
  const float one_minus_b2 = static_cast<float>(1.0 - b2);
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  const float step_size = static_cast<float>(lr_d / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const KernelTable& kern = cpu_kernels();
  constexpr int64_t kChunk = 1 << 14;  // elementwise: any split gives the same values
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kChunk;
    const int64_t len = std::min(kChunk, n - b);
    kern.adamw(param + b, grad + b, m + b, v + b, len, decay, beta1, beta2, one_minus_b1, one_minus_b2, step_size,
               bc2_sqrt, eps);
    if (copy) round_to_bf16_serial(param + b, copy + b, len);  // this chunk, while in cache
  }
}

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                float eps, float weight_decay, int64_t step) {
  adamw_step(param, grad, m, v, nullptr, n, lr, beta1, beta2, eps, weight_decay, step);
}

void adamw_step_all(float* const* params, const float* const* grads, float* const* ms, float* const* vs,
                    uint16_t* const* copies, const int64_t* ns, int64_t count, float lr, float beta1, float beta2,
                    float eps, float weight_decay, int64_t step) {
  for (int64_t i = 0; i < count; ++i)
    adamw_step(params[i], grads[i], ms[i], vs[i], copies ? copies[i] : nullptr, ns[i], lr, beta1, beta2, eps,
               weight_decay, step);
}

void scale_all(float* const* ys, const int64_t* ns, int64_t count, float a) {
  for (int64_t i = 0; i < count; ++i) scale_inplace(ys[i], a, ns[i]);
}

double sum_squares(const float* x, int64_t n) {
  // Fixed blocks summed in order: the result is bit-identical for any thread count and any run
  // (an OpenMP reduction combines partial sums in whatever order threads finish), so clipping and
  // a resumed run stay deterministic.
  constexpr int64_t kBlock = 1 << 14;
  const int64_t n_blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(n_blocks));
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t b = 0; b < n_blocks; ++b) {
    double s = 0.0;
    const int64_t end = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    partial[static_cast<size_t>(b)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

double sum_squares_total(const float* const* xs, const int64_t* ns, int64_t count) {
  double total = 0.0;
  for (int64_t i = 0; i < count; ++i) total += sum_squares(xs[i], ns[i]);
  return total;
}

bool all_finite_f32(const float* x, int64_t n) {
  // Exponent bits all ones means inf or NaN; integer test so -ffast-math could never fold it away.
  int bad = 0;
#pragma omp parallel for schedule(static) if (n >= kParallelMin) reduction(| : bad)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    bad |= ((u & 0x7f800000u) == 0x7f800000u) ? 1 : 0;
  }
  return bad == 0;
}

bool all_finite_16(const uint16_t* x, int64_t n, bool is_bf16) {
  const uint16_t mask = is_bf16 ? 0x7f80u : 0x7c00u;
  int bad = 0;
#pragma omp parallel for schedule(static) if (n >= kParallelMin) reduction(| : bad)
  for (int64_t i = 0; i < n; ++i) bad |= ((x[i] & mask) == mask) ? 1 : 0;
  return bad == 0;
}

}  // namespace bp::cpu
