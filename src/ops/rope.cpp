// RoPE front-end: inverse frequencies (with Llama-3 scaling) and dispatch to
// backend/cpu/rope.cpp. Contract: ops/rope.h.
//
// rope_inv_freq follows Hugging Face transformers:
//   _compute_default_rope_parameters: inv_freq[i] = 1 / theta^(2i/d)
//   _compute_llama3_parameters (rope_type "llama3"), with L = original_max_position:
//     wavelen = 2π / inv_freq
//     wavelen > L/low_freq_factor  (low frequencies)  -> inv_freq / factor
//     wavelen < L/high_freq_factor (high frequencies) -> inv_freq unchanged
//     otherwise (medium), smooth = (L/wavelen − low) / (high − low):
//                                  -> (1 − smooth)·inv_freq/factor + smooth·inv_freq
//   _compute_longrope_parameters (rope_type "longrope"), d = rotary_dim:
//     inv_freq[i] = 1 / (ext[i] · theta^(2i/d)), ext = long_factor if max_position + 1 >
//     original_max_position else short_factor (longrope_frequency_update's per-forward choice)
// With partial rotary every exponent's d is rotary_dim (_compute_default_rope_parameters' dim).
#include "ops/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ops/op_checks.h"

namespace bp {

namespace {

constexpr const char* kOp = "rope";

void check_config(const RopeConfig& cfg) {
  if (cfg.head_dim <= 0 || cfg.head_dim % 2 != 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[rope] head_dim must be positive and even but is {}", cfg.head_dim));
  if (!(cfg.theta > 0.0f))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[rope] rope_theta must be positive but is {}", cfg.theta));
  if (!(cfg.linear_factor > 0.0f))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[rope] linear rope_scaling factor must be positive but is {}", cfg.linear_factor));
  if (cfg.llama3_scaling) {
    if (!(cfg.factor > 0.0f) || !(cfg.low_freq_factor > 0.0f) || !(cfg.high_freq_factor > cfg.low_freq_factor) ||
        cfg.original_max_position <= 0)
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[rope] invalid llama3 rope_scaling: factor {}, low_freq_factor {}, high_freq_factor {}, "
                              "original_max_position_embeddings {} (need factor > 0, 0 < low < high, max > 0)",
                              cfg.factor, cfg.low_freq_factor, cfg.high_freq_factor, cfg.original_max_position));
  }
  const int rot = cfg.rot_dim();
  if (rot < 0 || rot > cfg.head_dim || rot % 2 != 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[rope] rotary_dim must be even and in [0, head_dim {}] but is {}", cfg.head_dim, rot));
  if (cfg.longrope) {
    const size_t n = static_cast<size_t>(rot / 2);
    if (cfg.short_factor.size() != n || cfg.long_factor.size() != n || cfg.original_max_position <= 0 ||
        !(cfg.attention_factor > 0.0f))
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[rope] invalid longrope scaling: short_factor has {} values, long_factor {} (need "
                              "rotary_dim/2 = {}), original_max_position_embeddings {}, attention_factor {}",
                              cfg.short_factor.size(), cfg.long_factor.size(), n, cfg.original_max_position,
                              cfg.attention_factor));
  }
}

void check_x(const char* name, const Tensor& x, const Tensor& positions, int n_heads, const RopeConfig& cfg) {
  ops::require_tensor(kOp, name, x, DType::F32, 2);
  BP_CHECK(n_heads > 0 && x.dim(1) == static_cast<int64_t>(n_heads) * cfg.head_dim,
           "[rope] {} has {} columns but {} heads × head_dim {} = {}", name, x.dim(1), n_heads, cfg.head_dim,
           static_cast<int64_t>(n_heads) * cfg.head_dim);
  ops::require_same_device(kOp, {&x, &positions});
  BP_CHECK(positions.dim(0) == x.dim(0), "[rope] {} has {} rows but positions has {}", name, x.dim(0),
           positions.dim(0));
}

// Checks the positions; returns the largest (0 when there are none).
int64_t check_positions(const Tensor& positions) {
  std::vector<int32_t> staging;
  const int32_t* p = ops::host_ints(positions, staging);
  int64_t max_pos = 0;
  for (int64_t t = 0; t < positions.dim(0); ++t) {
    if (p[t] < 0)
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[rope] position {} at token {} is negative", p[t], t));
    max_pos = std::max<int64_t>(max_pos, p[t]);
  }
  return max_pos;
}

// A bias (may be null) of x's width on x's device; its data, or null.
const float* bias_of(const char* name, const Tensor* bias, const Tensor& x) {
  if (!bias) return nullptr;
  ops::require_shape(kOp, name, *bias, Shape{x.dim(1)});
  ops::require_same_device(kOp, {&x, bias});
  return bias->kernel_data<float>();
}

// One tensor (k null) or q and k: one kernel call either way.
void apply(Tensor& q, Tensor* k, const Tensor& positions, int q_heads, int k_heads, const RopeConfig& cfg, bool inverse,
           Tensor* q_bf16, Tensor* k_bf16, const Tensor* q_bias = nullptr, const Tensor* k_bias = nullptr) {
  check_config(cfg);
  ops::require_tensor(kOp, "positions", positions, DType::I32, 1);
  check_x(k ? "q" : "x", q, positions, q_heads, cfg);
  if (k) check_x("k", *k, positions, k_heads, cfg);
  const float* qb = bias_of("q_bias", q_bias, q);
  const float* kb = k ? bias_of("k_bias", k_bias, *k) : nullptr;
  const int64_t max_pos = check_positions(positions);
  cpu::RopeTarget a{q.kernel_data<float>(), q_heads,
                    ops::bf16_output(kOp, k ? "dq_bf16" : "dx_bf16", q_bf16, q.shape(), q.device()), qb};
  cpu::RopeTarget b;
  if (k) b = {k->kernel_data<float>(), k_heads, ops::bf16_output(kOp, "dk_bf16", k_bf16, k->shape(), k->device()), kb};
  const std::vector<float> inv_freq = rope_inv_freq(cfg, max_pos);
  ops::kernels(q).rope_apply(a, b, positions.kernel_data<int32_t>(), inv_freq.data(), q.dim(0), cfg.head_dim,
                             cfg.rot_dim(), cfg.longrope ? cfg.attention_factor : 1.0f, inverse);
}

}  // namespace

