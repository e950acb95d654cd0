// Training methods (issue 38, DESIGN.md "Training methods"): SFT and the preference losses DPO,
// ORPO, SimPO and KTO, as TRL defines them.
//
// The step stays one step. The model gives each sequence of a micro-batch the summed
// log-probability of its completion tokens (π = −Σ cross-entropy over the tokens whose label
// counts: the prompt is masked) and their count |y|; a method turns those numbers (and the
// reference's, where it has one) into a loss and into dL/dπ for every sequence, which seeds the
// backward pass through the same fused linear + cross-entropy SFT uses (model/transformer.h,
// forward_backward_sequences). Nothing here knows about tensors.
//
// | method | rows       | per sequence            | reference | loss of one example                                   |
// |--------|------------|-------------------------|-----------|-------------------------------------------------------|
// | sft    | single     | (token-mean NLL)        | no        | the SFT path, not this file                           |
// | dpo    | pair       | π (ipo: π/|y|)          | yes       | −log σ(β·h), h = (πc − refc) − (πr − refr); ipo, hinge
// | | orpo   | pair       | π/|y|, chosen NLL       | no        | NLL(chosen) − λ·log σ(log-odds(c) − log-odds(r)) | |
// simpo  | pair       | π/|y|                   | no        | −log σ(β·(πc/|yc| − πr/|yr|) − γ)                     |
// | kto    | labelled   | π, π of a mismatched KL | yes       | λD(1 − σ(β(r − z))) or λU(1 − σ(β(z − r))), r = π − ref
// |
//
// Reductions, as TRL's: every term is a mean over the examples of the optimizer step (so
// micro-batching and OOM recovery do not change the step's gradient); ORPO's NLL is a mean over
// the chosen tokens of the step. KTO's reference point z = max(0, mean over the step of
// (π_KL − ref_KL)) is computed before the step's micro-batches, without gradient (TRL's
// `torch.no_grad()` KL pass).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bp {

enum class TrainMethod { Sft, Dpo, Orpo, Simpo, Kto };
enum class DpoLoss { Sigmoid, Ipo, Hinge };
// Where reference log-probabilities come from (training.reference); Auto resolves by mode.
enum class ReferenceSource { Auto, AdapterOff, Precomputed };

TrainMethod parse_train_method(std::string_view name);  // the training.method names; others throw
const char* train_method_name(TrainMethod m);
DpoLoss parse_dpo_loss(std::string_view name);
const char* dpo_loss_name(DpoLoss l);
ReferenceSource parse_reference_source(std::string_view name);
const char* reference_source_name(ReferenceSource r);

struct PreferenceOptions {
  double beta = 0.1;
  DpoLoss dpo_loss = DpoLoss::Sigmoid;
  double label_smoothing = 0.0;
  double orpo_lambda = 0.1;
  double simpo_gamma = 0.5;
  double kto_desirable_weight = 1.0;
  double kto_undesirable_weight = 1.0;
  ReferenceSource reference = ReferenceSource::Auto;
  // Multi-run sets this (not a setting): the reference of every run and of every merge's held-out
  // check is the base model without any adapter, though runs 2.. start from the merge so far.
  // Without it, each run's reference would be its own starting merge and the held-out DPO/KTO
  // losses the gates compare would all be log 2.
  bool reference_is_base = false;
  bool operator==(const PreferenceOptions&) const = default;
};

// What a method needs (the method table's columns).
bool method_is_pairwise(TrainMethod m);      // dpo, orpo, simpo: rows are (chosen, rejected) pairs
bool method_needs_reference(TrainMethod m);  // dpo, kto
bool method_is_preference(TrainMethod m);    // every method but sft

// The settings a method takes (their training.* keys); the others given explicitly are refused.
std::vector<std::string> method_setting_keys(TrainMethod m);
// Every preference setting key (the union over methods).
const std::vector<std::string>& preference_setting_keys();

// One example of a step, as the losses see it. For a pair: chosen (c) and rejected (r); for KTO
// one completion in `c` and `desirable`. logp = π (summed), n = completion tokens.
struct PreferenceExample {
  double logp_c = 0, logp_r = 0;
  int64_t n_c = 0, n_r = 0;
  double ref_c = 0, ref_r = 0;  // the reference's π (methods with a reference)
  bool desirable = true;        // KTO
};

// An example's loss and its gradient with respect to its sequences' π, both already divided by
// the step's example count (and ORPO's NLL by the step's chosen tokens), so the step's loss is
// the sum of `loss` and the gradients add up across micro-batches.
struct PreferenceTerm {
  double loss = 0;
  double dlogp_c = 0, dlogp_r = 0;
  // TRL's metrics of the example (unscaled): rewards, and for the log: π.
  double reward_c = 0, reward_r = 0;
  bool has_c = true, has_r = true;  // KTO: which reward the example has (desirable -> c)
};

struct StepNorms {
  int64_t examples = 0;       // examples in the optimizer step
  int64_t chosen_tokens = 0;  // ORPO's NLL mean
  double kto_z = 0;           // KTO's reference point for the step
};

// The loss term of one example (see the table above). Throws nothing: non-finite values pass
// through to the NaN guard.
PreferenceTerm preference_term(TrainMethod m, const PreferenceOptions& o, const PreferenceExample& e,
                               const StepNorms& norms);

// KTO's z from the step's KL sequences: max(0, mean(π_KL − ref_KL)); 0 for none.
double kto_reference_point(const std::vector<double>& policy_kl, const std::vector<double>& ref_kl);

// TRL's metric names, summed over a step's examples then averaged by PreferenceMetrics::json.
struct PreferenceMetrics {
  double reward_c = 0, reward_r = 0, margin = 0, correct = 0, logp_c = 0, logp_r = 0;
  int64_t n_c = 0, n_r = 0, n_pairs = 0, n_margin = 0;
  void add(const PreferenceExample& e, const PreferenceTerm& t);
  void merge(const PreferenceMetrics& o);
  // {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
  // "logps/rejected"} with `prefix` ("" or "eval_") before each name; only the ones with data.
  template <class Json>
  void write(Json& j, const std::string& prefix) const {
    if (n_c) j[prefix + "rewards/chosen"] = reward_c / static_cast<double>(n_c);
    if (n_r) j[prefix + "rewards/rejected"] = reward_r / static_cast<double>(n_r);
    if (n_pairs) j[prefix + "rewards/accuracies"] = correct / static_cast<double>(n_pairs);
    if (n_margin) j[prefix + "rewards/margins"] = margin / static_cast<double>(n_margin);
    if (n_c) j[prefix + "logps/chosen"] = logp_c / static_cast<double>(n_c);
    if (n_r) j[prefix + "logps/rejected"] = logp_r / static_cast<double>(n_r);
  }
};

}  // namespace bp
