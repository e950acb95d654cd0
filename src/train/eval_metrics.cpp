// `backprop eval`'s metrics, intervals and gates (contract: train/eval_metrics.h).
#include "train/eval_metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "text/dataset.h"

namespace bp {

namespace {

const char* const kNames[] = {"exact_match", "token_f1", "contains", "regex", "loss", "perplexity"};

bool needs_answers(const std::string& n) {
  return n != "loss" && n != "perplexity";
}

std::vector<std::string> words(const std::string& s) {
  std::vector<std::string> w;
  std::istringstream in(s);
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

// The statistic of metric m over the examples in `idx` (with repeats: a bootstrap resample).
double statistic(const EvalMetric& m, const EvalValues& v, size_t k, const std::vector<size_t>& idx) {
  double sum = 0, tokens = 0;
  for (size_t i : idx) {
    sum += v.per_example[k][i];
    tokens += v.tokens[i];
  }
  if (m.name == "perplexity") return tokens > 0 ? std::exp(sum / tokens) : 0.0;
  if (m.name == "loss") return tokens > 0 ? sum / tokens : 0.0;
  return idx.empty() ? 0.0 : sum / static_cast<double>(idx.size());
}

std::vector<size_t> all_of(size_t n) {
  std::vector<size_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = i;
  return idx;
}

// Percentile (linear between order statistics) of sorted values.
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const double pos = p * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

template <class Stat>
Estimate bootstrap(size_t n, int64_t resamples, uint64_t seed, const Stat& stat) {
  Estimate e;
  e.value = stat(all_of(n));
  if (n == 0 || resamples <= 0) {
    e.low = e.high = e.value;
    return e;
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, n - 1);
  std::vector<double> stats;
  stats.reserve(static_cast<size_t>(resamples));
  std::vector<size_t> idx(n);
  for (int64_t r = 0; r < resamples; ++r) {
    for (auto& i : idx) i = pick(rng);
    stats.push_back(stat(idx));
  }
  std::sort(stats.begin(), stats.end());
  e.low = percentile(stats, 0.025);
  e.high = percentile(stats, 0.975);
  return e;
}

}  // namespace

std::vector<EvalMetric> parse_eval_metrics(const std::vector<std::string>& values) {
  std::vector<EvalMetric> out;
  auto add = [&](const std::string& item) {
    EvalMetric m;
    if (item.rfind("regex:", 0) == 0) {
      m.name = "regex";
      m.pattern = item.substr(6);
      try {
        std::regex re(m.pattern, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                    fmt::format("[eval] --metric {}: not a valid regular expression ({})", item, e.what()));
      }
    } else {
      m.name = item;
      if (std::find(std::begin(kNames), std::end(kNames), item) == std::end(kNames) || item == "regex")
        throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                    fmt::format("[eval] --metric {}: not a metric (exact_match, token_f1, contains, regex:PATTERN, "
                                "loss, perplexity)",
                                item));
    }
    for (const EvalMetric& o : out)
      if (o.label() == m.label()) return;  // once each
    out.push_back(m);
  };
  for (const std::string& v : values) {
    if (v.rfind("regex:", 0) == 0) {  // the rest is the pattern, commas included
      add(v);
      continue;
    }
    std::stringstream ss(v);
    for (std::string item; std::getline(ss, item, ',');)
      if (!item.empty()) add(item);
  }
  if (out.empty()) throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[eval] no --metric given");
  return out;
}

double token_f1(std::string_view output, std::string_view reference) {
  const auto o = words(normalize_answer(output)), r = words(normalize_answer(reference));
  if (o.empty() || r.empty()) return o.empty() && r.empty() ? 1.0 : 0.0;
  std::map<std::string, int64_t> counts;
  for (const auto& w : r) ++counts[w];
  int64_t common = 0;
  for (const auto& w : o)
    if (counts[w]-- > 0) ++common;
  if (common == 0) return 0.0;
  const double p = static_cast<double>(common) / static_cast<double>(o.size());
  const double rc = static_cast<double>(common) / static_cast<double>(r.size());
  return 2 * p * rc / (p + rc);
}

EvalValues evaluate_metrics(Model& model, const Tokenizer& tok, const ChatTemplate& tmpl,
                            const std::vector<TaskExample>& all, const std::vector<EvalMetric>& metrics,
                            const EvalRunOptions& o) {
  std::vector<TaskExample> examples = all;
  if (o.max_examples > 0 && static_cast<int64_t>(examples.size()) > o.max_examples)
    examples.resize(static_cast<size_t>(o.max_examples));
  EvalValues v;
  v.per_example.assign(metrics.size(), std::vector<double>(examples.size(), 0.0));
  v.tokens.assign(examples.size(), 0.0);
  model.set_training(false);
  if (std::any_of(metrics.begin(), metrics.end(), [](const EvalMetric& m) { return needs_answers(m.name); })) {
    TaskEvalOptions to;
    to.max_new_tokens = o.max_new_tokens;
    v.answers = evaluate_task(model, tok, tmpl, examples, to).answers;
  }
  const bool teacher_forced =
      std::any_of(metrics.begin(), metrics.end(), [](const EvalMetric& m) { return !needs_answers(m.name); });
  std::vector<double> nll(examples.size(), 0.0);
  if (teacher_forced) {
    const int64_t ctx = model.config().max_position_embeddings;
    for (size_t i = 0; i < examples.size(); ++i) {
      Conversation conv = examples[i].prompt;
      conv.push_back({"assistant", examples[i].reference});
      const TokenizedPreference tp = tokenize_preference_conv(tmpl, tok, conv, 0);
      const auto& ids = tp.seq.ids;
      if (ctx > 0 && static_cast<int64_t>(ids.size()) > ctx)
        throw Error(
            ErrorCode::INPUT_VALIDATION_FAILED,
            fmt::format("[eval] example {} has {} tokens, more than the model's context {}", i + 1, ids.size(), ctx));
      std::vector<int32_t> labels(ids.size(), kIgnoreLabel);
      for (size_t t = 0; t + 1 < ids.size(); ++t)
        if (tp.seq.loss_mask[t + 1]) labels[t] = ids[t + 1];
      const CrossEntropyResult r = model.forward_loss(Batch::pack({ids}, {labels}));
      nll[i] = r.loss_sum;
      v.tokens[i] = static_cast<double>(r.n_counted);
    }
  }
  for (size_t k = 0; k < metrics.size(); ++k) {
    const EvalMetric& m = metrics[k];
    std::optional<std::regex> re;
    if (m.name == "regex") re.emplace(m.pattern, std::regex::ECMAScript);
    for (size_t i = 0; i < examples.size(); ++i) {
      double x = 0;
      if (m.name == "exact_match") {
        x = v.answers[i].exact ? 1 : 0;
      } else if (m.name == "token_f1") {
        x = token_f1(v.answers[i].output, v.answers[i].reference);
      } else if (m.name == "contains") {
        x = normalize_answer(v.answers[i].output).find(normalize_answer(v.answers[i].reference)) != std::string::npos;
      } else if (m.name == "regex") {
        x = std::regex_search(v.answers[i].output, *re) ? 1 : 0;
      } else {  // loss, perplexity: the sums; the statistic divides by the tokens
        x = nll[i];
      }
      v.per_example[k][i] = x;
    }
  }
  return v;
}

Estimate metric_estimate(const EvalMetric& m, const EvalValues& v, size_t k, int64_t resamples, uint64_t seed) {
  return bootstrap(v.tokens.size(), resamples, seed,
                   [&](const std::vector<size_t>& idx) { return statistic(m, v, k, idx); });
}

Estimate paired_difference(const EvalMetric& m, const EvalValues& a, const EvalValues& b, size_t k, int64_t resamples,
                           uint64_t seed) {
  if (a.tokens.size() != b.tokens.size())
    throw Error(ErrorCode::RUNTIME_INTERNAL, "[eval] a paired comparison needs the same examples on both sides");
  return bootstrap(a.tokens.size(), resamples, seed,
                   [&](const std::vector<size_t>& idx) { return statistic(m, b, k, idx) - statistic(m, a, k, idx); });
}

bool EvalGate::passes(double value) const {
  if (op == ">=") return value >= bound;
  if (op == ">") return value > bound;
  if (op == "<=") return value <= bound;
  return value < bound;
}

std::string EvalGate::text() const {
  return fmt::format("{}{}{}", metric, op, bound);
}

EvalGate parse_eval_gate(const std::string& text, const std::vector<EvalMetric>& metrics) {
  static const std::regex form(R"(^\s*([A-Za-z_0-9]+(?::.*?)?)\s*(>=|<=|>|<)\s*([-+0-9.eE]+)\s*$)");
  std::smatch m;
  if (!std::regex_match(text, m, form))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[eval] --gate '{}': expected METRIC>=VALUE (or >, <=, <), e.g. 'exact_match>=0.5'", text));
  EvalGate g;
  g.metric = m[1];
  g.op = m[2];
  try {
    size_t used = 0;
    g.bound = std::stod(m[3].str(), &used);
    if (used != m[3].str().size()) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[eval] --gate '{}': {} is not a number", text, m[3].str()));
  }
  if (std::none_of(metrics.begin(), metrics.end(), [&](const EvalMetric& x) { return x.label() == g.metric; }))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[eval] --gate '{}': {} is not one of the --metric values", text, g.metric))
        .with_suggestion("Add it to --metric.");
  return g;
}

}  // namespace bp
