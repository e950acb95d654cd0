// LoRA adapter structure and PEFT initialisation (see lora.h).
#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "model/weight_names.h"
#include "ops/svd.h"

namespace bp {

namespace {

constexpr std::array<const char*, kNumLoraTargets> kTargetNames = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                                   "gate_proj", "up_proj", "down_proj"};

// splitmix64: a tiny, portable generator, so initial values do not depend on the standard
// library's distribution implementations.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double uniform01(uint64_t& state) {
  return static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
}

// Mixtral's names of its experts' projections (PEFT matches them by suffix): w1 = gate, w3 = up, w2 = down.
constexpr std::array<const char*, 3> kMixtralExpertNames = {"w1", "w3", "w2"};

std::optional<LoraTarget> mixtral_expert_target(std::string_view name) {
  for (int p = 0; p < 3; ++p)
    if (name == kMixtralExpertNames[static_cast<size_t>(p)])
      return static_cast<LoraTarget>(static_cast<int>(LoraTarget::Gate) + p);
  return std::nullopt;
}

std::string known_targets() {
  std::string s;
  for (const char* n : kTargetNames) s += fmt::format("{}, ", n);
  s += "w1, w3, w2 (Mixtral), gate (a Mixture-of-Experts router), ";
  for (const LoraFusedModule& m : kLoraFusedModules) s += fmt::format("{}, ", m.name);
  return s + "all-linear";
}

const LoraFusedModule* fused_module_named(std::string_view name) {
  for (const LoraFusedModule& m : kLoraFusedModules)
    if (name == m.name) return &m;
  return nullptr;
}

}  // namespace

const LoraFusedModule* lora_fused_module_of(LoraTarget t) {
  for (const LoraFusedModule& m : kLoraFusedModules)
    if (m.contains(t)) return &m;
  return nullptr;
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.kernel_raw() == b.kernel_raw() && a.shape() == b.shape() &&
         a.dtype() == b.dtype() && a.device() == b.device();
}

Tensor fused_rows_of(const std::array<Tensor, kNumLoraTargets>& ts, const LoraFusedModule& f) {
  std::vector<const Tensor*> parts;
  for (int i = 0; i < f.count; ++i) parts.push_back(&ts[static_cast<size_t>(f.first) + static_cast<size_t>(i)]);
  return join_rows_or_copy(parts);
}

void split_fused_rows(std::array<Tensor, kNumLoraTargets>& ts, const LoraFusedModule& f, const Tensor& whole,
                      const std::array<int64_t, 3>& rows) {
  int64_t at = 0;
  for (int i = 0; i < f.count; ++i) {
    const int64_t n = rows[static_cast<size_t>(i)];
    ts[static_cast<size_t>(f.first) + static_cast<size_t>(i)] = whole.rows(at, at + n);
    at += n;
  }
  BP_CHECK(at == whole.dim(0), "[lora] {}: the members' {} rows do not make its {}", f.name, at, whole.describe());
}

std::array<int64_t, 3> fused_member_rows(const std::array<Tensor, kNumLoraTargets>& ts, const LoraFusedModule& f) {
  std::array<int64_t, 3> rows{};
  for (int i = 0; i < f.count; ++i)
    rows[static_cast<size_t>(i)] = ts[static_cast<size_t>(f.first) + static_cast<size_t>(i)].dim(0);
  return rows;
}

const char* lora_target_name(LoraTarget t) {
  return kTargetNames[static_cast<size_t>(t)];
}

std::optional<LoraTarget> parse_lora_target(std::string_view name) {
  for (LoraTarget t : kAllLoraTargets)
    if (name == lora_target_name(t)) return t;
  return std::nullopt;
}

int64_t lora_target_out(const ModelConfig& cfg, LoraTarget t) {
  switch (t) {
    case LoraTarget::Q: return cfg.q_dim();
    case LoraTarget::K:
    case LoraTarget::V: return cfg.kv_dim();
    case LoraTarget::O: return cfg.hidden_size;
    case LoraTarget::Gate:
    case LoraTarget::Up: return cfg.intermediate_size;
    case LoraTarget::Down: return cfg.hidden_size;
  }
  return 0;
}

