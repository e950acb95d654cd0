// `backprop eval`'s metrics and intervals (train/eval_metrics.h) against hand-computed values and a
// seeded simulation: token F1, the metric and gate parsers, bootstrap interval coverage, the paired
// difference.
#include "train/eval_metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "support/expect_error.h"

namespace bp {
namespace {
using test::code_of;

TEST(EvalMetrics, TokenF1ByHand) {
  EXPECT_DOUBLE_EQ(token_f1("the cat sat", "the cat"), 0.8);  // P 2/3, R 1
  EXPECT_DOUBLE_EQ(token_f1("The  CAT", "the cat"), 1.0);     // normalised
  EXPECT_DOUBLE_EQ(token_f1("a b", "c"), 0.0);
  EXPECT_DOUBLE_EQ(token_f1("a a b", "a b b"), 2.0 / 3.0);  // common = min counts: a 1, b 1
  EXPECT_DOUBLE_EQ(token_f1("", ""), 1.0);
  EXPECT_DOUBLE_EQ(token_f1("x", ""), 0.0);
}

TEST(EvalMetrics, MetricListsAndGates) {
  const auto m = parse_eval_metrics({"exact_match,token_f1", "regex:a{1,2}", "exact_match"});
  ASSERT_EQ(m.size(), 3u);  // a repeat counts once; the regex keeps its comma
  EXPECT_EQ(m[2].label(), "regex:a{1,2}");
  EXPECT_EQ(code_of([] { parse_eval_metrics({"accuracy"}); }), ErrorCode::INPUT_VALIDATION_FAILED);
  EXPECT_EQ(code_of([] { parse_eval_metrics({"regex:("}); }), ErrorCode::INPUT_VALIDATION_FAILED);
  const EvalGate g = parse_eval_gate("exact_match >= 0.5", m);
  EXPECT_TRUE(g.passes(0.5));
  EXPECT_FALSE(g.passes(0.49));
  EXPECT_TRUE(parse_eval_gate("token_f1<0.9", m).passes(0.3));
  EXPECT_TRUE(parse_eval_gate("regex:a{1,2}>0", m).passes(1));
  EXPECT_EQ(code_of([&] { parse_eval_gate("loss<=2", m); }), ErrorCode::INPUT_VALIDATION_FAILED);  // not asked for
  EXPECT_EQ(code_of([&] { parse_eval_gate("exact_match=>1", m); }), ErrorCode::INPUT_VALIDATION_FAILED);
  EXPECT_EQ(code_of([&] { parse_eval_gate("exact_match>=1.2.3", m); }), ErrorCode::INPUT_VALIDATION_FAILED);
}

// Coverage of the 95% percentile-bootstrap interval on a seeded simulation: 300 samples of 100
// Bernoulli(0.3) outcomes; the interval must hold the true 0.3 in 88%–99% of them (the percentile
// bootstrap runs a little under nominal at n = 100). A wrong quantile (e.g. 25%/75%) covers ~50%.
TEST(EvalMetrics, BootstrapIntervalsCoverTheTruth) {
  const EvalMetric m{"exact_match", ""};
  std::mt19937_64 rng(2026);
  std::bernoulli_distribution hit(0.3);
  int covered = 0;
  const int trials = 300;
  for (int t = 0; t < trials; ++t) {
    EvalValues v;
    v.per_example.assign(1, {});
    for (int i = 0; i < 100; ++i) {
      v.per_example[0].push_back(hit(rng) ? 1.0 : 0.0);
      v.tokens.push_back(1.0);
    }
    const Estimate e = metric_estimate(m, v, 0, 500, static_cast<uint64_t>(t));
    EXPECT_LE(e.low, e.value);
    EXPECT_GE(e.high, e.value);
    covered += e.low <= 0.3 && 0.3 <= e.high;
  }
  EXPECT_GE(covered, trials * 88 / 100);
  EXPECT_LE(covered, trials * 99 / 100);
}

// The paired difference resamples the same examples for both sides: b = a + 0.1 on every example
// has exactly 0.1 on every resample, an interval of width 0 (unpaired resampling would not).
TEST(EvalMetrics, PairedDifferenceUsesTheSameExamples) {
  const EvalMetric m{"token_f1", ""};
  EvalValues a, b;
  a.per_example.assign(1, {});
  b.per_example.assign(1, {});
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0, 0.8);
  for (int i = 0; i < 50; ++i) {
    const double x = u(rng);
    a.per_example[0].push_back(x);
    b.per_example[0].push_back(x + 0.1);
    a.tokens.push_back(1);
    b.tokens.push_back(1);
  }
  const Estimate d = paired_difference(m, a, b, 0, 1000, 9);
  EXPECT_NEAR(d.value, 0.1, 1e-12);
  EXPECT_NEAR(d.low, 0.1, 1e-12);
  EXPECT_NEAR(d.high, 0.1, 1e-12);
  // The same seed gives the same interval.
  const Estimate e1 = metric_estimate(m, a, 0, 1000, 4), e2 = metric_estimate(m, a, 0, 1000, 4);
  EXPECT_EQ(e1.low, e2.low);
  EXPECT_EQ(e1.high, e2.high);
  EXPECT_LT(e1.low, e1.high);
}

// loss and perplexity are token-weighted: total NLL / total tokens, not a mean of per-example means.
TEST(EvalMetrics, LossIsPerTokenOverAllExamples) {
  EvalValues v;
  v.per_example = {{2.0, 30.0}};  // NLL sums
  v.tokens = {1.0, 10.0};
  EXPECT_DOUBLE_EQ(metric_estimate({"loss", ""}, v, 0, 0, 0).value, 32.0 / 11.0);
  EXPECT_DOUBLE_EQ(metric_estimate({"perplexity", ""}, v, 0, 0, 0).value, std::exp(32.0 / 11.0));
}

}  // namespace
}  // namespace bp
