// Optimizer ops: AdamW, global gradient norm and clipping, non-finite detection.
//
// AdamW (decoupled weight decay, bias correction, f32 state), step t counted from 1:
//   m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//   m̂ = m/(1−β1^t);  v̂ = v/(1−β2^t)
//   p = p − lr·wd·p − lr·m̂/(sqrt(v̂)+eps)          (PyTorch torch.optim.AdamW order)
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace bp {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// One trainable tensor's AdamW update: its parameter, gradient and two moments (same shape, f32,
// one device), and optionally the parameter's bf16 GEMM copy (same shape, bf16, same device:
// Model's copies for training.matmul_dtype bf16), rewritten as bf16(updated parameter), nearest
// even, by the same kernel that writes the parameter (as llm.c does): no second pass over the
// masters, no rounding launch per matrix.
struct AdamWTensors {
  Tensor* param = nullptr;
  const Tensor* grad = nullptr;
  Tensor* m = nullptr;
  Tensor* v = nullptr;
  Tensor* gemm_copy = nullptr;
};
// The update of every tensor of the list, in one kernel call: on a card, a few launches for the
// whole list instead of one per tensor (a LoRA of Qwen2.5-0.5B trains 336 tensors).
void adamw_step(const std::vector<AdamWTensors>& tensors, const AdamWConfig& cfg, int64_t step);
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWConfig& cfg, int64_t step);

// Σ over all tensors of Σ g², accumulated in double (tensor by tensor, in list order). Non-finite
// if any value is.
double sum_of_squares(const std::vector<const Tensor*>& grads);
// sqrt(sum_of_squares(grads)).
double global_grad_norm(const std::vector<const Tensor*>& grads);
// Scales every gradient by max_norm/norm when norm > max_norm; returns the norm before clipping.
double clip_grad_norm(const std::vector<Tensor*>& grads, double max_norm);
// The same with the norm given (data-parallel: the norm summed over the ranks' shards): scales by
// max_norm/norm when it is finite and above max_norm.
void clip_to_norm(const std::vector<Tensor*>& grads, double max_norm, double norm);
bool all_finite(const Tensor& t);

}  // namespace bp