int64_t lora_target_in(const ModelConfig& cfg, LoraTarget t) {
  switch (t) {
    case LoraTarget::Q:
    case LoraTarget::K:
    case LoraTarget::V: return cfg.hidden_size;
    case LoraTarget::O: return cfg.q_dim();
    case LoraTarget::Gate:
    case LoraTarget::Up: return cfg.hidden_size;
    case LoraTarget::Down: return cfg.intermediate_size;
  }
  return 0;
}

std::string peft_expert_module(bool mixtral, int64_t layer, int64_t expert, int p) {
  static constexpr std::array<const char*, 3> kQwen = {"gate_proj", "up_proj", "down_proj"};
  return fmt::format("base_model.model.model.layers.{}.{}.experts.{}.{}", layer, mixtral ? "block_sparse_moe" : "mlp",
                     expert, (mixtral ? kMixtralExpertNames : kQwen)[static_cast<size_t>(p)]);
}

std::string peft_router_module(bool mixtral, int64_t layer) {
  return fmt::format("base_model.model.model.layers.{}.{}.gate", layer, mixtral ? "block_sparse_moe" : "mlp");
}

float LoraConfig::scale() const {
  const double rr = static_cast<double>(r);
  return static_cast<float>(use_rslora ? alpha / std::sqrt(rr) : alpha / rr);
}

bool LoraConfig::targets(LoraTarget t) const {
  for (const std::string& m : target_modules) {
    if (m == "all-linear" || m == lora_target_name(t) || mixtral_expert_target(m) == t) return true;
    if (const LoraFusedModule* f = fused_module_named(m); f && f->contains(t)) return true;
  }
  return false;
}

bool LoraConfig::targets_router() const {
  for (const std::string& m : target_modules)
    if (m == kLoraRouterTarget || (moe && m == "all-linear")) return true;
  return false;
}

std::vector<std::string> LoraConfig::resolved_targets() const {
  std::vector<std::string> out;
  for (LoraTarget t : kAllLoraTargets) {
    if (!targets(t)) continue;
    const LoraFusedModule* f = fused ? lora_fused_module_of(t) : nullptr;
    if (mixtral && expert_projection(t) >= 0) {
      out.emplace_back(kMixtralExpertNames[static_cast<size_t>(expert_projection(t))]);
    } else if (!f) {
      out.emplace_back(lora_target_name(t));
    } else if (f->first == t) {
      out.emplace_back(f->name);
    }
  }
  if (targets_router()) out.emplace_back(kLoraRouterTarget);
  return out;
}

bool LoraConfig::pissa() const {
  return init_lora_weights == "pissa" || pissa_niter() >= 0;
}

int LoraConfig::pissa_niter() const {
  constexpr std::string_view prefix = "pissa_niter_";
  const std::string_view v = init_lora_weights;
  if (!v.starts_with(prefix) || v.size() == prefix.size() || v.size() > prefix.size() + 4) return -1;
  int n = 0;
  for (char ch : v.substr(prefix.size())) {
    if (ch < '0' || ch > '9') return -1;
    n = n * 10 + (ch - '0');
  }
  return n <= kMaxPissaNiter ? n : -1;
}

void LoraConfig::validate() const {
  if (r < 1) throw Error(ErrorCode::CONFIG_INVALID_SETTING, fmt::format("[lora] r must be >= 1, got {}", r));
  if (!(alpha > 0.0f))
    throw Error(ErrorCode::CONFIG_INVALID_SETTING, fmt::format("[lora] alpha must be > 0, got {}", alpha));
  if (!(dropout >= 0.0f && dropout < 1.0f))
    throw Error(ErrorCode::CONFIG_INVALID_SETTING, fmt::format("[lora] dropout must be in [0, 1), got {}", dropout));
  if (init_lora_weights != "true" && init_lora_weights != "pissa" && pissa_niter() < 0)
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[lora] init_lora_weights '{}' is not supported; use true (PEFT's default), pissa or "
                            "pissa_niter_N (N power iterations of the fast SVD, 0 to {})",
                            init_lora_weights, kMaxPissaNiter));
  if (use_dora && pissa())
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                "[lora] DoRA with PiSSA initialisation is not supported: PEFT's PiSSA-to-LoRA conversion of the "
                "saved adapter does not cover DoRA's magnitudes")
        .with_suggestion("Use --use-dora or --init-lora-weights pissa, not both.");
  if (target_modules.empty())
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[lora] target_modules is empty; use some of: {}", known_targets()));
  for (const std::string& m : target_modules)
    if (m != "all-linear" && m != kLoraRouterTarget && !parse_lora_target(m) && !fused_module_named(m) &&
        !mixtral_expert_target(m))
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  fmt::format("[lora] unknown target module '{}'; known: {}", m, known_targets()));
}

