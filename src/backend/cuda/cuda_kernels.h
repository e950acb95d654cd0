// Host-side declarations of the real CUDA backend's kernels (the functions the .cu files
// instantiate from the .cuh sources), for host C++ compiled by g++ in CUDA builds: the device
// tests (tests/cuda_device) and the CUDA dispatch table (cuda_kernel_wrappers.h). Only valid when
// BP_HAVE_CUDA. Each declaration matches the definition in its .cuh.
// Pointers are device pointers; bf16 is CUDA's __nv_bfloat16, f16 its __half.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cpu/attention.h"  // AttentionDims, shared with the CPU kernels
#include "backend/cpu/linear.h"     // LoraDropoutMember, shared with the CPU kernels
#include "backend/cuda/attention_limits.h"
#include "backend/cuda/dequant_types.h"
#include "backend/cuda/gemm_desc.h"
#include "core/dtype.h"

namespace bp::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

template <class T>
void rms_norm_forward(const T* x, const float* w, float eps, T* y, bf16* y16, float* rstd, int64_t N, int64_t D,
                      cudaStream_t stream);
template <class T>
void rms_norm_backward(const T* dy, const T* x, const float* w, const float* rstd, T* dx, bf16* dx16, float* dw,
                       int64_t N, int64_t D, bool accumulate, cudaStream_t stream);
template <class T>
void swiglu_forward(const T* gate, const T* up, T* h, bf16* h16, int64_t n, cudaStream_t stream);
template <class T>
void swiglu_backward(const T* dh, const T* gate, const T* up, T* dgate, T* dup, bf16* dgate16, bf16* dup16, int64_t n,
                     cudaStream_t stream);
template <class T>
void geglu_forward(const T* gate, const T* up, T* h, bf16* h16, int64_t n, cudaStream_t stream);
template <class T>
void geglu_backward(const T* dh, const T* gate, const T* up, T* dgate, T* dup, bf16* dgate16, bf16* dup16, int64_t n,
                    cudaStream_t stream);
template <class T>
void rope_apply(T* a, int64_t a_heads, bf16* a16, const float* a_bias, T* b, int64_t b_heads, bf16* b16,
                const float* b_bias, const int32_t* positions, const float* inv_freq, int64_t T_tokens,
                int64_t head_dim, int64_t rot_dim, float attn_scale, bool inverse, cudaStream_t stream);
template <class T>
void embedding_forward(const int32_t* ids, const T* table, T* y, int64_t T_tokens, int64_t D, cudaStream_t stream);
template <class T>
void embedding_backward(const T* dy, const int32_t* ids, float* dtable, int64_t T_tokens, int64_t D,
                        cudaStream_t stream);
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                float eps, float weight_decay, int64_t step, cudaStream_t stream);
void adamw_step_all(float* const* params, const float* const* grads, float* const* ms, float* const* vs,
                    bf16* const* copies, const int64_t* ns, int64_t count, float lr, float beta1, float beta2,
                    float eps, float weight_decay, int64_t step, cudaStream_t stream);
void scale_all(float* const* ys, const int64_t* ns, int64_t count, float a, cudaStream_t stream);
template <class T>
double sum_squares(const T* x, int64_t n, void* scratch, cudaStream_t stream);
template <class T>
double sum_squares_total(const T* const* xs, const int64_t* ns, int64_t count, void* scratch, cudaStream_t stream);
size_t sum_squares_total_scratch_bytes(int64_t max_n, int64_t count);
template <class T>
bool all_finite(const T* x, int64_t n, void* scratch, cudaStream_t stream);
size_t optim_scratch_bytes(int64_t n);

// elementwise.cuh
void axpy_inplace(float* y, float a, const float* x, int64_t n, cudaStream_t stream);
void add_inplace(float* y, const float* x, int64_t n, cudaStream_t stream);
void scale_inplace(float* y, float a, int64_t n, cudaStream_t stream);
void add_bias_inplace(float* y, const float* b, int64_t T_tokens, int64_t N, cudaStream_t stream);
void bias_grad_accumulate(const float* dy, float* db, int64_t T_tokens, int64_t N, cudaStream_t stream);
void column_scale_add(float* y, const float* c, const float* z, int64_t T_tokens, int64_t N, cudaStream_t stream);
void column_dot_accumulate(const float* a, const float* b, const float* w, float* acc, int64_t T_tokens, int64_t N,
                           cudaStream_t stream);
void dora_column_scale(const float* m, const float* nsq, float* c, float* inv_n, int64_t N, cudaStream_t stream);
void convert_bf16_to_f32(const bf16* src, float* dst, int64_t n, cudaStream_t stream);
void convert_f32_to_bf16(const float* src, bf16* dst, int64_t n, cudaStream_t stream);
int f16_scale_exponent(float abs_max);
void convert_f32_to_f16_scaled(const float* src, f16* dst, int64_t n, gemm::F16OperandScale* scale,
                               cudaStream_t stream);

// lora_dropout.cuh: LoRA dropout fused into the skinny products, no dropped copy of x.
void lora_dropout_xa(const float* x, const float* A, float* xa, int64_t T, int64_t in,
                     const cpu::LoraDropoutMember* members, int n_members, float p, cudaStream_t stream);
