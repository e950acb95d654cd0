#include "cli/progress.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "core/allocator.h"
#include "core/error.h"

namespace bp::cli {

ProgressBar::ProgressBar(bool enabled) : enabled_(enabled), tty_(isatty(2) != 0) {}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) return fmt::format("{:.1f}s", s);
  auto total = static_cast<int64_t>(s + 0.5);
  if (total < 3600) return fmt::format("{}m{:02d}s", total / 60, total % 60);
  return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
}

std::string format_progress_line(const StepRecord& r, int64_t total, double tps, size_t in_use, size_t peak,
                                 double eta_s, int width) {
  int filled =
      total > 0
          ? static_cast<int>(static_cast<double>(width) * static_cast<double>(r.step) / static_cast<double>(total))
          : 0;
  std::string bar(static_cast<size_t>(std::clamp(filled, 0, width)), '=');
  if (filled < width) bar += '>';
  bar.resize(static_cast<size_t>(width), ' ');
  std::string loss = r.skipped ? std::string("skipped") : fmt::format("{:.4f}", r.loss);
  // Preference methods: the step's reward accuracy and margin beside the loss (TRL's names).
  for (const auto& [name, value] : r.metrics) {
    if (name == "rewards/accuracies") loss += fmt::format(" acc {:.2f}", value);
    if (name == "rewards/margins") loss += fmt::format(" margin {:.3f}", value);
  }
  return fmt::format("[{}] {}/{} loss {} lr {:.2e} | {:.0f} tok/s | mem {} (peak {}) | ETA {}", bar, r.step, total,
                     loss, r.lr, tps, format_bytes(in_use), format_bytes(peak), format_duration(eta_s));
}

void ProgressBar::update(const StepRecord& r, const TrainSummary& s, int64_t total) {
  if (!enabled_) return;
  const ThroughputReading rate = meter_.update(r.step, s.tokens, total, std::chrono::steady_clock::now());
  auto m = cpu_allocator().stats();
  std::string line = format_progress_line(r, total, rate.tokens_per_s, m.bytes_in_use, m.bytes_peak, rate.eta_s, 24);
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    drawn_ = true;
  } else if (r.step == 1 || r.step == total || r.step % 10 == 0) {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

void ProgressBar::clear_line() {
  if (enabled_ && tty_ && drawn_) {
    std::fprintf(stderr, "\r\033[K");
    drawn_ = false;
  }
}

TrainCallbacks ProgressBar::callbacks() {
  TrainCallbacks cb;
  cb.on_step = [this](const StepRecord& r, const TrainSummary& s, int64_t total) { update(r, s, total); };
  cb.on_event = [this](const std::string&, const std::string&) { clear_line(); };
  return cb;
}

void ProgressBar::finish() {
  if (enabled_ && tty_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

std::string format_train_summary(const TrainSummary& s, const TrainOptions& o) {
  auto opt = [](const std::optional<double>& v) { return v ? fmt::format("{:.4f}", *v) : std::string("n/a"); };
  std::string out;
  out += "\nTraining finished\n";
  out += fmt::format("  run id            {}\n", s.run_id);
  out += fmt::format("  steps             {} ({} tokens, {})\n", s.steps_done, s.tokens, format_duration(s.seconds));
  out += fmt::format("  final train loss  {:.4f}\n", s.final_loss);
  out += fmt::format("  eval loss         before {} -> after {} (best {})\n", opt(s.initial_eval_loss),
                     opt(s.final_eval_loss), opt(s.best_eval_loss));
  for (auto& [k, v] : s.final_eval_metrics.items()) {  // preference methods: eval_rewards/accuracies, ...
    const auto before = s.initial_eval_metrics.find(k);
    out += fmt::format("  {:<24} before {} -> after {:.4f}\n", k.substr(5),
                       before != s.initial_eval_metrics.end() ? fmt::format("{:.4f}", before->get<double>()) : "n/a",
                       v.get<double>());
  }
  out += fmt::format("  peak memory       {}\n", format_bytes(s.peak_memory_bytes));
  if (!s.base_dtype.empty()) out += fmt::format("  frozen base       {}\n", s.base_dtype);
  if (s.matmul_dtype == "bf16") out += "  GEMM inputs       bf16 copies of the f32 weights\n";
  out += fmt::format("  micro-batch       {} sequences x {} accumulation{}, gradient checkpointing {}\n",
                     s.micro_batch_size, s.grad_accum,
                     s.world_size > 1 ? fmt::format(" on each of {} ranks", s.world_size) : std::string(),
                     s.gradient_checkpointing ? "on" : "off");
  if (s.world_size > 1)  // data-parallel: what the steps' collectives cost (rank 0's own)
    out += fmt::format("  collectives       {:.2f} s of the steps ({:.0f}% of the run), {} sent by rank 0\n",
                       s.comm_seconds, s.seconds > 0 ? 100.0 * s.comm_seconds / s.seconds : 0.0,
                       format_bytes(static_cast<size_t>(s.comm_bytes)));
  out += fmt::format("  OOM recoveries    {}\n", s.oom_recoveries);
  out += fmt::format("  skipped steps     {}\n", s.skipped_steps);
  if (s.records_lost > 0)  // a full disk: the run is saved, its records are not all written (exit 3)
    out += fmt::format("  records lost      {} (not written to {})\n", s.records_lost,
                       fmt::format("{}", fmt::join(s.records_lost_files, ", ")));
  out += fmt::format("  outputs           {}\n", s.output_dir);
  out += fmt::format("  final {}     {}\n", o.mode == TrainMode::Lora ? "adapter" : "model  ", s.final_artifact);
  out += "\nNext:\n";
  std::string model = o.model_dir.empty() ? s.final_artifact : o.model_dir;
  if (o.mode == TrainMode::Lora) {
    out += fmt::format("  backprop generate --model {} --adapter {} --prompt \"...\"\n", model, s.final_artifact);
    out += fmt::format("  backprop export {} --format gguf --quantization q8_0\n", s.final_artifact);
  } else {
    out += fmt::format("  backprop generate --model {} --prompt \"...\"\n", s.final_artifact);
    out += fmt::format("  backprop export {} --format gguf --quantization q8_0\n", s.final_artifact);
  }
  out += fmt::format("  backprop train ... --resume {}   (continue this run)\n", s.run_id);
  return out;
}

}  // namespace bp::cli