void LoraConfig::validate_for(const ModelConfig& cfg) const {
  validate();
  const bool model_fused = cfg.fused_projections();
  for (const std::string& m : target_modules) {
    // Mixture-of-Experts: PEFT matches gate_proj / up_proj / down_proj (Mixtral's w1 / w3 / w2) by
    // suffix to every expert's projection (and Qwen3-MoE's dense layers' MLP), "gate" to the router
    // (mlp.gate / block_sparse_moe.gate), and all-linear takes all of them.
    const std::optional<LoraTarget> mt = parse_lora_target(m);
    const bool mlp_name = mt && expert_projection(*mt) >= 0;
    const bool mixtral_model = cfg.arch == Arch::Mixtral;
    if (m == kLoraRouterTarget && !cfg.is_moe())
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  fmt::format("[lora] target module 'gate' is a Mixture-of-Experts router (mlp.gate), which {} does "
                              "not have; its MLP's gate projection is gate_proj",
                              cfg.architecture_name))
          .with_suggestion(model_fused ? "--target-modules gate_up_proj" : "--target-modules gate_proj");
    if (cfg.is_moe() && (m == kLoraRouterTarget || m == "all-linear") && (use_dora || pissa()))
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  fmt::format("[lora] {} on {}'s router (target 'gate'{}) is not supported",
                              use_dora ? "--use-dora (DoRA)" : "--init-lora-weights pissa (PiSSA)",
                              cfg.architecture_name, m == "all-linear" ? ", which all-linear includes" : ""))
          .with_suggestion(mixtral_model ? "--target-modules q_proj,k_proj,v_proj,o_proj,w1,w2,w3"
                                         : "--target-modules q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    if ((mixtral_model && mlp_name) || (!mixtral_model && mixtral_expert_target(m)))
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  fmt::format("[lora] target module '{}' does not exist in {} (its MLP projections are {})", m,
                              cfg.architecture_name,
                              mixtral_model ? "the experts' w1, w3, w2" : "gate_proj, up_proj, down_proj"));
    const std::optional<LoraTarget> t = parse_lora_target(m);
    if (model_fused && t && lora_fused_module_of(*t))
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  fmt::format("[lora] target module '{}' does not exist in {}: it stores q/k/v as one qkv_proj and "
                              "gate/up as one gate_up_proj (PEFT's target names there: qkv_proj, o_proj, "
                              "gate_up_proj, down_proj, or all-linear)",
                              m, cfg.architecture_name))
          .with_suggestion(fmt::format("--target-modules {}", lora_fused_module_of(*t)->name));
    if (!model_fused && fused_module_named(m))
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  fmt::format("[lora] target module '{}' is Phi-3's fused projection; {} has separate ones (q_proj, "
                              "k_proj, v_proj / gate_proj, up_proj)",
                              m, cfg.architecture_name));
  }
}

int64_t LoraAdapter::num_parameters() const {
  int64_t n = 0;
  for (const LoraLayer& l : layers)
    for (LoraTarget t : kAllLoraTargets) {
      if (!l.has(t)) continue;
      const LoraFusedModule* f = config.fused ? lora_fused_module_of(t) : nullptr;
      const bool shared_a = f && f->first != t && same_tensor(l.a(t), l.a(f->first));
      n += (shared_a ? 0 : l.a(t).numel()) + l.b(t).numel() + (l.m(t).defined() ? l.m(t).numel() : 0);
    }
  for (const LoraLayer& l : layers)
    for (int p = 0; p < 3; ++p)
      if (l.expert_A[static_cast<size_t>(p)].defined())
        n += l.expert_A[static_cast<size_t>(p)].numel() + l.expert_B[static_cast<size_t>(p)].numel() +
             (l.expert_M[static_cast<size_t>(p)].defined() ? l.expert_M[static_cast<size_t>(p)].numel() : 0);
  for (const LoraLayer& l : layers)
    if (l.router_A.defined()) n += l.router_A.numel() + l.router_B.numel();
  return n;
}

