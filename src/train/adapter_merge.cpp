// Adapter merging for multi-run training; the math is documented in adapter_merge.h.
#include "train/adapter_merge.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace bp {

namespace {

// Calls fn(tensor_index, merged_tensor, fresh_tensor, is_b) for every adapted A and B, in a fixed
// order (layer, target, A then B); tensor_index counts from 0 in that order. M is LoraAdapter
// (merging writes into `merged`) or const LoraAdapter (comparisons only read).
template <class M, class Fn>
void for_each_pair(M& merged, const LoraAdapter& fresh, Fn&& fn) {
  if (merged.layers.size() != fresh.layers.size())
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[merge] adapters have {} and {} layers", merged.layers.size(), fresh.layers.size()));
  uint64_t index = 0;
  for (size_t l = 0; l < merged.layers.size(); ++l)
    for (LoraTarget t : kAllLoraTargets) {
      auto& m = merged.layers[l];
      const LoraLayer& f = fresh.layers[l];
      if (m.has(t) != f.has(t))
        throw Error(ErrorCode::RUNTIME_INTERNAL,
                    fmt::format("[merge] layer {} {}: adapted in one adapter only", l, lora_target_name(t)));
      if (!m.has(t)) continue;
      for (bool is_b : {false, true}) {
        auto& x = is_b ? m.b(t) : m.a(t);
        const Tensor& y = is_b ? f.b(t) : f.a(t);
        if (x.numel() != y.numel())
          throw Error(ErrorCode::RUNTIME_INTERNAL,
                      fmt::format("[merge] layer {} {}: {} vs {}", l, lora_target_name(t), x.describe(), y.describe()));
        fn(index++, x, y, is_b);
      }
    }
  // Mixture-of-Experts: each expert's projection is one PEFT module (its A and B are slabs of the
  // stacked tensors), then each router's A and B; in that order after the dense modules.
  for (size_t l = 0; l < merged.layers.size(); ++l) {
    auto& m = merged.layers[l];
    const LoraLayer& f = fresh.layers[l];
    for (size_t p = 0; p < 3; ++p) {
      if (m.expert_A[p].defined() != f.expert_A[p].defined() ||
          (m.expert_A[p].defined() &&
           (m.expert_A[p].shape() != f.expert_A[p].shape() || m.expert_B[p].shape() != f.expert_B[p].shape())))
        throw Error(ErrorCode::RUNTIME_INTERNAL,
                    fmt::format("[merge] layer {} experts' projection {}: adapted differently", l, p));
      if (!m.expert_A[p].defined()) continue;
      for (int64_t e = 0; e < m.expert_A[p].dim(0); ++e)
        for (bool is_b : {false, true}) {
          Tensor x = expert_matrix(is_b ? m.expert_B[p] : m.expert_A[p], e);
          fn(index++, x, expert_matrix(is_b ? f.expert_B[p] : f.expert_A[p], e), is_b);
        }
    }
    if (m.router_A.defined() != f.router_A.defined() ||
        (m.router_A.defined() &&
         (m.router_A.shape() != f.router_A.shape() || m.router_B.shape() != f.router_B.shape())))
      throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[merge] layer {} router: adapted differently", l));
    if (!m.router_A.defined()) continue;
    for (bool is_b : {false, true}) {
      Tensor x = is_b ? m.router_B : m.router_A;
      fn(index++, x, is_b ? f.router_B : f.router_A, is_b);
    }
  }
}

// Every A [r, in] of the adapter (a view for each expert's), for the row-wise passes below.
std::vector<Tensor> every_a(const LoraAdapter& adapter) {
  std::vector<Tensor> out;
  for (const auto& layer : adapter.layers) {
    for (LoraTarget t : kAllLoraTargets)
      if (layer.has(t)) out.push_back(layer.a(t));
    for (const Tensor& A : layer.expert_A)
      if (A.defined())
        for (int64_t e = 0; e < A.dim(0); ++e) out.push_back(expert_matrix(A, e));
    if (layer.router_A.defined()) out.push_back(layer.router_A);
  }
  return out;
}

// Zeroes the `trim` fraction of entries with the smallest magnitude (ties broken by index, so
// exactly floor(trim·n) entries are zeroed).
void trim_smallest(std::vector<float>& v, double trim) {
  const size_t n_trim = static_cast<size_t>(std::floor(trim * static_cast<double>(v.size())));
  if (n_trim == 0) return;
  std::vector<size_t> order(v.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return std::fabs(v[a]) < std::fabs(v[b]); });
  for (size_t k = 0; k < n_trim; ++k) v[order[k]] = 0.0f;
}

