// The preference losses and their gradients with respect to each sequence's summed completion
// log-probability (preference.h has the table). Derivatives, with u the loss's argument:
//   d/du [−log σ(u)] = −σ(−u);   d/du [1 − σ(u)] = −σ(u)·σ(−u)
//   ORPO: log-odds(p) = p − log(1 − e^p) for a length-averaged p < 0, d/dp = 1 / (1 − e^p)
#include "train/preference.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.h"

namespace bp {

namespace {

struct Named {
  const char* name;
  int value;
};

template <class E, size_t N>
E parse_named(std::string_view name, const std::array<Named, N>& table, const char* what) {
  std::string names;
  for (const auto& n : table) {
    if (name == n.name) return static_cast<E>(n.value);
    names += names.empty() ? n.name : std::string("|") + n.name;
  }
  throw Error(ErrorCode::CONFIG_INVALID_SETTING, fmt::format("[train] unknown {} '{}' (one of {})", what, name, names));
}

template <size_t N>
const char* name_of(int value, const std::array<Named, N>& table) {
  for (const auto& n : table)
    if (n.value == value) return n.name;
  return "?";
}

constexpr std::array<Named, 5> kMethods{{{"sft", static_cast<int>(TrainMethod::Sft)},
                                         {"dpo", static_cast<int>(TrainMethod::Dpo)},
                                         {"orpo", static_cast<int>(TrainMethod::Orpo)},
                                         {"simpo", static_cast<int>(TrainMethod::Simpo)},
                                         {"kto", static_cast<int>(TrainMethod::Kto)}}};
constexpr std::array<Named, 3> kDpoLosses{{{"sigmoid", static_cast<int>(DpoLoss::Sigmoid)},
                                           {"ipo", static_cast<int>(DpoLoss::Ipo)},
                                           {"hinge", static_cast<int>(DpoLoss::Hinge)}}};
constexpr std::array<Named, 3> kReferences{{{"auto", static_cast<int>(ReferenceSource::Auto)},
                                            {"adapter-off", static_cast<int>(ReferenceSource::AdapterOff)},
                                            {"precomputed", static_cast<int>(ReferenceSource::Precomputed)}}};

double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}
// log σ(x), without overflow for large |x|.
double log_sigmoid(double x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}

// −(1 − ls)·log σ(u) − ls·log σ(−u) and its derivative in u (DPO's sigmoid loss, SimPO).
std::pair<double, double> smoothed_logistic(double u, double ls) {
  const double loss = -(1 - ls) * log_sigmoid(u) - ls * log_sigmoid(-u);
  const double d = -(1 - ls) * sigmoid(-u) + ls * sigmoid(u);
  return {loss, d};
}

double avg(double logp, int64_t n) {
  return n > 0 ? logp / static_cast<double>(n) : 0.0;
}

}  // namespace

TrainMethod parse_train_method(std::string_view name) {
  return parse_named<TrainMethod>(name, kMethods, "training method");
}
const char* train_method_name(TrainMethod m) {
  return name_of(static_cast<int>(m), kMethods);
}
DpoLoss parse_dpo_loss(std::string_view name) {
  return parse_named<DpoLoss>(name, kDpoLosses, "DPO loss");
}
const char* dpo_loss_name(DpoLoss l) {
  return name_of(static_cast<int>(l), kDpoLosses);
}
ReferenceSource parse_reference_source(std::string_view name) {
  return parse_named<ReferenceSource>(name, kReferences, "reference");
}
const char* reference_source_name(ReferenceSource r) {
  return name_of(static_cast<int>(r), kReferences);
}

bool method_is_pairwise(TrainMethod m) {
  return m == TrainMethod::Dpo || m == TrainMethod::Orpo || m == TrainMethod::Simpo;
}
bool method_needs_reference(TrainMethod m) {
  return m == TrainMethod::Dpo || m == TrainMethod::Kto;
}
bool method_is_preference(TrainMethod m) {
  return m != TrainMethod::Sft;
}

std::vector<std::string> method_setting_keys(TrainMethod m) {
  switch (m) {
    case TrainMethod::Sft: return {};
    case TrainMethod::Dpo:
      return {"training.beta", "training.dpo_loss", "training.label_smoothing", "training.reference"};
    case TrainMethod::Orpo: return {"training.orpo_lambda"};
    case TrainMethod::Simpo: return {"training.beta", "training.label_smoothing", "training.simpo_gamma"};
    case TrainMethod::Kto:
      return {"training.beta", "training.kto_desirable_weight", "training.kto_undesirable_weight",
              "training.reference"};
  }
  return {};
}

const std::vector<std::string>& preference_setting_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> all;
    for (const auto& n : kMethods)
      for (auto& k : method_setting_keys(static_cast<TrainMethod>(n.value)))
        if (std::find(all.begin(), all.end(), k) == all.end()) all.push_back(k);
    return all;
  }();
  return keys;
}

