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
// The optimizer step (the same for every method) is left out. Each case: 1 warm-up, then the
// median of BP_BENCH_STEPS (default 3) timed runs. BP_BENCH_THREADS (2), BP_BENCH_SMOL_LAYERS (30),
// BP_BENCH_QWEN_LAYERS (8 of 24; full-size vocabulary head).
//
// Run: ./build/bench/bench_preference
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
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

struct Measured {
  double seconds = 0;
  size_t peak = 0;
};

template <class Fn>
Measured measure(Fn&& fn, int steps) {
  bp::Allocator& alloc = bp::allocator_for(bp::Device{});
  fn();  // warm-up
  std::vector<double> t;
  size_t peak = 0;
  for (int i = 0; i < steps; ++i) {
    alloc.reset_peak();
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    peak = std::max(peak, alloc.stats().bytes_peak);
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], peak};
}

void run_shape(bp::BenchShape shape, int layers, int steps) {
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

  const Measured sft = measure(
      [&] {
        model.zero_grads();
        model.forward_backward(pair, scale, 1);
      },
      steps);
  const Measured dpo_off = measure(
      [&] {
        model.zero_grads();
        reference(pair);
        model.forward_backward_sequences(pair, weights, 1);
      },
      steps);
  const Measured dpo_pre = measure(
      [&] {
        model.zero_grads();
        model.forward_backward_sequences(pair, weights, 1);
      },
      steps);
  // KTO per example: one sequence trained, its KL sequence (policy and reference) and its reference.
  const Measured kto = measure(
      [&] {
        model.zero_grads();
        model.sequence_losses(one);  // the KL pass, policy (the KL sequence has the same length)
        reference(one);              // the KL pass, reference
        reference(one);              // the example's reference
        model.forward_backward_sequences(one, weights, 1);
      },
      steps);
  const Measured sft_one = measure(
      [&] {
        model.zero_grads();
        model.forward_backward(one, scale, 1);
      },
      steps);
  std::printf("%s (%d layers), %lld + %lld tokens per sequence, %lld trained tokens per pair\n", shape.name, layers,
              static_cast<long long>(P), static_cast<long long>(C), static_cast<long long>(trained));
  std::printf("  %-26s %10s %12s %10s %10s\n", "", "ms", "us/trained", "x SFT", "peak MiB");
  auto row = [&](const char* name, const Measured& m, const Measured& base, int64_t tokens) {
    std::printf("  %-26s %10.1f %12.1f %10.3f %10.1f (x%.3f)\n", name, m.seconds * 1e3,
                m.seconds * 1e6 / static_cast<double>(tokens),
                (m.seconds / static_cast<double>(tokens)) / (base.seconds / static_cast<double>(tokens)),
                static_cast<double>(m.peak) / (1 << 20), static_cast<double>(m.peak) / static_cast<double>(base.peak));
  };
  row("sft (2 samples)", sft, sft, trained);
  row("dpo adapter-off", dpo_off, sft, trained);
  row("dpo precomputed/orpo/simpo", dpo_pre, sft, trained);
  row("sft (1 sample)", sft_one, sft_one, trained / 2);
  row("kto adapter-off (1 sample)", kto, sft_one, trained / 2);
}

}  // namespace

int main() {
  const int threads = env_int("BP_BENCH_THREADS", 2);
  bp::set_num_threads(threads);
  const int steps = env_int("BP_BENCH_STEPS", 3);
  std::printf("bench_preference: %d threads, median of %d\n", threads, steps);
  run_shape(bp::smollm135m_shape(), env_int("BP_BENCH_SMOL_LAYERS", 30), steps);
  run_shape(bp::qwen25_05b_shape(), env_int("BP_BENCH_QWEN_LAYERS", 8), steps);
  return 0;
}