void ties_merge(Tensor& x, const Tensor& y, double trim) {
  std::vector<float> t1(x.data<float>(), x.data<float>() + x.numel());
  std::vector<float> t2(y.data<float>(), y.data<float>() + y.numel());
  trim_smallest(t1, trim);
  trim_smallest(t2, trim);
  float* out = x.data<float>();
  for (size_t i = 0; i < t1.size(); ++i) {
    const double total = static_cast<double>(t1[i]) + static_cast<double>(t2[i]);
    const int sign = total > 0 ? 1 : total < 0 ? -1 : 0;
    double sum = 0;
    int count = 0;
    for (float v : {t1[i], t2[i]})
      if (sign != 0 && v != 0.0f && (v > 0) == (sign > 0)) {
        sum += v;
        ++count;
      }
    out[i] = count ? static_cast<float>(sum / count) : 0.0f;
  }
}

}  // namespace

AdapterMergeMode parse_adapter_merge_mode(std::string_view name) {
  if (name == "slao") return AdapterMergeMode::Slao;
  if (name == "linear") return AdapterMergeMode::Linear;
  if (name == "ties") return AdapterMergeMode::Ties;
  if (name == "dare") return AdapterMergeMode::Dare;
  throw Error(ErrorCode::CONFIG_INVALID_SETTING,
              fmt::format("[merge] unknown merge mode '{}' (one of slao|linear|ties|dare)", name));
}