std::vector<float> rope_inv_freq(const RopeConfig& cfg, int64_t max_position) {
  check_config(cfg);
  // f32 throughout, in HF's operation order (torch evaluates these in f32; `a / t` for a Python
  // scalar a is reciprocal(t)·a). The unscaled frequencies must match HF bit for bit: angles are
  // f32 products pos·inv_freq, so one ulp of inv_freq moves the angle of token 8000 by ~5e-4.
  // theta^e is evaluated in double and rounded once: the correctly rounded f32 power.
  const int rot = cfg.rot_dim(), half = rot / 2;
  std::vector<float> out(static_cast<size_t>(half));
  const std::vector<float>& ext =
      max_position + 1 > cfg.original_max_position ? cfg.long_factor : cfg.short_factor;  // longrope
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const float L = static_cast<float>(cfg.original_max_position);
  const float low_wavelen = static_cast<float>(static_cast<double>(cfg.original_max_position) / cfg.low_freq_factor);
  const float high_wavelen = static_cast<float>(static_cast<double>(cfg.original_max_position) / cfg.high_freq_factor);
  const float band = static_cast<float>(static_cast<double>(cfg.high_freq_factor) - cfg.low_freq_factor);
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rot);
    const float p = static_cast<float>(std::pow(static_cast<double>(cfg.theta), static_cast<double>(e)));
    float f = cfg.longrope ? 1.0f / (ext[static_cast<size_t>(i)] * p) : 1.0f / p;
    if (cfg.llama3_scaling) {
      const float wavelen = (1.0f / f) * two_pi;
      if (wavelen > low_wavelen) {
        f = f / cfg.factor;  // low frequencies: slowed down by `factor`
      } else if (!(wavelen < high_wavelen)) {
        // medium: interpolate between scaled and unscaled
        const float smooth = ((1.0f / wavelen) * L - cfg.low_freq_factor) / band;
        f = (1.0f - smooth) * f / cfg.factor + smooth * f;
      }  // high frequencies: unchanged
    }
    if (cfg.linear_factor != 1.0f) f /= cfg.linear_factor;  // HF _compute_linear_scaling_rope_parameters
    out[static_cast<size_t>(i)] = f;
  }
  return out;
}

void rope_forward(Tensor& x, const Tensor& positions, int n_heads, const RopeConfig& cfg) {
  apply(x, nullptr, positions, n_heads, 0, cfg, false, nullptr, nullptr);
}

void rope_backward(Tensor& dx, const Tensor& positions, int n_heads, const RopeConfig& cfg, Tensor* dx_bf16) {
  apply(dx, nullptr, positions, n_heads, 0, cfg, true, dx_bf16, nullptr);
}

void rope_forward(Tensor& q, Tensor& k, const Tensor& positions, int q_heads, int k_heads, const RopeConfig& cfg,
                  const Tensor* q_bias, const Tensor* k_bias) {
  apply(q, &k, positions, q_heads, k_heads, cfg, false, nullptr, nullptr, q_bias, k_bias);
}

void rope_backward(Tensor& dq, Tensor& dk, const Tensor& positions, int q_heads, int k_heads, const RopeConfig& cfg,
                   Tensor* dq_bf16, Tensor* dk_bf16) {
  apply(dq, &dk, positions, q_heads, k_heads, cfg, true, dq_bf16, dk_bf16);
}

}  // namespace bp
