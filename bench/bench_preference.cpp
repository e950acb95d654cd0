// Preference methods against SFT (issue 38): time and peak memory of one micro-batch's
// forward + backward per trained token, LoRA r=16 all-linear, on SmolLM-135M- and
// Qwen2.5-0.5B-shaped models with random weights. The same two sequences (a prompt of
// BP_BENCH_PROMPT tokens, default 64, and a completion of BP_BENCH_COMPLETION, default 192, the
// completion trained) are an SFT micro-batch of two samples and a pair:
//   sft               Model::forward_backward
//   dpo adapter-off   the reference pass with the adapter off (Model::sequence_losses) + the
//                     per-sequence forward/backward (forward_backward_sequences)
//   dpo precomputed   forward_backward_sequences alone (also what orpo and simpo cost: their
//                     losses are arithmetic on the same per-sequence numbers)
//   kto adapter-off   the KL pass (policy and reference, no gradient) + the reference pass +
//                     forward_backward_sequences, for one sequence of the pair per example
// The optimizer step (the same for every method) is left out. One warm-up round, then
// BP_BENCH_STEPS (default 5) rounds of every case in turn; "x SFT" is the median of the rounds'
// ratios (run_rounds says why), with their range. BP_BENCH_THREADS (2), BP_BENCH_SMOL_LAYERS (30),
// BP_BENCH_QWEN_LAYERS (8 of 24; full-size vocabulary head).
//
// Run: ./build/bench/bench_preference
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/threads.h"
#include "model/loader.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "train/train_benchmark.h"

namespace {

using Clock = std::chrono::steady_clock;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// One case of the benchmark: its work, and per round its time and the allocator's peak.
struct Case {
  Case(const char* n, std::function<void()> f) : name(n), fn(std::move(f)) {}
  const char* name;
  std::function<void()> fn;
  std::vector<double> seconds;
  size_t peak = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Every case once per round, `rounds` rounds after one warm-up round. Interleaving matters: on a
// shared 2-vCPU machine the speed drifts by ±25% over minutes (2026-12-07: the same SFT step took
// 2.4 s in one run and 3.0 s in the next), so a case timed minutes after another would compare
// the machine's moods, not the methods. Ratios are the median of each round's ratio.
void run_rounds(std::vector<Case>& cases, int rounds) {
  bp::Allocator& alloc = bp::allocator_for(bp::Device{});
  for (auto& c : cases) c.fn();  // warm-up
  for (int r = 0; r < rounds; ++r)
    for (auto& c : cases) {
      alloc.reset_peak();
      const auto t0 = Clock::now();
      c.fn();
      c.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      c.peak = std::max(c.peak, alloc.stats().bytes_peak);
    }
}

// The median over rounds of case a's time over case b's.
double ratio(const Case& a, const Case& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.seconds.size(); ++i) r.push_back(a.seconds[i] / b.seconds[i]);
  return median(r);
}

void run_shape(bp::BenchShape shape, int layers, int rounds) {
  shape.layers = layers;
  const bp::ModelConfig cfg = bp::bench_config(shape);
  bp::LoraConfig lc;
  lc.r = 16;
  lc.alpha = 32;
  lc.target_modules = {"all-linear"};
  bp::LoraAdapter adapter = bp::init_lora(cfg, lc, 3);
  bp::Model model(bp::init_random_weights(cfg, 1), bp::ModelOptions{bp::TrainMode::Lora, true});
  model.attach_lora(adapter);
  const int64_t P = env_int("BP_BENCH_PROMPT", 64), C = env_int("BP_BENCH_COMPLETION", 192);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.vocab_size - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(P));
  for (auto& t : prompt) t = tok(rng);
  std::vector<std::vector<int32_t>> ids, labels;
  for (int s = 0; s < 2; ++s) {
    std::vector<int32_t> seq = prompt;
    for (int64_t i = 0; i < C; ++i) seq.push_back(tok(rng));
    std::vector<int32_t> lab(seq.size(), bp::kIgnoreLabel);
    for (size_t t = static_cast<size_t>(P) - 1; t + 1 < seq.size(); ++t) lab[t] = seq[t + 1];
    ids.push_back(seq);
    labels.push_back(lab);
  }
  const bp::Batch pair = bp::Batch::pack(ids, labels);
  const bp::Batch one = bp::Batch::pack({ids[0]}, {labels[0]});
  const int64_t trained = pair.num_label_tokens();
  const float scale = 1.0f / static_cast<float>(trained);
  auto weights = [&](const bp::Model::SequenceLosses& l) { return std::vector<float>(l.loss_sum.size(), scale); };
  auto reference = [&](const bp::Batch& b) {
    model.set_lora_enabled(false);
    model.sequence_losses(b);
    model.set_lora_enabled(true);
  };