const char* adapter_merge_mode_name(AdapterMergeMode m) {
  switch (m) {
    case AdapterMergeMode::Slao: return "slao";
    case AdapterMergeMode::Linear: return "linear";
    case AdapterMergeMode::Ties: return "ties";
    case AdapterMergeMode::Dare: return "dare";
  }
  return "?";
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double slao_lambda(int64_t run_index) {
  const double i = static_cast<double>(std::max<int64_t>(1, run_index));
  return std::clamp(1.0 / std::sqrt(i), 0.1, 1.0);
}

double merge_adapter(LoraAdapter& merged, const LoraAdapter& fresh, int64_t run_index, const AdapterMergeOptions& opt) {
  if (opt.dare_drop < 0 || opt.dare_drop >= 1 || opt.ties_trim < 0 || opt.ties_trim >= 1)
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[merge] dare_drop {} and ties_trim {} must lie in [0, 1)", opt.dare_drop, opt.ties_trim));
  const double lambda = opt.mode == AdapterMergeMode::Linear
                            ? 1.0 / static_cast<double>(std::max<int64_t>(1, run_index))
                        : opt.mode == AdapterMergeMode::Ties ? 1.0
                                                             : slao_lambda(run_index);
  for_each_pair(merged, fresh, [&](uint64_t index, Tensor& x, const Tensor& y, bool is_b) {
    float* xd = x.data<float>();
    const float* yd = y.data<float>();
    const int64_t n = x.numel();
    switch (opt.mode) {
      case AdapterMergeMode::Slao:
      case AdapterMergeMode::Dare: {
        if (!is_b) {
          std::copy(yd, yd + n, xd);
          break;
        }
        const bool dare = opt.mode == AdapterMergeMode::Dare;
        const double keep_scale = 1.0 / (1.0 - opt.dare_drop);
        const uint64_t stream = splitmix64(opt.seed ^ (index * 0x9E3779B97F4A7C15ull));
        for (int64_t e = 0; e < n; ++e) {
          double delta = static_cast<double>(yd[e]) - static_cast<double>(xd[e]);
          if (dare) {
            // Uniform in [0, 1) from the top 53 bits; dropped when below p.
            const double u = static_cast<double>(splitmix64(stream + static_cast<uint64_t>(e)) >> 11) * 0x1.0p-53;
            delta = u < opt.dare_drop ? 0.0 : delta * keep_scale;
          }
          xd[e] = static_cast<float>(static_cast<double>(xd[e]) + lambda * delta);
        }
        break;
      }
      case AdapterMergeMode::Linear:
        for (int64_t e = 0; e < n; ++e)
          xd[e] = static_cast<float>(static_cast<double>(xd[e]) +
                                     lambda * (static_cast<double>(yd[e]) - static_cast<double>(xd[e])));
        break;
      case AdapterMergeMode::Ties: ties_merge(x, y, opt.ties_trim); break;
    }
  });
  return lambda;
}

double adapter_b_cosine(const LoraAdapter& a, const LoraAdapter& b) {
  double dot = 0, na = 0, nb = 0;
  for_each_pair(a, b, [&](uint64_t, const Tensor& x, const Tensor& y, bool is_b) {
    if (!is_b) return;
    const float* xd = x.data<float>();
    const float* yd = y.data<float>();
    for (int64_t e = 0; e < x.numel(); ++e) {
      dot += static_cast<double>(xd[e]) * yd[e];
      na += static_cast<double>(xd[e]) * xd[e];
      nb += static_cast<double>(yd[e]) * yd[e];
    }
  });
  if (na == 0 && nb == 0) return 1.0;
  if (na == 0 || nb == 0) return 0.0;
  return dot / (std::sqrt(na) * std::sqrt(nb));
}

void orthonormalize_rows(LoraAdapter& adapter) {
  for (Tensor a : every_a(adapter)) {
    const int64_t r = a.dim(0), in = a.dim(1);
    std::vector<double> q(static_cast<size_t>(r * in));
    const float* src = a.data<float>();
    for (int64_t i = 0; i < r * in; ++i) q[static_cast<size_t>(i)] = src[i];
    for (int64_t i = 0; i < r; ++i) {
      double* qi = q.data() + i * in;
      const double norm_before = std::sqrt(std::inner_product(qi, qi + in, qi, 0.0));
      for (int64_t j = 0; j < i; ++j) {  // modified Gram–Schmidt: project out each earlier row
        const double* qj = q.data() + j * in;
        const double d = std::inner_product(qi, qi + in, qj, 0.0);
        for (int64_t k = 0; k < in; ++k) qi[k] -= d * qj[k];
      }
      const double norm = std::sqrt(std::inner_product(qi, qi + in, qi, 0.0));
      const bool dependent = norm <= 1e-6 * std::max(norm_before, 1e-30);
      for (int64_t k = 0; k < in; ++k) qi[k] = dependent ? 0.0 : qi[k] / norm;
    }
    float* dst = a.data<float>();
    for (int64_t i = 0; i < r * in; ++i) dst[i] = static_cast<float>(q[static_cast<size_t>(i)]);
  }
}

bool adapter_is_finite(const LoraAdapter& adapter) {
  bool finite = true;
  for_each_pair(adapter, adapter, [&](uint64_t, const Tensor& x, const Tensor&, bool) {
    const float* d = x.data<float>();
    for (int64_t e = 0; e < x.numel(); ++e)
      if (!std::isfinite(d[e])) finite = false;
  });
  return finite;
}

LoraAdapter clone_adapter(const LoraAdapter& adapter) {
  LoraAdapter out = adapter;
  copy_adapter_tensors(out, [](const Tensor& t) { return t.clone(); });
  return out;
}

}  // namespace bp