LoraAdapter init_lora(const ModelConfig& cfg, const LoraConfig& lora, uint64_t seed) {
  lora.validate_for(cfg);
  LoraAdapter ad;
  ad.config = lora;
  ad.config.fused = cfg.fused_projections();
  ad.config.multimodal_text = cfg.multimodal_text;
  ad.config.mixtral = cfg.arch == Arch::Mixtral;
  ad.config.moe = cfg.is_moe();
  ad.layers.resize(static_cast<size_t>(cfg.num_layers));
  for (int64_t li = 0; li < cfg.num_layers; ++li) {
    LoraLayer& layer = ad.layers[static_cast<size_t>(li)];
    if (cfg.is_moe_layer(li) && ad.config.targets_router()) {  // the router: A [r, D] (its own stream), B [E, r]
      const int64_t D = cfg.hidden_size;
      const double bound = 1.0 / std::sqrt(static_cast<double>(D));
      Tensor A = Tensor::empty({lora.r, D});
      uint64_t state = seed ^ 0xa0761d6478bd642full ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(li + 1));
      splitmix64(state);
      float* a = A.data<float>();
      for (int64_t i = 0; i < A.numel(); ++i) a[i] = static_cast<float>((2.0 * uniform01(state) - 1.0) * bound);
      layer.router_A = std::move(A);
      layer.router_B = Tensor::zeros({cfg.num_experts, lora.r});
    }
    for (LoraTarget t : kAllLoraTargets) {
      if (!lora.targets(t)) continue;
      if (cfg.is_moe_layer(li) && expert_projection(t) >= 0) {  // every expert's A and B, stacked
        const int p = expert_projection(t);
        const int64_t E = cfg.num_experts, Fe = cfg.moe_intermediate_size, D = cfg.hidden_size;
        const int64_t in = p == 2 ? Fe : D, out = p == 2 ? D : Fe;
        const double bound = 1.0 / std::sqrt(static_cast<double>(in));
        Tensor A = Tensor::empty({E, lora.r, in});
        float* a = A.data<float>();
        for (int64_t e = 0; e < E; ++e) {  // each expert's own stream
          uint64_t state =
              seed ^ (0x5851f42d4c957f2dull * static_cast<uint64_t>(li * kNumLoraTargets + static_cast<int>(t) + 1)) ^
              (0x2545f4914f6cdd1dull * static_cast<uint64_t>(e + 1));
          splitmix64(state);
          for (int64_t i = 0; i < lora.r * in; ++i)
            a[e * lora.r * in + i] = static_cast<float>((2.0 * uniform01(state) - 1.0) * bound);
        }
        layer.expert_A[static_cast<size_t>(p)] = std::move(A);
        layer.expert_B[static_cast<size_t>(p)] = Tensor::zeros({E, out, lora.r});
        continue;
      }
      const LoraFusedModule* f = ad.config.fused ? lora_fused_module_of(t) : nullptr;
      layer.enabled[static_cast<size_t>(t)] = true;
      if (f && f->first != t) continue;  // made with the module's first member
      const int64_t in = lora_target_in(cfg, t);
      // torch.nn.init.kaiming_uniform_(a=sqrt(5)): gain = sqrt(2/(1+5)), bound = gain·sqrt(3/in) = 1/sqrt(in).
      const double bound = 1.0 / std::sqrt(static_cast<double>(in));
      Tensor A = Tensor::empty({lora.r, in});
      uint64_t state =
          seed ^ (0x5851f42d4c957f2dull * static_cast<uint64_t>(li * kNumLoraTargets + static_cast<int>(t) + 1));
      splitmix64(state);
      float* a = A.data<float>();
      for (int64_t i = 0; i < A.numel(); ++i) a[i] = static_cast<float>((2.0 * uniform01(state) - 1.0) * bound);
      if (!f) {
        layer.a(t) = std::move(A);
        layer.b(t) = Tensor::zeros({lora_target_out(cfg, t), lora.r});
        continue;
      }
      // A fused module: one A, one B [Σout, r]; the members' B are its rows.
      int64_t rows = 0;
      for (int i = 0; i < f->count; ++i) rows += lora_target_out(cfg, static_cast<LoraTarget>(static_cast<int>(t) + i));
      const Tensor B = Tensor::zeros({rows, lora.r});
      int64_t at = 0;
      for (int i = 0; i < f->count; ++i) {
        const auto m = static_cast<LoraTarget>(static_cast<int>(t) + i);
        const int64_t out = lora_target_out(cfg, m);
        layer.a(m) = A;
        layer.b(m) = B.rows(at, at + out);
        at += out;
      }
    }
  }
  return ad;
}

