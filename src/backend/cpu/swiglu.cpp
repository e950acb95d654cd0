// CPU SwiGLU: h = silu(g)·u with silu(g) = g·σ(g), σ(g) = 1/(1 + e^(−g)).
// d silu/dg = σ(g) + g·σ(g)(1 − σ(g)) = σ(g)·(1 + g·(1 − σ(g))).
// The loops are kernel_variants_impl.h's (one per instruction set).
// σ is written as 1/(1 + exp(−g)) with exp_approx (cross_entropy.h: a branch-free polynomial the
// compiler vectorises; std::exp stays a scalar call and cost ~5 ns per element, 6% of a SmolLM
// training step). exp_approx clamps its argument to [−87, 88]: for g < −88, σ ≈ 6e-39, for g > 87,
// σ = 1 — the right limits within f32.
#include "backend/cpu/swiglu.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/elementwise.h"      // round_to_bf16_serial
#include "backend/cpu/kernel_variants.h"  // the vectorised loops, per instruction set

namespace bp::cpu {

namespace {
constexpr int64_t kParallelMin = 1 << 14;
constexpr int64_t kChunk = 1 << 12;  // elements per parallel task (elementwise: any split gives the same values)

// fn(begin, length) over [0, n) in chunks of kChunk, in parallel above kParallelMin elements.
template <class Fn>
void for_chunks(int64_t n, Fn&& fn) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) fn(c * kChunk, std::min(kChunk, n - c * kChunk));
}

}  // namespace

void swiglu_forward(const float* gate, const float* up, float* h, uint16_t* h_bf16, int64_t n) {
  const KernelTable& kern = cpu_kernels();
  for_chunks(n, [&](int64_t b, int64_t len) {
    kern.swiglu_forward(gate + b, up + b, h + b, len);
    if (h_bf16) round_to_bf16_serial(h + b, h_bf16 + b, len);  // the chunk's copy while it is in cache
  });
}

void swiglu_backward(const float* dh, const float* gate, const float* up, float* dgate, float* dup,
                     uint16_t* dgate_bf16, uint16_t* dup_bf16, int64_t n) {
  const KernelTable& kern = cpu_kernels();
  for_chunks(n, [&](int64_t b, int64_t len) {
    kern.swiglu_backward(dh + b, gate + b, up + b, dgate + b, dup + b, len);
    if (dgate_bf16) round_to_bf16_serial(dgate + b, dgate_bf16 + b, len);
    if (dup_bf16) round_to_bf16_serial(dup + b, dup_bf16 + b, len);
  });
}

void geglu_forward(const float* gate, const float* up, float* h, uint16_t* h_bf16, int64_t n) {
  const KernelTable& kern = cpu_kernels();
  for_chunks(n, [&](int64_t b, int64_t len) {
    kern.geglu_forward(gate + b, up + b, h + b, len);
    if (h_bf16) round_to_bf16_serial(h + b, h_bf16 + b, len);
  });
}

void geglu_backward(const float* dh, const float* gate, const float* up, float* dgate, float* dup, uint16_t* dgate_bf16,
                    uint16_t* dup_bf16, int64_t n) {
  const KernelTable& kern = cpu_kernels();
  for_chunks(n, [&](int64_t b, int64_t len) {
    kern.geglu_backward(dh + b, gate + b, up + b, dgate + b, dup + b, len);
    if (dgate_bf16) round_to_bf16_serial(dgate + b, dgate_bf16 + b, len);
    if (dup_bf16) round_to_bf16_serial(dup + b, dup_bf16 + b, len);
  });
}

}  // namespace bp::cpu
