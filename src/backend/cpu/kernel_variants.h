// The hand-vectorised CPU kernels in several instruction-set variants, chosen once at run time.
//
// A portable build (the default: baseline -march=x86-64-v2) must run on any x86-64 CPU and still
// use AVX2 or AVX-512 where the CPU has them. The kernels below are written once
// (kernel_variants_impl.h, GCC vector extensions whose width is a parameter) and compiled three
// times with different target flags: kernels_generic.cpp (the build's baseline, 4 lanes: SSE or
// NEON), kernels_avx2.cpp (AVX2 + FMA + F16C, 8 lanes) and kernels_avx512.cpp (AVX-512
// F/BW/DQ/VL, 16 lanes). The first call of cpu_kernels() picks the best variant this CPU runs
// (core/sysinfo's cpu_isa(), from CPUID) unless select_cpu_kernels() forced one (the
// runtime.cpu_kernels setting). Tests run each kernel once per variant the CPU supports.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bp {
struct CpuIsa;  // core/sysinfo.h
}

namespace bp::cpu {

enum class KernelVariant { Generic, Avx2, Avx512 };

// One function per hand-vectorised loop. Every variant computes the same formulas (exp_approx_t
// of cross_entropy.h); results differ only in the order of float sums (lane partial sums).
struct KernelTable {
  // max of row[0..n) (n >= 1).
  float (*row_max)(const float* row, int64_t n);
  // row[j] = exp(row[j] − shift) for j < n; returns their sum.
  float (*exp_shifted_sum)(float* row, int64_t n, float shift);
  // p[j] = exp(p[j] − lse), ds[j] = scale·p[j]·(ds[j] − delta) (ds holds dP on entry).
  void (*probs_and_score_grads)(float* p, float* ds, int64_t n, float lse, float delta, float scale);
  // x[j] *= k.
  void (*scale)(float* x, int64_t n, float k);
  // h = silu(g)·u, and its gradients (swiglu.h); serial over [0, n).
  void (*swiglu_forward)(const float* gate, const float* up, float* h, int64_t n);
  void (*swiglu_backward)(const float* dh, const float* gate, const float* up, float* dgate, float* dup, int64_t n);
  // One AdamW update of [0, n) with the scalars optim.cpp forms in double (see there).
  void (*adamw)(float* param, const float* grad, float* m, float* v, int64_t n, float decay, float beta1, float beta2,
                float one_minus_b1, float one_minus_b2, float step_size, float bc2_sqrt, float eps);
  // The LoRA dropout mask (backend/cpu/linear.h dropout_keep) applied to x[0..n), which is elements
  // first .. first + n − 1 of the input: xd[j] = x[j]·inv_keep where element first + j is kept, else
  // 0. Kept: the top 24 bits of splitmix64(mixed ^ index) >= threshold (mixed = splitmix64(seed),
  // threshold = dropout_keep_threshold(p): dropout_keep's float rule in integers, the same bits).
  // The 64-bit hash in vector lanes (AVX-512's 64-bit multiply; 32-bit products on AVX2 and SSE).
  void (*dropout_apply)(const float* x, float* xd, int64_t n, uint64_t first, uint64_t mixed, uint64_t threshold,
                        float inv_keep);
  // f32 -> f16 (round to nearest even) of a prefix of [0, n); returns how many it converted (the
  // caller converts the rest with core/dtype's f32_to_f16). 0 where the ISA has no conversion.
  int64_t (*f32_to_f16_prefix)(const float* src, uint16_t* dst, int64_t n);
  // `blocks` consecutive blocks of one ggml format (q8_0, q4_0, q5_0, q4_K) into f32, with the
  // formulas of core/quant_blocks.cpp's scalar dequantize_block_* (dequant_kernels_impl.h says
  // where results may differ from it: q4_K's product and offset may fuse into one rounding).
  void (*dequantize_q8_0)(const uint8_t* src, float* dst, int64_t blocks);
  void (*dequantize_q4_0)(const uint8_t* src, float* dst, int64_t blocks);
  void (*dequantize_q5_0)(const uint8_t* src, float* dst, int64_t blocks);
  void (*dequantize_q4_k)(const uint8_t* src, float* dst, int64_t blocks);
  // Gemma's tanh paths, with tanh_approx_t (cross_entropy.h) in vector lanes:
  // x[j] = cap·tanh(x[j]/cap), and th[j] = that tanh where th is not null (soft-capping: attention
  // scores, final logits).
  void (*softcap)(float* x, float* th, int64_t n, float cap);
  // The soft-capped attention backward row: s = cap·tanh(p[j]/cap) (p holds the scaled scores on
  // entry), p[j] = exp(s − lse), ds[j] = scale·p[j]·(ds[j] − delta)·(1 − (s/cap)²).
  void (*capped_probs_and_score_grads)(float* p, float* ds, int64_t n, float lse, float delta, float scale, float cap);
  // GeGLU (swiglu.h): h = gelu_tanh(g)·u and its gradients; serial over [0, n).
  void (*geglu_forward)(const float* gate, const float* up, float* h, int64_t n);
  void (*geglu_backward)(const float* dh, const float* gate, const float* up, float* dgate, float* dup, int64_t n);
  // y[i, f] = alpha·Σ_k x[i, k]·w[f, k] + beta·y[i, f] for i < n, f0 <= f < f1 (row-major, row
  // strides ldx, ldw, ldy; beta 0 writes y without reading it): a few rows x (n <= a few dozen)
  // against a large weight w [F, K] read in place, row by row, never repacked (gemm.h
  // sgemm_weight_nt, the Mixture-of-Experts' per-expert products). x's rows are first copied,
  // transposed, into panels of 2·lanes rows in `scratch` (few_rows_scratch_floats(n, K) floats);
  // each tile of 6 weight rows × one panel accumulates its K products in order (chunks of 256,
  // fused multiply-adds where the ISA has them), so a result depends on neither the thread split
  // nor n: only on the variant (generic: separate multiply and add).
  void (*gemm_nt_few_rows)(const float* x, int64_t ldx, int64_t n, int64_t K, const float* w, int64_t ldw, int64_t f0,
                           int64_t f1, float alpha, float beta, float* y, int64_t ldy, float* scratch);
};

// Scratch floats gemm_nt_few_rows needs for n rows of K (enough for every variant's panel width).
inline int64_t few_rows_scratch_floats(int64_t n, int64_t K) {
  return (n + 31) / 32 * 32 * (K + 8);
}

const char* kernel_variant_name(KernelVariant v);  // "generic", "avx2", "avx512"
// Variants this CPU (and this build) can run, generic first.
std::vector<KernelVariant> supported_kernel_variants();
// The table of one variant (tests call every supported one); RUNTIME_INTERNAL if not supported.
const KernelTable& kernel_table(KernelVariant v);

// The table in use; picks the best supported variant at the first call unless one was forced.
const KernelTable& cpu_kernels();

struct KernelChoice {
  KernelVariant variant = KernelVariant::Generic;
  std::string reason;  // "detected: ..." or "forced by runtime.cpu_kernels"
};
KernelChoice cpu_kernel_choice();

// "auto" (best supported) or a variant name. A variant this CPU lacks throws
// DEP_CPU_KERNELS_UNSUPPORTED naming what is missing; an unknown name CONFIG_INVALID_SETTING.
void select_cpu_kernels(std::string_view name);
// The same decision for a given CPU (tests use a CPU without AVX-512 to see the error).
void select_cpu_kernels(std::string_view name, const CpuIsa& isa);

}  // namespace bp::cpu