void copy_adapter_tensors(LoraAdapter& adapter, const std::function<Tensor(const Tensor&)>& copy) {
  for (LoraLayer& layer : adapter.layers)
    if (layer.router_A.defined()) {
      layer.router_A = copy(layer.router_A);
      layer.router_B = copy(layer.router_B);
    }
  for (LoraLayer& layer : adapter.layers)
    for (size_t p = 0; p < 3; ++p)
      if (layer.expert_A[p].defined()) {
        layer.expert_A[p] = copy(layer.expert_A[p]);
        layer.expert_B[p] = copy(layer.expert_B[p]);
        if (layer.expert_M[p].defined()) layer.expert_M[p] = copy(layer.expert_M[p]);
      }
  for (LoraLayer& layer : adapter.layers)
    for (LoraTarget t : kAllLoraTargets) {
      if (!layer.has(t)) continue;
      const LoraFusedModule* f = adapter.config.fused ? lora_fused_module_of(t) : nullptr;
      if (!f && layer.m(t).defined()) layer.m(t) = copy(layer.m(t));  // DoRA's magnitude
      if (!f) {
        layer.a(t) = copy(layer.a(t));
        layer.b(t) = copy(layer.b(t));
        continue;
      }
      if (f->first != t) continue;  // copied with the module's first member
      std::vector<const Tensor*> bs;
      for (int i = 0; i < f->count; ++i) bs.push_back(&layer.b(static_cast<LoraTarget>(static_cast<int>(t) + i)));
      if (layer.m(t).defined())  // DoRA's magnitude over the module's rows: one tensor, like B
        split_fused_rows(layer.M, *f, copy(fused_rows_of(layer.M, *f)), fused_member_rows(layer.M, *f));
      const Tensor A = copy(layer.a(t));
      const Tensor B = copy(join_rows_or_copy(bs));
      int64_t at = 0;
      for (int i = 0; i < f->count; ++i) {
        const auto m = static_cast<LoraTarget>(static_cast<int>(t) + i);
        const int64_t out = layer.b(m).dim(0);
        layer.a(m) = A;
        layer.b(m) = B.rows(at, at + out);
        at += out;
      }
    }
}

Tensor weight_row_norms(const Tensor& W, bool squared) {
  BP_CHECK(W.rank() == 2, "[lora] row norms of a weight {} (needs [out, in])", W.describe());
  Tensor host = W.device().type == DeviceType::CPU ? W : W.to(Device{});
  if (host.dtype() != DType::F32) host = host.to(DType::F32);
  const int64_t out = host.dim(0), in = host.dim(1);
  Tensor n = Tensor::empty({out});
  const float* w = host.data<float>();
  float* o = n.data<float>();
  for (int64_t j = 0; j < out; ++j) {
    double s = 0.0;
    for (int64_t i = 0; i < in; ++i) s += static_cast<double>(w[j * in + i]) * w[j * in + i];
    o[j] = static_cast<float>(squared ? s : std::sqrt(s));
  }
  return n;
}

