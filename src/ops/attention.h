// Causal attention with grouped KV heads over packed variable-length sequences.
//
// q [T, Hq·d], k [T, Hkv·d], v [T, Hkv·d], o [T, Hq·d]; query head h reads KV head h / (Hq/Hkv).
// cu_seqlens [S+1] (i32, cu_seqlens[0] = 0, cu_seqlens[S] = T): token t of sample s attends to
// tokens of the same sample at positions <= t only — never across samples. Scale 1/sqrt(d).
// Options (AttentionShape; 0 = off): window W: the query at position i of its sample sees keys j
// with i - W < j <= i (Hugging Face's sliding-window causal mask: kv_idx > q_idx - W, W keys
// including its own), and key blocks wholly outside every row's window are never computed; scale
// replaces 1/sqrt(d) (Gemma: query_pre_attn_scalar^-0.5); softcap c maps each scaled score s to
// c·tanh(s/c) before the mask and softmax (Gemma 2's attn_logit_softcapping; the backward
// multiplies by 1 - tanh²).
// Blocked (flash-attention style, GEMMs per block of 64 query rows): scratch grows with 64 × the
// longest sample (plus per-head partial dk/dv in backward), never with T²; nothing [T × T] is
// materialised.
// Saved for backward: q, k, v, o (kept by the caller) and lse [Hq, T] (log-sum-exp of each row).
// o_bf16 (an output like lse, may be null; allocated when undefined): o also rounded to
// nearest-even bf16 by the same kernel, the operand of o_proj's bf16 GEMM (ops/linear.h x_bf16).
// Gradients: dq, dk, dv overwritten (=). dv_bf16 (an output, may be null; allocated when
// undefined): dv also rounded to nearest-even bf16 by the same kernel, the dy of v_proj's bf16
// GEMM (ops/linear.h dy_bf16). dq and dk have no copy here: RoPE's backward (or the q/k norms')
// rewrites them after, and writes theirs (ops/rope.h).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace bp {

struct AttentionShape {
  int n_heads = 0;       // Hq
  int n_kv_heads = 0;    // Hkv, divides Hq
  int head_dim = 0;      // d
  int window = 0;        // sliding window W (keys i-W < j <= i); 0 = unlimited
  float scale = 0.0f;    // score scale; 0 = 1/sqrt(d)
  float softcap = 0.0f;  // logit soft-capping c·tanh(s/c); 0 = none
};

Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                         const AttentionShape& shape, Tensor* lse /* out [Hq, T], may be null */,
                         Tensor* o_bf16 = nullptr);
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& cu_seqlens, const AttentionShape& shape, Tensor& dq,
                        Tensor& dk, Tensor& dv, Tensor* dv_bf16 = nullptr);

// Floats of scratch forward / backward allocate for T packed tokens when one sample may span all
// of them (the memory plan's bound), on a CPU with `threads` OpenMP threads. The shape's window
// bounds the keys of a block, hence the scratch; without one (the largest) it spans the sample.
int64_t attention_forward_scratch_floats(int64_t T, const AttentionShape& shape, int threads);
int64_t attention_backward_scratch_floats(int64_t T, const AttentionShape& shape, int threads);

}  // namespace bp