PreferenceTerm preference_term(TrainMethod m, const PreferenceOptions& o, const PreferenceExample& e,
                               const StepNorms& norms) {
  PreferenceTerm t;
  const double per_example = norms.examples > 0 ? 1.0 / static_cast<double>(norms.examples) : 0.0;
  const double beta = o.beta;
  double dL_dc = 0, dL_dr = 0;  // of the example's unscaled loss
  switch (m) {
    case TrainMethod::Sft: break;
    case TrainMethod::Dpo: {
      const bool ipo = o.dpo_loss == DpoLoss::Ipo;
      // IPO works on length-averaged log-probabilities (TRL), policy and reference alike.
      const double pc = ipo ? avg(e.logp_c, e.n_c) : e.logp_c, pr = ipo ? avg(e.logp_r, e.n_r) : e.logp_r;
      const double rc = ipo ? avg(e.ref_c, e.n_c) : e.ref_c, rr = ipo ? avg(e.ref_r, e.n_r) : e.ref_r;
      const double h = (pc - rc) - (pr - rr);
      double dL_dh = 0;
      if (o.dpo_loss == DpoLoss::Sigmoid) {
        const auto [loss, d] = smoothed_logistic(beta * h, o.label_smoothing);
        t.loss = loss;
        dL_dh = beta * d;
      } else if (ipo) {
        const double g = h - 1.0 / (2.0 * beta);
        t.loss = g * g;
        dL_dh = 2.0 * g;
      } else {  // hinge
        t.loss = std::max(0.0, 1.0 - beta * h);
        dL_dh = 1.0 - beta * h > 0 ? -beta : 0.0;
      }
      dL_dc = ipo ? avg(dL_dh, e.n_c) : dL_dh;
      dL_dr = ipo ? -avg(dL_dh, e.n_r) : -dL_dh;
      t.reward_c = beta * (pc - rc);
      t.reward_r = beta * (pr - rr);
      break;
    }
    case TrainMethod::Orpo: {
      const double a = avg(e.logp_c, e.n_c), b = avg(e.logp_r, e.n_r);
      // log(1 − e^p) = log(−expm1(p)): exact near p = 0, where TRL's log1p(−exp(p)) loses digits.
      const double lo = (a - b) - (std::log(-std::expm1(a)) - std::log(-std::expm1(b)));
      t.loss = -o.orpo_lambda * log_sigmoid(lo);
      const double dL_dlo = -o.orpo_lambda * sigmoid(-lo);
      dL_dc = avg(dL_dlo / -std::expm1(a), e.n_c);
      dL_dr = avg(-dL_dlo / -std::expm1(b), e.n_r);
      t.reward_c = o.orpo_lambda * a;  // TRL's ORPO rewards: lambda times the averaged log-probability
      t.reward_r = o.orpo_lambda * b;
      break;
    }
    case TrainMethod::Simpo: {
      const double a = avg(e.logp_c, e.n_c), b = avg(e.logp_r, e.n_r);
      const auto [loss, d] = smoothed_logistic(beta * (a - b) - o.simpo_gamma, o.label_smoothing);
      t.loss = loss;
      dL_dc = avg(beta * d, e.n_c);
      dL_dr = avg(-beta * d, e.n_r);
      t.reward_c = beta * a;
      t.reward_r = beta * b;
      break;
    }
    case TrainMethod::Kto: {
      const double r = e.logp_c - e.ref_c;
      if (e.desirable) {
        const double x = beta * (r - norms.kto_z);
        t.loss = o.kto_desirable_weight * (1.0 - sigmoid(x));
        dL_dc = -o.kto_desirable_weight * beta * sigmoid(x) * sigmoid(-x);
        t.reward_c = beta * r;
        t.has_r = false;
      } else {
        const double y = beta * (norms.kto_z - r);
        t.loss = o.kto_undesirable_weight * (1.0 - sigmoid(y));
        dL_dc = o.kto_undesirable_weight * beta * sigmoid(y) * sigmoid(-y);
        t.reward_r = beta * r;
        t.has_c = false;
      }
      break;
    }
  }
  t.loss *= per_example;
  t.dlogp_c = dL_dc * per_example;
  t.dlogp_r = dL_dr * per_example;
  if (m == TrainMethod::Orpo && norms.chosen_tokens > 0) {
    // The chosen answer's NLL, a mean over the step's chosen tokens: −π_c / N.
    const double inv = 1.0 / static_cast<double>(norms.chosen_tokens);
    t.loss += -e.logp_c * inv;
    t.dlogp_c += -inv;
  }
  return t;
}

double kto_reference_point(const std::vector<double>& policy_kl, const std::vector<double>& ref_kl) {
  if (policy_kl.empty()) return 0.0;
  double sum = 0;
  for (size_t i = 0; i < policy_kl.size(); ++i) sum += policy_kl[i] - (i < ref_kl.size() ? ref_kl[i] : 0.0);
  return std::max(0.0, sum / static_cast<double>(policy_kl.size()));
}

void PreferenceMetrics::add(const PreferenceExample& e, const PreferenceTerm& t) {
  if (t.has_c) {
    reward_c += t.reward_c;
    logp_c += e.logp_c;
    ++n_c;
  }
  if (t.has_r) {
    reward_r += t.reward_r;
    logp_r += t.has_c ? e.logp_r : e.logp_c;  // KTO's undesirable completion travels in c
    ++n_r;
  }
  if (t.has_c && t.has_r) {
    margin += t.reward_c - t.reward_r;
    ++n_margin;
    correct += t.reward_c > t.reward_r ? 1.0 : 0.0;
  } else {
    // KTO: the reward has the label's sign (above the reference for desirable, below for undesirable).
    correct += (t.has_c ? t.reward_c > 0 : t.reward_r < 0) ? 1.0 : 0.0;
  }
  ++n_pairs;
}

void PreferenceMetrics::merge(const PreferenceMetrics& o) {
  reward_c += o.reward_c;
  reward_r += o.reward_r;
  margin += o.margin;
  correct += o.correct;
  logp_c += o.logp_c;
  logp_r += o.logp_r;
  n_c += o.n_c;
  n_r += o.n_r;
  n_pairs += o.n_pairs;
  n_margin += o.n_margin;
}

}  // namespace bp