void init_dora_magnitudes(LoraAdapter& adapter, const ModelWeights& w) {
  if (!adapter.config.use_dora) return;
  BP_CHECK(adapter.layers.size() == w.layers.size(), "[lora] the adapter has {} layers but the model has {}",
           adapter.layers.size(), w.layers.size());
  for (size_t l = 0; l < adapter.layers.size(); ++l) {
    LoraLayer& layer = adapter.layers[l];
    for (LoraTarget t : kAllLoraTargets)
      if (layer.has(t))
        layer.m(t) = weight_row_norms(weight_ref(w, lora_target_role(t), static_cast<int64_t>(l)), false);
    // A fused module (PEFT's one DoRA module): one magnitude over its rows, whose row views the members' are.
    if (adapter.config.fused)
      for (const LoraFusedModule& f : kLoraFusedModules)
        if (layer.has(f.first)) split_fused_rows(layer.M, f, fused_rows_of(layer.M, f), fused_member_rows(layer.M, f));
    // Each expert's projection is a module of its own: its magnitude is its own W_e's row norms.
    for (int p = 0; p < 3; ++p) {
      if (!layer.expert_A[static_cast<size_t>(p)].defined()) continue;
      const Tensor& W =
          weight_ref(w, static_cast<WeightRole>(static_cast<int>(WeightRole::ExpertGate) + p), static_cast<int64_t>(l));
      Tensor M = Tensor::empty({W.dim(0), W.dim(1)});
      for (int64_t e = 0; e < W.dim(0); ++e)
        M.rows(e, e + 1).copy_from(weight_row_norms(expert_matrix(W, e), false).reshape({1, W.dim(1)}));
      layer.expert_M[static_cast<size_t>(p)] = std::move(M);
    }
  }
}

namespace {

// PiSSA of one module's base W [out, in] (a view of an expert's slab included): A = diag(sqrt(S_r/s))·V_rᵀ,
// B = U_r·diag(sqrt(S_r/s)) (PEFT divides S_r by the scale), and W replaced by W − s·B·A. `what`
// names the module in errors; `stream` seeds the fast SVD's test matrix.
std::pair<Tensor, Tensor> pissa_module(Tensor W, int64_t r, double scale, int niter, uint64_t stream,
                                       const std::string& what) {
  if (!(W.dtype() == DType::F32 || W.dtype() == DType::BF16 || W.dtype() == DType::F16))
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[lora] PiSSA replaces each adapted base weight by its residual, but {} is held as {}: "
                            "quantizing the residual again would change it",
                            what, dtype_name(W.dtype())))
        .with_suggestion(
            "Hold the base as f32 or bf16 (--base-dtype bf16), or use the default "
            "--init-lora-weights true.");
  const int64_t k = std::min(W.dim(0), W.dim(1));
  if (r > k)
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[lora] PiSSA with r = {} needs {} singular values but {} is {} (min {})", r, r, what,
                            W.describe(), k));
  const Svd d = niter >= 0 ? svd_lowrank(W, r, niter, stream) : svd(W);
  const int64_t out = d.m, in = d.n;
  Tensor A = Tensor::empty({r, in}), B = Tensor::empty({out, r});
  float* a = A.data<float>();
  float* b = B.data<float>();
  for (int64_t i = 0; i < r; ++i) {
    const double q = std::sqrt(d.S[static_cast<size_t>(i)] / scale);
    for (int64_t j = 0; j < in; ++j) a[i * in + j] = static_cast<float>(q * d.Vt[static_cast<size_t>(i * in + j)]);
    for (int64_t o = 0; o < out; ++o) b[o * r + i] = static_cast<float>(d.U[static_cast<size_t>(o * d.k + i)] * q);
  }
  // W ← W − s·B·A (of the f32 A and B the adapter holds), in f64, rounded to W's type.
  Tensor res = W.device().type == DeviceType::CPU ? W.to(DType::F32) : W.to(Device{}).to(DType::F32);
  if (res.kernel_raw() == W.kernel_raw()) res = res.clone();  // W was f32 on the host: the same storage
  float* rw = res.data<float>();
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < in; ++j) {
      double acc = 0.0;
      for (int64_t i = 0; i < r; ++i) acc += static_cast<double>(b[o * r + i]) * a[i * in + j];
      rw[o * in + j] = static_cast<float>(rw[o * in + j] - scale * acc);
    }
  W.copy_from(res);
  return {std::move(A), std::move(B)};
}

