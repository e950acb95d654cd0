// Mixture-of-Experts front-ends: shape/dtype checks and dispatch to backend/cpu/moe.cpp. Contract: ops/moe.h.
#include "ops/moe.h"

#include <string>
#include <vector>

#include "ops/op_checks.h"

namespace bp {

namespace {
constexpr const char* kOp = "moe";

void require_weights(const Tensor& weights, const MoeDispatch& d) {
  ops::require_tensor(kOp, "weights", weights, DType::F32, 2);
  if (weights.numel() != d.rows())
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[{}] weights {} for {} routed rows", kOp, weights.shape().str(), d.rows()));
}
}  // namespace

MoeRouting moe_route_forward(const Tensor& logits, int64_t k, bool renormalize) {
  ops::require_tensor(kOp, "logits", logits, DType::F32, 2);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  if (k < 1 || k > E) throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[{}] top-{} of {} experts", kOp, k, E));
  MoeRouting r{Tensor::empty({T, k}, DType::I32, logits.device()), Tensor::empty({T, k}, DType::F32, logits.device())};
  ops::kernels(logits).moe_route_forward(logits.kernel_data<float>(), T, E, k, renormalize,
                                         r.expert_ids.kernel_data<int32_t>(), r.weights.kernel_data<float>());
  return r;
}

void moe_route_backward(const Tensor& logits, const Tensor& expert_ids, const Tensor& dweights, const Tensor* aux_grad,
                        bool renormalize, Tensor& dlogits) {
  ops::require_tensor(kOp, "logits", logits, DType::F32, 2);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  ops::require_tensor(kOp, "expert_ids", expert_ids, DType::I32, 2);
  const int64_t k = expert_ids.dim(1);
  ops::require_shape(kOp, "expert_ids", expert_ids, {T, k}, DType::I32);
  ops::require_shape(kOp, "dweights", dweights, {T, k});
  ops::require_shape(kOp, "dlogits", dlogits, {T, E});
  if (aux_grad) ops::require_shape(kOp, "aux_grad", *aux_grad, {E});
  ops::require_same_device(kOp, {&logits, &expert_ids, &dweights, aux_grad, &dlogits});
  ops::kernels(logits).moe_route_backward(
      logits.kernel_data<float>(), expert_ids.kernel_data<int32_t>(), dweights.kernel_data<float>(),
      aux_grad ? aux_grad->kernel_data<float>() : nullptr, T, E, k, renormalize, dlogits.kernel_data<float>());
}

MoeDispatch moe_sort(const Tensor& expert_ids, int64_t num_experts) {
  ops::require_tensor(kOp, "expert_ids", expert_ids, DType::I32, 2);
  const int64_t T = expert_ids.dim(0), k = expert_ids.dim(1);
  auto out_of_range = [&](const std::string& what) {
    return Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[{}] {} outside [0, {})", kOp, what, num_experts));
  };
  const Device dev = expert_ids.device();
  // On the CPU the ids are checked before the counting sort indexes by them; a device's kernel
  // counts only ids in range, so offsets[E] < T·k (read back below) says one was not.
  if (dev.type == DeviceType::CPU) {
    const int32_t* ids = expert_ids.data<int32_t>();
    for (int64_t a = 0; a < T * k; ++a)
      if (ids[a] < 0 || ids[a] >= num_experts)
        throw out_of_range(fmt::format("expert id {} at assignment {} is", ids[a], a));
  }
  MoeDispatch d{Tensor::empty({num_experts + 1}, DType::I32, dev),
                Tensor::empty({T * k}, DType::I32, dev),
                Tensor::empty({T * k}, DType::I32, dev),
                {}};
  ops::kernels(expert_ids)
      .moe_sort(expert_ids.kernel_data<int32_t>(), T, k, num_experts, d.offsets.kernel_data<int32_t>(),
                d.row_token.kernel_data<int32_t>(), d.slot_of.kernel_data<int32_t>());
  // The host's per-expert GEMM loop reads the offsets: one copy of E + 1 ints from a device.
  std::vector<int32_t> off_staging;
  const int32_t* off = ops::host_ints(d.offsets, off_staging);
  d.host_offsets.assign(off, off + num_experts + 1);
  if (d.host_offsets.back() != T * k)
    throw out_of_range(fmt::format("{} of the {} expert ids are", T * k - d.host_offsets.back(), T * k));
  return d;
}

Tensor moe_gather_forward(const Tensor& x, const MoeDispatch& d) {
  ops::require_tensor(kOp, "x", x, DType::F32, 2);
  ops::require_same_device(kOp, {&x, &d.row_token});
  const int64_t D = x.dim(1);
  Tensor xs = Tensor::empty({d.rows(), D}, DType::F32, x.device());
  ops::kernels(x).moe_gather_forward(x.kernel_data<float>(), d.row_token.kernel_data<int32_t>(), d.rows(), D,
                                     xs.kernel_data<float>());
  return xs;
}

void moe_gather_backward(const Tensor& dxs, const MoeDispatch& d, Tensor& dx) {
  ops::require_tensor(kOp, "dx", dx, DType::F32, 2);
  const int64_t T = dx.dim(0), D = dx.dim(1);
  ops::require_shape(kOp, "dxs", dxs, {d.rows(), D});
  if (T == 0 || d.rows() % T != 0)
    throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[{}] {} routed rows for {} tokens", kOp, d.rows(), T));
  ops::require_same_device(kOp, {&dxs, &dx, &d.slot_of});
  ops::kernels(dx).moe_gather_backward(dxs.kernel_data<float>(), d.slot_of.kernel_data<int32_t>(), T, d.rows() / T, D,
                                       dx.kernel_data<float>());
}

void moe_scatter_forward(const Tensor& ys, const Tensor& weights, const MoeDispatch& d, Tensor& out) {
  require_weights(weights, d);
  ops::require_tensor(kOp, "out", out, DType::F32, 2);
  const int64_t T = weights.dim(0), k = weights.dim(1), D = out.dim(1);
  ops::require_shape(kOp, "out", out, {T, D});
  ops::require_shape(kOp, "ys", ys, {T * k, D});
  ops::require_same_device(kOp, {&ys, &weights, &out, &d.slot_of});
  ops::kernels(out).moe_scatter_forward(ys.kernel_data<float>(), weights.kernel_data<float>(),
                                        d.slot_of.kernel_data<int32_t>(), T, k, D, out.kernel_data<float>());
}

void moe_scatter_backward(const Tensor& dout, const Tensor& ys, const Tensor& weights, const MoeDispatch& d,
                          Tensor& dys, Tensor& dweights) {
  require_weights(weights, d);
  const int64_t T = weights.dim(0), k = weights.dim(1);
  ops::require_tensor(kOp, "dout", dout, DType::F32, 2);
  const int64_t D = dout.dim(1);
  ops::require_shape(kOp, "dout", dout, {T, D});
  ops::require_shape(kOp, "ys", ys, {T * k, D});
  ops::require_shape(kOp, "dys", dys, {T * k, D});
  ops::require_shape(kOp, "dweights", dweights, {T, k});
  ops::require_same_device(kOp, {&dout, &ys, &weights, &dys, &dweights, &d.slot_of});
  ops::kernels(dout).moe_scatter_backward(dout.kernel_data<float>(), ys.kernel_data<float>(),
                                          weights.kernel_data<float>(), d.slot_of.kernel_data<int32_t>(), T, k, D,
                                          dys.kernel_data<float>(), dweights.kernel_data<float>());
}

void moe_aux_accumulate(const Tensor& logits, const Tensor& expert_ids, Tensor& counts, Tensor& prob_sum) {
  ops::require_tensor(kOp, "logits", logits, DType::F32, 2);
  const int64_t T = logits.dim(0), E = logits.dim(1);
  ops::require_tensor(kOp, "expert_ids", expert_ids, DType::I32, 2);
  ops::require_shape(kOp, "expert_ids", expert_ids, {T, expert_ids.dim(1)}, DType::I32);
  ops::require_shape(kOp, "counts", counts, {E});
  ops::require_shape(kOp, "prob_sum", prob_sum, {E});
  ops::require_same_device(kOp, {&logits, &expert_ids, &counts, &prob_sum});
  ops::kernels(logits).moe_aux_accumulate(logits.kernel_data<float>(), expert_ids.kernel_data<int32_t>(), T, E,
                                          expert_ids.dim(1), counts.kernel_data<float>(),
                                          prob_sum.kernel_data<float>());
}

double moe_aux_loss(const std::vector<float>& counts, const std::vector<float>& prob_sum, int64_t n_tokens) {
  if (n_tokens <= 0 || counts.size() != prob_sum.size()) return 0.0;
  const double N = static_cast<double>(n_tokens), E = static_cast<double>(counts.size());
  double s = 0.0;
  for (size_t e = 0; e < counts.size(); ++e) s += (counts[e] / N) * (prob_sum[e] / N);
  return E * s;
}

std::vector<float> moe_aux_grad(const std::vector<float>& counts, int64_t n_tokens, double coef) {
  std::vector<float> g(counts.size(), 0.0f);
  if (n_tokens <= 0) return g;
  const double N = static_cast<double>(n_tokens), E = static_cast<double>(counts.size());
  for (size_t e = 0; e < counts.size(); ++e) g[e] = static_cast<float>(coef * E * counts[e] / (N * N));
  return g;
}

}  // namespace bp
