// Llama-3 rope scaling from rope_freqs.weight (see gguf_rope.h).
#include "hub/gguf_rope.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <optional>
#include <vector>

#include "core/error.h"
#include "ops/rope.h"

namespace bp::hub {

namespace {

constexpr int kOriginalMax = 8192;

// The divisors a parameter set implies, through the same inverse frequencies training uses.
std::vector<double> implied_divisors(const RopeConfig& scaled) {
  RopeConfig plain = scaled;
  plain.llama3_scaling = false;
  const std::vector<float> a = rope_inv_freq(plain), b = rope_inv_freq(scaled);
  std::vector<double> f(a.size());
  for (size_t i = 0; i < a.size(); ++i) f[i] = static_cast<double>(a[i]) / b[i];
  return f;
}

bool reproduces(const RopeConfig& c, const std::vector<float>& stored) {
  if (!(c.low_freq_factor > 0) || !(c.high_freq_factor > c.low_freq_factor)) return false;
  const std::vector<double> f = implied_divisors(c);
  for (size_t i = 0; i < f.size(); ++i)
    if (std::abs(f[i] - stored[i]) > 1e-4 * std::max(1.0, std::abs(static_cast<double>(stored[i])))) return false;
  return true;
}

// The band [low, high] in units of y = L/wavelen from the stored divisors (see the header).
std::pair<double, double> solve_band(const std::vector<float>& stored, const std::vector<double>& y, double factor) {
  double lo = 0, hi = std::numeric_limits<double>::infinity();  // largest y of a low, smallest of a high frequency
  std::vector<std::pair<double, double>> blend;                 // (y, smooth)
  for (size_t i = 0; i < stored.size(); ++i) {
    const double f = stored[i];
    if (std::abs(f - 1) < 1e-6)
      hi = std::min(hi, y[i]);
    else if (std::abs(f - factor) < 1e-6 * factor)
      lo = std::max(lo, y[i]);
    else
      blend.emplace_back(y[i], (1 / f - 1 / factor) / (1 - 1 / factor));
  }
  if (blend.size() >= 2) {  // smooth = (y - low) / (high - low): two points fix the line
    const auto [y1, s1] = blend.front();
    const auto [y2, s2] = blend.back();
    const double width = (y1 - y2) / (s1 - s2);
    return {y1 - s1 * width, y1 - s1 * width + width};
  }
  if (blend.size() == 1) {  // any band through the point that keeps the neighbours outside it
    const auto [ys, s] = blend.front();
    double width = std::numeric_limits<double>::infinity();
    if (s > 0) width = std::min(width, (ys - lo) / s);
    if (s < 1) width = std::min(width, (hi - ys) / (1 - s));
    width = std::isfinite(width) ? width / 2 : ys;
    return {ys - s * width, ys + (1 - s) * width};
  }
  if (!std::isfinite(hi)) hi = 2 * lo + 1;
  return {lo + (hi - lo) / 3, lo + 2 * (hi - lo) / 3};
}

}  // namespace

nlohmann::json llama3_rope_scaling_from_gguf(const GGUFReader& r, const std::string& path, double theta,
                                             int64_t head_dim) {
  const GGUFTensorInfo* t = r.find_tensor("rope_freqs.weight");
  if (!t) return nullptr;
  // Checked before anything is read: a head_dim of 0 or 1 with an empty tensor once reached
  // max_element of an empty vector.
  if (head_dim < 2 || head_dim % 2 != 0 || t->numel() != head_dim / 2)
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                fmt::format("[gguf] {}: rope_freqs.weight has {} values for head_dim {} (needs {}: one per rotary "
                            "frequency, for an even head_dim of at least 2)",
                            path, t->numel(), head_dim, std::max<int64_t>(head_dim / 2, 1)));
  const std::vector<float> stored = r.dequantize(*t);
  const float factor = *std::max_element(stored.begin(), stored.end());
  if (!(factor > 1.0f + 1e-6f)) return nullptr;  // no scaling
  RopeConfig c;
  c.head_dim = static_cast<int>(head_dim);
  c.theta = static_cast<float>(theta);
  c.llama3_scaling = true;
  c.factor = factor;
  c.original_max_position = kOriginalMax;
  if (!reproduces(c, stored)) {  // not the canonical band: solve it
    std::vector<double> y(stored.size());
    for (size_t i = 0; i < y.size(); ++i) {
      const double inv_freq = 1 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
      y[i] = kOriginalMax * inv_freq / (2 * std::numbers::pi);
    }
    const auto [low, high] = solve_band(stored, y, factor);
    c.low_freq_factor = static_cast<float>(low);
    c.high_freq_factor = static_cast<float>(high);
    if (!reproduces(c, stored))
      throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                  fmt::format("[gguf] {}: rope_freqs.weight ({} divisors, largest {}) is not Llama-3 rope scaling; "
                              "backprop reads only that kind of rope_freqs",
                              path, stored.size(), factor));
  }
  return {{"rope_type", "llama3"},
          {"factor", c.factor},
          {"low_freq_factor", c.low_freq_factor},
          {"high_freq_factor", c.high_freq_factor},
          {"original_max_position_embeddings", c.original_max_position}};
}

}  // namespace bp::hub
