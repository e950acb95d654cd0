// `backprop eval` (issue 43): task metrics of a model (and adapter) on held-out conversations, with
// 95% bootstrap confidence intervals, a paired comparison of two models on the same rows, and gates
// for CI.
//
// Metrics (per example, then the mean over examples, except loss and perplexity):
//   exact_match    the greedy answer equals the reference after task_eval.h's normalisation (1/0)
//   token_f1       F1 of the whitespace tokens of the two normalised answers (SQuAD's, without its
//                  article and punctuation stripping); 1 when both are empty
//   contains       the normalised reference occurs in the normalised answer (1/0)
//   regex:PATTERN  the answer matches PATTERN (ECMAScript, searched anywhere) (1/0)
//   loss           the reference answers' NLL per token given their prompts, teacher-forced: total
//                  NLL / total tokens over the examples (only each final assistant turn's trained
//                  tokens count), so a run's held-out eval loss and eval's loss are the same number
//   perplexity     exp(loss)
// Greedy answers come from evaluate_task (model/generate.h's KV cache), so the quick start's exact
// match and eval's are the same numbers.
//
// Intervals: `resamples` bootstrap resamples of the examples (seeded, so the same seed gives the
// same interval), the 2.5th and 97.5th percentiles of the statistic. A paired comparison resamples
// the same example indices for both models and reports the difference (b − a).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/task_eval.h"

namespace bp {

struct EvalMetric {
  std::string name;     // exact_match, token_f1, contains, regex, loss, perplexity
  std::string pattern;  // regex
  std::string label() const { return name == "regex" ? "regex:" + pattern : name; }
};

// "exact_match,token_f1" or one "regex:PATTERN" (a pattern may hold commas: give it its own
// --metric). Unknown names and bad patterns: INPUT_VALIDATION_FAILED naming them.
std::vector<EvalMetric> parse_eval_metrics(const std::vector<std::string>& values);

double token_f1(std::string_view output, std::string_view reference);

// Per-example values of each metric (perplexity: the examples' NLL sums and token counts).
struct EvalValues {
  std::vector<TaskAnswer> answers;
  std::vector<std::vector<double>> per_example;  // [metric][example]; perplexity: NLL sums
  std::vector<double> tokens;                    // answer tokens per example (loss, perplexity)
};

struct EvalRunOptions {
  int64_t max_new_tokens = 64;
  int64_t max_examples = 0;
};

EvalValues evaluate_metrics(Model& model, const Tokenizer& tok, const ChatTemplate& tmpl,
                            const std::vector<TaskExample>& examples, const std::vector<EvalMetric>& metrics,
                            const EvalRunOptions& o);

struct Estimate {
  double value = 0, low = 0, high = 0;
};

// The metric's statistic over all examples and its bootstrap interval.
Estimate metric_estimate(const EvalMetric& m, const EvalValues& v, size_t metric_index, int64_t resamples,
                         uint64_t seed);
// b − a on the same examples, resampled in pairs.
Estimate paired_difference(const EvalMetric& m, const EvalValues& a, const EvalValues& b, size_t metric_index,
                           int64_t resamples, uint64_t seed);

// "exact_match>=0.5" (>=, >, <=, <): the metric label, the operator and the bound.
struct EvalGate {
  std::string metric, op;
  double bound = 0;
  bool passes(double value) const;
  std::string text() const;
};
EvalGate parse_eval_gate(const std::string& text, const std::vector<EvalMetric>& metrics);

}  // namespace bp
