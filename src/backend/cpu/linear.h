// CPU kernels for linear (contract: ops/linear.h). Row-major raw pointers; the front-end has
// checked shapes. GEMMs go through bp::cpu::sgemm (OpenBLAS); the elementwise loops use OpenMP,
// never around a BLAS call.
#pragma once

#include <cstdint>

namespace bp::cpu {

struct HeldMatrix;  // quant_gemm.h

// Deterministic dropout mask bit for element `index` of a LoRA input under `seed`: a
// counter-based hash (splitmix64 of the mixed seed and the index), so a recompute of the
// forward (or the backward) regenerates the same mask without storing it. True = kept.
bool dropout_keep(uint64_t seed, uint64_t index, float p);

// dropout_keep's rule in integers: kept when the hash's top 24 bits k >= dropout_keep_threshold(p)
// (k / 2^24 >= p exactly when k >= ceil(p·2^24)), which the vector kernels use (kernel_variants.h).
uint64_t dropout_keep_threshold(float p);
// splitmix64(seed): the mask's mixed seed (KernelTable::dropout_apply's `mixed`).
uint64_t dropout_mixed_seed(uint64_t seed);
// xd[i] = keep(i) ? x[i] / (1 - p) : 0 for i < n (the mask in vector lanes: KernelTable::dropout_apply).
void dropout_forward(const float* x, float* xd, int64_t n, float p, uint64_t seed);
// dx[i] += keep(i) ? g[i] / (1 - p) : 0 (the backward of dropout_forward, accumulated into dx).
// x and xd are the forward's input and output: xd[i] != 0 means kept and x[i] != 0 == xd[i]
// means dropped (scaling by 1/(1-p) >= 1 cannot underflow), so the hash is only re-evaluated
// where x[i] == 0 exactly.
void dropout_backward_accumulate(const float* g, const float* x, const float* xd, float* dx, int64_t n, float p,
                                 uint64_t seed);

// LoRA dropout without a saved dropped input (ops/linear.cpp; the CUDA kernels, lora_dropout.cuh,
// never materialize it): here xd = dropout(x) is written into the caller's scratch and the products
// are the sgemm calls of the plain LoRA path, so the arithmetic is that of dropout_forward + sgemm.
// A call serves the members of an input group (q/k/v, gate/up: ops/linear.h lora_group_forward),
// each with its own mask: A is their A matrices as rows of one [R, in] matrix (R = Σ r), xa, dxa
// [T, R] their columns and dA [R, in] like A, members in that order. A projection alone is one
// member. The kernel tables take 1 to kMaxLoraDropoutMembers members (the front-end checks).
struct LoraDropoutMember {
  int64_t r = 0;      // its rows of A, columns of xa and dxa
  uint64_t seed = 0;  // its mask's seed (p is the call's)
};
inline constexpr int kMaxLoraDropoutMembers = 3;  // q, k, v
// Σ r of the members: A's rows, xa's and dxa's columns.
int64_t lora_dropout_rank(const LoraDropoutMember* members, int n_members);
// Floats of scratch the two calls below need: T·in forward (xd), 2·T·in backward (xd and dxd).
int64_t lora_dropout_scratch_floats(int64_t T, int64_t in, bool backward);
// xa[T,R] = dropout_m(x)[T,in]·A_m[r_m,in]ᵀ per member (=)
void lora_dropout_xa(const float* x, const float* A, float p, const LoraDropoutMember* members, int n_members,
                     float* scratch, float* xa, int64_t T, int64_t in);
// dA[R,in] += dxa_mᵀ·dropout_m(x) (dA non-null); dx[T,in] += Σ_m dropout_m'(dxa_m·A_m) (dx non-null).
void lora_dropout_backward(const float* dxa, const float* x, const float* A, float p, const LoraDropoutMember* members,
                           int n_members, float* scratch, float* dA, float* dx, int64_t T, int64_t in);

// y[T,out] = x[T,in]·W[out,in]ᵀ (+ bias[out] when non-null) (+ residual[T,out] when non-null: a
// residual connection the projection adds; the GEMM's beta on a card).
void linear_base_forward(const float* x, const float* W, const float* bias, const float* residual, float* y, int64_t T,
                         int64_t in, int64_t out);
// xa[T,r] = xd[T,in]·A[r,in]ᵀ ;  y[T,out] += scale · xa·B[out,r]ᵀ
void lora_forward(const float* xd, const float* A, const float* B, float scale, float* xa, float* y, int64_t T,
                  int64_t in, int64_t out, int64_t r);

// dx[T,in] = dy[T,out]·W[out,in] + beta·dx   (beta 0: overwritten, dx not read; beta 1: accumulated)
void linear_dx(const float* dy, const float* W, float beta, float* dx, int64_t T, int64_t in, int64_t out);
// dW[out,in] += dyᵀ·x
void linear_dW_accumulate(const float* dy, const float* x, float* dW, int64_t T, int64_t in, int64_t out);
// The forward of a weight W [out, in] held narrower than f32 (quant_gemm.h): y[T,out] = x·Wᵀ +
// beta·y_in, y_in = y when null (else a residual [T, out] the projection adds). x_bf16 (may be null) is x already
// rounded to nearest-even bf16 by its producer (RMSNorm, attention, SwiGLU: ops/linear.h): a GEMM that takes bf16
// reads it instead of rounding x. On the CPU a weight held in bf16 takes the path gemm_engine.h decides
// (runtime.cpu_gemm): bf16 numerics (x rounded to bf16, f32 accumulation) through oneDNN's bf16 matmul or through
// OpenBLAS on x rounded and widened back, or f32 activations (held_gemm_xwt); other held types take held_gemm_xwt.
void held_linear_forward(const float* x, const uint16_t* x_bf16, const HeldMatrix& W, float beta, const float* y_in,
                         float* y, int64_t T);
// The backward of a weight W [out, in] held narrower than f32 (quant_gemm.h): dx[T,in] = dy·W +
// dx_beta·dx (dx non-null) and, for the bf16 GEMM copy of a trained matrix (full fine-tuning with
// training.matmul_dtype bf16), dW[out,in] += dyᵀ·x (dW non-null, f32: the master's gradient). On a
// card both GEMMs share dy's bf16 copy (dy_bf16 when dy's producer made it, may be null) and dW
// reads x's (x_bf16 when the forward kept its producer's copy, may be null; else x rounded there:
// tensor cores). On the CPU dx follows held_linear_forward's path for a bf16 weight (dy rounded to bf16, or dy_bf16
// read, under the bf16 numerics; held_gemm_xw otherwise) and dW is the f32 product dyᵀ·x (x_bf16 unread).
void held_linear_backward(const float* dy, const uint16_t* dy_bf16, const float* x, const uint16_t* x_bf16,
                          const HeldMatrix& W, float dx_beta, float* dx, float* dW, int64_t T);

}  // namespace bp::cpu