  // KTO per example: one sequence trained, its KL sequence (policy and reference) and its reference.
  std::vector<Case> cases = {
      {"sft (2 samples)",
       [&] {
         model.zero_grads();
         model.forward_backward(pair, scale, 1);
       }},
      {"dpo adapter-off",
       [&] {
         model.zero_grads();
         reference(pair);
         model.forward_backward_sequences(pair, weights, 1);
       }},
      {"dpo precomputed/orpo/simpo",
       [&] {
         model.zero_grads();
         model.forward_backward_sequences(pair, weights, 1);
       }},
      {"sft (1 sample)",
       [&] {
         model.zero_grads();
         model.forward_backward(one, scale, 1);
       }},
      {"kto adapter-off (1 sample)",
       [&] {
         model.zero_grads();
         model.sequence_losses(one);  // the KL pass, policy (the KL sequence has the same length)
         reference(one);              // the KL pass, reference
         reference(one);              // the example's reference
         model.forward_backward_sequences(one, weights, 1);
       }},
  };
  run_rounds(cases, rounds);
  std::printf("%s (%d layers), %lld + %lld tokens per sequence, %lld trained tokens per pair\n", shape.name, layers,
              static_cast<long long>(P), static_cast<long long>(C), static_cast<long long>(trained));
  std::printf("  %-26s %10s %12s %16s %10s\n", "", "median ms", "us/trained", "x SFT (min-max)", "peak MiB");
  // Both SFT baselines and the cases against them train the same tokens, so the ratio of times is
  // the ratio per trained token.
  auto row = [&](const Case& c, const Case& base, int64_t tokens) {
    std::vector<double> each;
    for (size_t i = 0; i < c.seconds.size(); ++i) each.push_back(c.seconds[i] / base.seconds[i]);
    const double med = median(c.seconds);
    std::printf("  %-26s %10.1f %12.1f %6.3f (%.2f-%.2f) %10.1f (x%.3f)\n", c.name, med * 1e3,
                med * 1e6 / static_cast<double>(tokens), ratio(c, base), *std::min_element(each.begin(), each.end()),
                *std::max_element(each.begin(), each.end()), static_cast<double>(c.peak) / (1 << 20),
                static_cast<double>(c.peak) / static_cast<double>(base.peak));
  };
  for (size_t i = 0; i < 3; ++i) row(cases[i], cases[0], trained);
  for (size_t i = 3; i < 5; ++i) row(cases[i], cases[3], trained / 2);
}

}  // namespace

int main() {
  const int threads = env_int("BP_BENCH_THREADS", 2);
  bp::set_num_threads(threads);
  const int steps = env_int("BP_BENCH_STEPS", 5);
  std::printf("bench_preference: %d threads, %d interleaved rounds\n", threads, steps);
  run_shape(bp::smollm135m_shape(), env_int("BP_BENCH_SMOL_LAYERS", 30), steps);
  run_shape(bp::qwen25_05b_shape(), env_int("BP_BENCH_QWEN_LAYERS", 8), steps);
  return 0;
}
