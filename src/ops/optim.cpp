// Front-end of the optimizer ops (contract: ops/optim.h): checks, then the kernels of the
// tensors' device (ops/dispatch.h).
// Parameters, gradients and AdamW state are f32 (DESIGN.md: f32 optimizer state).
#include "ops/optim.h"

#include <cmath>

#include "ops/op_checks.h"

namespace bp {

static void require_cpu_f32(const Tensor& t, const char* op, const char* name) {
  ops::require_cpu(op, t);
  BP_CHECK(t.dtype() == DType::F32, "[{}] {} must be f32, got {}", op, name, t.describe());
}

void adamw_step(const std::vector<AdamWTensors>& tensors, const AdamWConfig& cfg, int64_t step) {
  std::vector<float*> params, ms, vs;
  std::vector<const float*> grads;
  std::vector<uint16_t*> copies;
  std::vector<int64_t> sizes;
  for (const AdamWTensors& t : tensors) {
    BP_CHECK(t.param && t.grad && t.m && t.v, "[adamw] null tensor in the list");
    const Tensor &param = *t.param, &grad = *t.grad, &m = *t.m, &v = *t.v;
    require_cpu_f32(param, "adamw", "param");
    require_cpu_f32(grad, "adamw", "grad");
    require_cpu_f32(m, "adamw", "m (first moment)");
    require_cpu_f32(v, "adamw", "v (second moment)");
    BP_CHECK(grad.shape() == param.shape() && m.shape() == param.shape() && v.shape() == param.shape(),
             "[adamw] shapes differ: param {}, grad {}, m {}, v {}", param.shape().str(), grad.shape().str(),
             m.shape().str(), v.shape().str());
    ops::require_same_device("adamw", {tensors.front().param, &param, &grad, &m, &v});
    if (t.gemm_copy) {
      ops::require_shape("adamw", "gemm_copy", *t.gemm_copy, param.shape(), DType::BF16);
      ops::require_same_device("adamw", {&param, t.gemm_copy});
    }
    copies.push_back(t.gemm_copy ? t.gemm_copy->kernel_data<uint16_t>() : nullptr);
    params.push_back(t.param->kernel_data<float>());
    grads.push_back(grad.kernel_data<float>());
    ms.push_back(t.m->kernel_data<float>());
    vs.push_back(t.v->kernel_data<float>());
    sizes.push_back(param.numel());
  }
  if (step < 1) throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[adamw] step must be >= 1, got {}", step));
  const bool betas_ok = cfg.beta1 >= 0.0f && cfg.beta1 < 1.0f && cfg.beta2 >= 0.0f && cfg.beta2 < 1.0f;
  if (!betas_ok || !(cfg.lr >= 0.0f) || !(cfg.eps > 0.0f) || !(cfg.weight_decay >= 0.0f))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[adamw] invalid hyper-parameters: lr {} (>= 0), beta1 {} and beta2 {} (in [0, 1)), "
                            "eps {} (> 0), weight_decay {} (>= 0)",
                            cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay));
  if (tensors.empty()) return;
  ops::kernels(*tensors.front().param)
      .adamw_step_all(params.data(), grads.data(), ms.data(), vs.data(), copies.data(), sizes.data(),
                      static_cast<int64_t>(tensors.size()), cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay,
                      step);
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWConfig& cfg, int64_t step) {
  adamw_step(std::vector<AdamWTensors>{{&param, &grad, &m, &v}}, cfg, step);
}

// One kernel call over every gradient (sum_squares_total: the tensors' sums added in order in
// double on their device), so a card is waited for once per norm, not once per tensor.
double sum_of_squares(const std::vector<const Tensor*>& grads) {
  std::vector<const float*> data;
  std::vector<int64_t> sizes;
  for (const Tensor* g : grads) {
    BP_CHECK(g != nullptr, "[grad_norm] null gradient tensor in the list");
    require_cpu_f32(*g, "grad_norm", "gradient");
    ops::require_same_device("grad_norm", {grads.front(), g});
    data.push_back(g->kernel_data<float>());
    sizes.push_back(g->numel());
  }
  if (grads.empty()) return 0.0;
  return ops::kernels(*grads.front()).sum_squares_total(data.data(), sizes.data(), static_cast<int64_t>(grads.size()));
}

double global_grad_norm(const std::vector<const Tensor*>& grads) {
  return std::sqrt(sum_of_squares(grads));
}

double clip_grad_norm(const std::vector<Tensor*>& grads, double max_norm) {
  if (!(max_norm > 0.0) || !std::isfinite(max_norm))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[clip_grad_norm] max_norm must be a finite number > 0, got {}", max_norm));
  std::vector<const Tensor*> view(grads.begin(), grads.end());
  const double norm = global_grad_norm(view);
  clip_to_norm(grads, max_norm, norm);
  return norm;
}

void clip_to_norm(const std::vector<Tensor*>& grads, double max_norm, double norm) {
  // A non-finite norm is left for the caller's non-finite check: scaling would only spread NaN.
  if (!grads.empty() && std::isfinite(norm) && norm > max_norm) {
    std::vector<float*> data;
    std::vector<int64_t> sizes;
    for (Tensor* g : grads) {
      data.push_back(g->kernel_data<float>());
      sizes.push_back(g->numel());
    }
    ops::kernels(*grads.front())
        .scale_all(data.data(), sizes.data(), static_cast<int64_t>(grads.size()), static_cast<float>(max_norm / norm));
  }
}

bool all_finite(const Tensor& t) {
  ops::require_cpu("all_finite", t);
  switch (t.dtype()) {
    case DType::F32: return ops::kernels(t).all_finite_f32(t.kernel_data<float>(), t.numel());
    case DType::BF16:
    case DType::F16:
      return ops::kernels(t).all_finite_16(t.kernel_data<uint16_t>(), t.numel(), t.dtype() == DType::BF16);
    case DType::I32: return true;
    default: return true;  // block types hold frozen weights only; their scales are checked on load
  }
}

}  // namespace bp