void lora_dropout_dA_accumulate(const float* dxa, const float* x, float* dA, int64_t T, int64_t in,
                                const cpu::LoraDropoutMember* members, int n_members, float p, float* workspace,
                                cudaStream_t stream);
void lora_dropout_dx_accumulate(const float* dxa, const float* A, float* dx, int64_t T, int64_t in,
                                const cpu::LoraDropoutMember* members, int n_members, float p, cudaStream_t stream);

// dequant.cuh: rows of a held weight (any type dequantize_supported says) as f32, bf16 or f16; false for
// another type (nothing launched).
using cuda_dequant::dequantize_supported;
template <class Out>
bool dequantize_rows(DType type, const void* src, int64_t cols, int64_t row0, int64_t n_rows, Out* dst,
                     cudaStream_t stream);
template <class Out>
bool dequantize_gather_rows(DType type, const void* src, int64_t cols, const int32_t* ids, int64_t n_rows, Out* dst,
                            cudaStream_t stream);

template <class Bits>
bool held_abs_max_bits(DType type, const void* src, int64_t n_rows, int64_t cols, Bits* result, cudaStream_t stream);

// gemm.cuh (cublaslt_gemm.cpp)
void gemm(const gemm::GemmDesc& desc, const void* A, const void* B, void* C, void* workspace, size_t workspace_bytes,
          cudaStream_t stream, const void* C_in = nullptr);

// cross_entropy.cuh (the same struct as there)
struct CrossEntropyResult {
  double loss_sum = 0.0;
  int64_t n_counted = 0;
};
template <class T>
size_t cross_entropy_workspace_bytes(int64_t chunk, int64_t V);
template <class T>
CrossEntropyResult linear_cross_entropy(const T* x, const T* W, const int32_t* labels, const int32_t* labels_host,
                                        int64_t T_tokens, int64_t D, int64_t V, int64_t chunk, void* workspace,
                                        float grad_scale, T* dx, float* dW, gemm::Workspace gemm_workspace,
                                        cudaStream_t stream, float softcap);
// The same with a frozen head held in w_type (dequantize_supported), f32 activations, W dequantized
// in panels of panel_rows rows inside the GEMMs; no dW (a held weight gets no gradient).
size_t cross_entropy_held_workspace_bytes(int64_t chunk, int64_t V, int64_t D, int64_t panel_rows);
CrossEntropyResult linear_cross_entropy_held(const float* x, DType w_type, const void* W, const int32_t* labels,
                                             const int32_t* labels_host, int64_t T_tokens, int64_t D, int64_t V,
                                             int64_t chunk, int64_t panel_rows, void* workspace, float grad_scale,
                                             float* dx, gemm::Workspace gemm_workspace, cudaStream_t stream,
                                             float softcap);

// Causal grouped-query attention over packed samples (attention.cuh; contract ops/attention.h,
// same layouts and AttentionDims as cpu::attention_forward/backward). q, o, dout, dq [T, Hq·d],
// k, v, dk, dv [T, Hkv·d] as T; cu_seqlens [S+1] i32 on the device; lse, delta [Hq, T] f32
// (lse written when non-null; delta is the backward's scratch). Outputs overwritten (=).
// Needs 1 <= head_dim <= kCudaAttentionMaxHeadDim and Hkv dividing Hq: the caller checks.
using AttentionDims = ::bp::cpu::AttentionDims;
template <class T>
void attention_forward(const T* q, const T* k, const T* v, const int32_t* cu_seqlens, const AttentionDims& dims, T* o,
                       bf16* o16, float* lse, cudaStream_t stream);
template <class T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* o, const float* lse,
                        const int32_t* cu_seqlens, const AttentionDims& dims, float* delta, T* dq, T* dk, T* dv,
                        bf16* dv16, cudaStream_t stream);

// Mixture-of-Experts (moe.cuh; contract ops/moe.h). moe_aux_accumulate's stats: 2·T floats of scratch.
void moe_route_forward(const float* logits, int64_t T, int64_t E, int64_t k, bool renormalize, int32_t* expert_ids,
                       float* weights, cudaStream_t stream);
void moe_route_backward(const float* logits, const int32_t* expert_ids, const float* dweights, const float* aux_grad,
                        int64_t T, int64_t E, int64_t k, bool renormalize, float* dlogits, cudaStream_t stream);
void moe_sort(const int32_t* expert_ids, int64_t T, int64_t k, int64_t E, int32_t* offsets, int32_t* row_token,
              int32_t* slot_of, cudaStream_t stream);
void moe_gather_forward(const float* x, const int32_t* row_token, int64_t rows, int64_t D, float* xs,
                        cudaStream_t stream);
void moe_gather_backward(const float* dxs, const int32_t* slot_of, int64_t T, int64_t k, int64_t D, float* dx,
                         cudaStream_t stream);
void moe_scatter_forward(const float* ys, const float* weights, const int32_t* slot_of, int64_t T, int64_t k, int64_t D,
                         float* out, cudaStream_t stream);
void moe_scatter_backward(const float* dout, const float* ys, const float* weights, const int32_t* slot_of, int64_t T,
                          int64_t k, int64_t D, float* dys, float* dweights, cudaStream_t stream);
void moe_aux_accumulate(const float* logits, const int32_t* expert_ids, int64_t T, int64_t E, int64_t k, float* counts,
                        float* prob_sum, float* stats, cudaStream_t stream);

}  // namespace bp::cuda
