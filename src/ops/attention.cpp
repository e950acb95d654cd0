// Front-end of causal grouped-query attention over packed samples (contract: ops/attention.h):
// checks shapes, dtypes and cu_seqlens, allocates outputs and the backward's [Hq, T] delta
// scratch from the CPU allocator, and runs the blocked kernels of its device
// (ops/dispatch.h).
#include "ops/attention.h"

#include <cmath>

#include "ops/op_checks.h"

namespace bp {

namespace {

void check_cpu(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) ops::require_cpu("attention", *t);
}

void check_matrix(const Tensor& t, const char* name, int64_t T, int64_t cols) {
  BP_CHECK(t.dtype() == DType::F32 && t.rank() == 2 && t.dim(0) == T && t.dim(1) == cols,
           "[attention] {} must be f32 [{}, {}], got {}", name, T, cols, t.describe());
}

cpu::AttentionDims dims_of(const AttentionShape& shape, int64_t T, int64_t S) {
  return {T, S, shape.n_heads, shape.n_kv_heads, shape.head_dim, shape.window, shape.scale, shape.softcap};
}

// Checks everything and returns the kernel's dimensions.
cpu::AttentionDims check_operands(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                                  const AttentionShape& shape) {
  check_cpu({&q, &k, &v, &cu_seqlens});
  ops::require_same_device("attention", {&q, &k, &v, &cu_seqlens});
  BP_CHECK(shape.n_heads > 0 && shape.n_kv_heads > 0 && shape.head_dim > 0 && shape.n_heads % shape.n_kv_heads == 0,
           "[attention] need n_heads > 0, n_kv_heads > 0 dividing it and head_dim > 0; got {} heads, {} kv heads, "
           "head_dim {}",
           shape.n_heads, shape.n_kv_heads, shape.head_dim);
  if (shape.window < 0 || !(shape.scale >= 0.0f) || !std::isfinite(shape.scale) || !(shape.softcap >= 0.0f) ||
      !std::isfinite(shape.softcap))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[attention] window, scale and softcap must be >= 0 and finite (0 = off); got window {}, "
                            "scale {}, softcap {}",
                            shape.window, shape.scale, shape.softcap));
  BP_CHECK(q.rank() == 2, "[attention] q must be [T, Hq*d], got {}", q.describe());
  const int64_t T = q.dim(0);
  check_matrix(q, "q", T, int64_t{shape.n_heads} * shape.head_dim);
  check_matrix(k, "k", T, int64_t{shape.n_kv_heads} * shape.head_dim);
  check_matrix(v, "v", T, int64_t{shape.n_kv_heads} * shape.head_dim);
  BP_CHECK(cu_seqlens.dtype() == DType::I32 && cu_seqlens.rank() == 1 && cu_seqlens.dim(0) >= 2,
           "[attention] cu_seqlens must be i32 [S+1] with S >= 1, got {}", cu_seqlens.describe());
  std::vector<int32_t> staging;
  const int32_t* cu = ops::host_ints(cu_seqlens, staging);
  const int64_t S = cu_seqlens.dim(0) - 1;
  if (cu[0] != 0 || cu[S] != T)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[attention] cu_seqlens must start at 0 and end at the token count {}; got {} and {}", T,
                            cu[0], cu[S]));
  for (int64_t s = 0; s < S; ++s)
    if (cu[s + 1] < cu[s])
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[attention] cu_seqlens decreases at sample {}: {} then {}", s, cu[s], cu[s + 1]));
  return dims_of(shape, T, S);
}

}  // namespace

Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens,
                         const AttentionShape& shape, Tensor* lse, Tensor* o_bf16) {
  const auto dims = check_operands(q, k, v, cu_seqlens, shape);
  uint16_t* o16 = ops::bf16_output("attention", "o_bf16", o_bf16, q.shape(), q.device());
  Tensor out = Tensor::empty(q.shape(), DType::F32, q.device());
  float* lse_ptr = nullptr;
  if (lse) {
    // An output: reuse the caller's tensor when it already has the right shape, else allocate.
    const Shape want{shape.n_heads, dims.tokens};
    if (!lse->defined() || lse->shape() != want || lse->dtype() != DType::F32 || !(lse->device() == q.device()))
      *lse = Tensor::empty(want, DType::F32, q.device());
    lse_ptr = lse->kernel_data<float>();
  }
  if (dims.tokens == 0) return out;
  ops::kernels(q).attention_forward(q.kernel_data<float>(), k.kernel_data<float>(), v.kernel_data<float>(),
                                    cu_seqlens.kernel_data<int32_t>(), dims, out.kernel_data<float>(), o16, lse_ptr);
  return out;
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& cu_seqlens, const AttentionShape& shape, Tensor& dq,
                        Tensor& dk, Tensor& dv, Tensor* dv_bf16) {
  const auto dims = check_operands(q, k, v, cu_seqlens, shape);
  check_cpu({&dout, &out, &lse, &dq, &dk, &dv});
  ops::require_same_device("attention", {&q, &dout, &out, &lse, &dq, &dk, &dv});
  const int64_t T = dims.tokens;
  check_matrix(dout, "dout", T, q.dim(1));
  check_matrix(out, "out", T, q.dim(1));
  check_matrix(lse, "lse", shape.n_heads, T);
  check_matrix(dq, "dq", T, q.dim(1));
  check_matrix(dk, "dk", T, k.dim(1));
  check_matrix(dv, "dv", T, v.dim(1));
  uint16_t* dv16 = ops::bf16_output("attention", "dv_bf16", dv_bf16, v.shape(), q.device());
  if (T == 0) return;
  Tensor delta = Tensor::empty({shape.n_heads, T}, DType::F32, q.device());
  ops::kernels(q).attention_backward(dout.kernel_data<float>(), q.kernel_data<float>(), k.kernel_data<float>(),
                                     v.kernel_data<float>(), out.kernel_data<float>(), lse.kernel_data<float>(),
                                     cu_seqlens.kernel_data<int32_t>(), dims, delta.kernel_data<float>(),
                                     dq.kernel_data<float>(), dk.kernel_data<float>(), dv.kernel_data<float>(), dv16);
}

int64_t attention_forward_scratch_floats(int64_t T, const AttentionShape& shape, int threads) {
  return ops::kernels(DeviceType::CPU).attention_forward_scratch_floats(T, dims_of(shape, T, 1), threads);
}

int64_t attention_backward_scratch_floats(int64_t T, const AttentionShape& shape, int threads) {
  const cpu::AttentionDims dims = dims_of(shape, T, 1);
  return ops::kernels(DeviceType::CPU).attention_backward_scratch_floats(T, dims, threads);
}

}  // namespace bp