// A PiSSA adapter's LoRA of rank 2r for the original base W = W_res + s·B0·A0 (see pissa_to_lora):
// A2 = [A; A0] [2r, in], B2 = [B, −B0] [out, 2r].
std::pair<Tensor, Tensor> pissa_rank_2r(const Tensor& A_dev, const Tensor& B_dev, const Tensor& A0, const Tensor& B0) {
  const Tensor A = A_dev.to(Device{}), B = B_dev.to(Device{});
  const int64_t r = A.dim(0), in = A.dim(1), o = B.dim(0);
  Tensor A2 = Tensor::empty({2 * r, in}), B2 = Tensor::empty({o, 2 * r});
  A2.rows(0, r).copy_from(A);
  A2.rows(r, 2 * r).copy_from(A0);
  const float* b = B.data<float>();
  const float* b0 = B0.data<float>();
  float* b2 = B2.data<float>();
  for (int64_t i = 0; i < o; ++i)
    for (int64_t k = 0; k < r; ++k) {
      b2[i * 2 * r + k] = b[i * r + k];
      b2[i * 2 * r + r + k] = -b0[i * r + k];
    }
  return {std::move(A2), std::move(B2)};
}

}  // namespace

void init_pissa(LoraAdapter& adapter, ModelWeights& w, uint64_t seed) {
  if (!adapter.config.pissa()) return;
  const int niter = adapter.config.pissa_niter();
  BP_CHECK(adapter.layers.size() == w.layers.size(), "[lora] the adapter has {} layers but the model has {}",
           adapter.layers.size(), w.layers.size());
  const double scale = adapter.config.scale();
  const int64_t r = adapter.config.r;
  for (size_t l = 0; l < adapter.layers.size(); ++l)
    for (LoraTarget t : kAllLoraTargets) {
      LoraLayer& layer = adapter.layers[l];
      if (!layer.has(t)) continue;
      // A fused module (PEFT's one qkv_proj / gate_up_proj Linear): the SVD of its whole [Σout, in]
      // weight, one A, B over all its rows, and the residual written back into the members' rows.
      const LoraFusedModule* f = adapter.config.fused ? lora_fused_module_of(t) : nullptr;
      if (f && f->first != t) continue;  // done with the module's first member
      const auto ti = static_cast<size_t>(t);
      // The fast SVD's test matrix: a stream per (layer, projection), as init_lora's.
      const uint64_t stream =
          seed * 0x9e3779b97f4a7c15ull + (l * kNumLoraTargets + static_cast<size_t>(t) + 1) * 0xd1b54a32d192ed03ull;
      const std::string what = fmt::format("layer {} {}", l, f ? f->name : lora_target_name(t));
      if (!f) {
        auto [A, B] =
            pissa_module(weight_ref(w, lora_target_role(t), static_cast<int64_t>(l)), r, scale, niter, stream, what);
        layer.A0[ti] = A.clone();
        layer.B0[ti] = B.clone();
        layer.a(t) = std::move(A);
        layer.b(t) = std::move(B);
        continue;
      }
      std::vector<Tensor*> members;
      for (int i = 0; i < f->count; ++i)
        members.push_back(&weight_ref(w, lora_target_role(static_cast<LoraTarget>(static_cast<int>(t) + i)),
                                      static_cast<int64_t>(l)));
      // The members' rows as one tensor: a view of the fused weight they were loaded from (the residual
      // lands in them), or a copy whose residual is copied back.
      const Tensor W = join_rows_or_copy(std::vector<const Tensor*>(members.begin(), members.end()));
      auto [A, B] = pissa_module(W, r, scale, niter, stream, what);
      std::array<int64_t, 3> rows{};
      int64_t at = 0;
      for (size_t i = 0; i < members.size(); ++i) {
        rows[i] = members[i]->dim(0);
        if (W.kernel_raw() != members[0]->kernel_raw()) members[i]->copy_from(W.rows(at, at + rows[i]));
        at += rows[i];
      }
      const Tensor A0 = A.clone(), B0 = B.clone();
      for (int i = 0; i < f->count; ++i) {  // the members share A (and A0); their B (and B0) are rows
        const auto m = ti + static_cast<size_t>(i);
        layer.A0[m] = A0;
        layer.A[m] = A;
      }
      split_fused_rows(layer.B0, *f, B0, rows);
      split_fused_rows(layer.B, *f, B, rows);
    }
  // Each expert's projection is a module of its own: its own W_e's SVD, its slab replaced by its residual.
  for (size_t l = 0; l < adapter.layers.size(); ++l)
    for (size_t p = 0; p < 3; ++p) {
      LoraLayer& layer = adapter.layers[l];
      if (!layer.expert_A[p].defined()) continue;
      Tensor& W = weight_ref(w, static_cast<WeightRole>(static_cast<int>(WeightRole::ExpertGate) + static_cast<int>(p)),
                             static_cast<int64_t>(l));
      const Tensor A_all = layer.expert_A[p], B_all = layer.expert_B[p];  // on the host (init_lora's)
      for (int64_t e = 0; e < W.dim(0); ++e) {
        const uint64_t stream =
            seed * 0x9e3779b97f4a7c15ull +
            (l * kNumLoraTargets + static_cast<size_t>(LoraTarget::Gate) + p + 1) * 0xd1b54a32d192ed03ull +
            static_cast<uint64_t>(e + 1) * 0x2545f4914f6cdd1dull;
        auto [A, B] = pissa_module(
            expert_matrix(W, e), r, scale, niter, stream,
            fmt::format(
                "layer {} expert {} {}", l, e,
                lora_target_name(static_cast<LoraTarget>(static_cast<int>(LoraTarget::Gate) + static_cast<int>(p)))));
        expert_matrix(A_all, e).copy_from(A);
        expert_matrix(B_all, e).copy_from(B);
      }
      layer.expert_A0[p] = A_all.clone();
      layer.expert_B0[p] = B_all.clone();
    }
}

