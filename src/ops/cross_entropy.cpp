// Front-end of fused linear + cross-entropy (contract: ops/cross_entropy.h): checks shapes,
// dtypes and labels, allocates the one logits-chunk workspace from the CPU allocator (so the
// memory plan and the allocator's peak see it) and runs the kernel of its device (ops/dispatch.h).
#include "ops/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/cross_entropy.h"
#include "ops/op_checks.h"

namespace bp {

namespace {

void check_softcap(float softcap) {
  if (!(softcap >= 0.0f) || !std::isfinite(softcap))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[cross_entropy] softcap must be finite and >= 0, got {}", softcap));
}

void check_operands(const Tensor& x, const Tensor& W, const Tensor& labels, int64_t chunk_tokens) {
  for (const Tensor* t : {&x, &W, &labels}) ops::require_cpu("linear_cross_entropy", *t);
  ops::require_same_device("linear_cross_entropy", {&x, &W, &labels});
  BP_CHECK(x.rank() == 2 && x.dtype() == DType::F32, "[cross_entropy] x must be f32 [T, D], got {}", x.describe());
  BP_CHECK(W.rank() == 2 && W.dtype() != DType::I32, "[cross_entropy] W must be a float or held [V, D], got {}",
           W.describe());
  BP_CHECK(x.dim(1) == W.dim(1), "[cross_entropy] x has {} columns but W has {}", x.dim(1), W.dim(1));
  BP_CHECK(labels.rank() == 1 && labels.dtype() == DType::I32 && labels.dim(0) == x.dim(0),
           "[cross_entropy] labels must be i32 [{}] (one per token of x), got {}", x.dim(0), labels.describe());
  if (chunk_tokens <= 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[cross_entropy] chunk_tokens must be > 0, got {}", chunk_tokens));
  const int64_t V = W.dim(0);
  std::vector<int32_t> staging;
  const int32_t* lab = ops::host_ints(labels, staging);
  for (int64_t t = 0; t < labels.dim(0); ++t)
    if (lab[t] != kIgnoreLabel && (lab[t] < 0 || lab[t] >= V))
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[cross_entropy] label {} at token {} is outside the vocabulary [0, {}) and is not "
                              "the ignore index -100",
                              lab[t], t, V));
}

CrossEntropyResult run(const Tensor& x, const Tensor& W, const Tensor& labels, int64_t chunk_tokens, float grad_scale,
                       Tensor* dx, Tensor* dW, float softcap) {
  check_softcap(softcap);
  const int64_t T = x.dim(0), D = x.dim(1), V = W.dim(0);
  // Only the rows of the longest window (labelled tokens, not −100 spans) are ever written: an
  // SFT batch whose prompts are long needs far fewer than min(chunk, T) rows. The CUDA kernel keeps
  // its logits in a workspace of its own (backend/cuda/kernel_wrappers.h) and reads no buffer here.
  const int64_t rows = x.device().type == DeviceType::CPU
                           ? linear_cross_entropy_workspace_rows(labels.data<int32_t>(), T, chunk_tokens)
                           : 0;
  Tensor logits = Tensor::empty({rows, V}, DType::F32, x.device());
  const auto totals = ops::kernels(x).linear_cross_entropy(
      x.kernel_data<float>(), ops::held_matrix(W), labels.kernel_data<int32_t>(), T, D, V, chunk_tokens,
      rows ? logits.kernel_data<float>() : nullptr, grad_scale, dx ? dx->kernel_data<float>() : nullptr,
      dW ? dW->kernel_data<float>() : nullptr, softcap);
  return {totals.loss_sum, totals.n_counted};
}

}  // namespace

CrossEntropyResult linear_cross_entropy_forward(const Tensor& x, const Tensor& W, const Tensor& labels,
                                                int64_t chunk_tokens, float softcap) {
  check_operands(x, W, labels, chunk_tokens);
  return run(x, W, labels, chunk_tokens, 0.0f, nullptr, nullptr, softcap);
}

CrossEntropyResult linear_cross_entropy_forward_backward(const Tensor& x, const Tensor& W, const Tensor& labels,
                                                         float grad_scale, Tensor& dx, Tensor* dW, int64_t chunk_tokens,
                                                         float softcap) {
  check_operands(x, W, labels, chunk_tokens);
  BP_CHECK(dx.dtype() == DType::F32 && dx.shape() == x.shape(), "[cross_entropy] dx must be f32 {}, got {}",
           x.shape().str(), dx.describe());
  // A trainable head is f32, or the bf16 GEMM copy of its f32 master (training.matmul_dtype bf16).
  BP_CHECK(!dW || W.dtype() == DType::F32 || W.dtype() == DType::BF16,
           "[cross_entropy] dW asked for a frozen {} weight (held weights get no gradient)", W.describe());
  if (dW)
    BP_CHECK(dW->dtype() == DType::F32 && dW->shape() == W.shape(), "[cross_entropy] dW must be f32 {}, got {}",
             W.shape().str(), dW->describe());
  if (!std::isfinite(grad_scale))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[cross_entropy] grad_scale must be finite, got {}", grad_scale));
  ops::require_same_device("linear_cross_entropy", {&x, &dx, dW});
  return run(x, W, labels, chunk_tokens, grad_scale, &dx, dW, softcap);
}

int64_t linear_cross_entropy_workspace_rows(const int32_t* labels, int64_t tokens, int64_t chunk_tokens) {
  return cpu::cross_entropy_max_window(labels, tokens, chunk_tokens);
}

size_t linear_cross_entropy_workspace_bytes(int64_t tokens, int64_t vocab, int64_t chunk_tokens) {
  return static_cast<size_t>(std::min(chunk_tokens, tokens)) * static_cast<size_t>(vocab) * sizeof(float);
}

Tensor lm_head_logits(const Tensor& x, const Tensor& W, float softcap) {
  check_softcap(softcap);
  for (const Tensor* t : {&x, &W}) ops::require_cpu("lm_head", *t);
  BP_CHECK(x.rank() == 2 && x.dtype() == DType::F32, "[lm_head] x must be f32 [T, D], got {}", x.describe());
  BP_CHECK(W.rank() == 2 && W.dtype() != DType::I32, "[lm_head] W must be a float or held [V, D], got {}",
           W.describe());
  BP_CHECK(x.dim(1) == W.dim(1), "[lm_head] x has {} columns but W has {}", x.dim(1), W.dim(1));
  ops::require_same_device("lm_head", {&x, &W});
  const int64_t T = x.dim(0), D = x.dim(1), V = W.dim(0);
  Tensor out = Tensor::empty({T, V}, DType::F32, x.device());
  if (W.dtype() == DType::F32)
    ops::kernels(x).sgemm(false, true, T, V, D, 1.0f, x.kernel_data<float>(), D, W.kernel_data<float>(), D, 0.0f,
                          out.kernel_data<float>(), V);
  else
    ops::kernels(x).held_gemm_xwt(x.kernel_data<float>(), ops::held_matrix(W), 0.0f, out.kernel_data<float>(), T);
  if (softcap > 0.0f) {  // inference only: on the host (a device's logits make the round trip)
    Tensor host = out.to(Device{});
    float* p = host.data<float>();
    for (int64_t i = 0; i < T * V; ++i) p[i] = softcap * std::tanh(p[i] / softcap);
    out.copy_from(host);
  }
  return out;
}

}  // namespace bp