LoraAdapter pissa_to_lora(const LoraAdapter& adapter) {
  if (!adapter.config.pissa()) return adapter;
  LoraAdapter out;
  out.config = adapter.config;
  out.config.init_lora_weights = "true";
  out.config.r = 2 * adapter.config.r;
  out.config.alpha = adapter.config.use_rslora ? adapter.config.alpha * std::sqrt(2.0f) : 2.0f * adapter.config.alpha;
  out.base_model_name_or_path = adapter.base_model_name_or_path;
  out.layers.resize(adapter.layers.size());
  for (size_t l = 0; l < adapter.layers.size(); ++l) {
    const LoraLayer& src = adapter.layers[l];
    LoraLayer& dst = out.layers[l];
    for (LoraTarget t : kAllLoraTargets) {
      if (!src.has(t)) continue;
      const LoraFusedModule* f = adapter.config.fused ? lora_fused_module_of(t) : nullptr;
      if (f && f->first != t) continue;  // a fused module: converted once, its B over all its rows
      const auto ti = static_cast<size_t>(t);
      BP_CHECK(src.A0[ti].defined() && src.B0[ti].defined(),
               "[lora] layer {} {}: a PiSSA adapter without its initial A and B", l, lora_target_name(t));
      const Tensor B = f ? fused_rows_of(src.B, *f) : src.b(t);
      const Tensor B0 = f ? fused_rows_of(src.B0, *f) : src.B0[ti];
      auto [A2, B2] = pissa_rank_2r(src.a(t), B, src.A0[ti], B0);
      for (int i = 0; i < (f ? f->count : 1); ++i) {
        const auto m = ti + static_cast<size_t>(i);
        dst.A[m] = A2;
        dst.enabled[m] = true;
      }
      if (f)
        split_fused_rows(dst.B, *f, B2, fused_member_rows(src.B, *f));
      else
        dst.b(t) = std::move(B2);
    }
    for (size_t p = 0; p < 3; ++p) {  // each expert's module: its own rank-2r LoRA, stacked again
      if (!src.expert_A[p].defined()) continue;
      BP_CHECK(src.expert_A0[p].defined() && src.expert_B0[p].defined(),
               "[lora] layer {} experts: a PiSSA adapter without their initial A and B", l);
      const Tensor A = src.expert_A[p].to(Device{}), B = src.expert_B[p].to(Device{});
      const int64_t E = A.dim(0), r = A.dim(1);
      Tensor A2 = Tensor::empty({E, 2 * r, A.dim(2)}), B2 = Tensor::empty({E, B.dim(1), 2 * r});
      for (int64_t e = 0; e < E; ++e) {
        auto [a2, b2] = pissa_rank_2r(expert_matrix(A, e), expert_matrix(B, e), expert_matrix(src.expert_A0[p], e),
                                      expert_matrix(src.expert_B0[p], e));
        expert_matrix(A2, e).copy_from(a2);
        expert_matrix(B2, e).copy_from(b2);
      }
      dst.expert_A[p] = std::move(A2);
      dst.expert_B[p] = std::move(B2);
    }
  }
  return out;
}

}  // namespace bp
