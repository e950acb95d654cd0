// The training loop (DESIGN.md "Trainer"): one optimizer step = accumulate gradients over
// micro-batches (with OOM recovery), clip, check for non-finite values, update, schedule the
// learning rate, log; evaluate and checkpoint on schedule; resume bit-identically.
//
// Output folder layout (--output, default runs/<run id>):
//   settings.json          resolved settings, with where each value came from
//   metrics.jsonl          one JSON record per step / eval / event, with the run id
//   checkpoints/checkpoint-<step>/   (train/checkpoint.h)
//   adapter/               final PEFT adapter (LoRA mode)   | model/ final HF model (full mode)
//   summary.json           the final summary
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/lora.h"
#include "model/transformer.h"
#include "train/lr_schedule.h"

namespace bp {

class Settings;

struct TrainOptions {
  std::string model_dir;
  std::string base_model_name;   // adapter_config's base_model_name_or_path when not model_dir (a hub name)
  std::string init_from_config;  // full mode from scratch: a config.json (weights random)
  std::string tokenizer_dir;     // defaults to model_dir (or the config's folder)
  std::string data_path;
  std::string data_format = "auto";
  std::string eval_data_path;        // a separate held-out file; replaces the --holdout split
  std::string output_root = "runs";  // runs folder: a new run writes to <output_root>/<run id>
  std::string output_dir;            // set explicitly (tests) to write exactly there
  std::string resume;                // "" | "latest" | run id | path
  std::string device = "auto";       // auto | cpu | cuda[:N] (cuda: DEP_GPU_NOT_AVAILABLE for now)
  bool shuffle = true;               // a new sample order each epoch (seeded); false = file order
  int64_t max_bad_rows = 100;        // more skipped (bad) rows than this stop the run; 0 = no limit
  int64_t steps = 0;                 // 0 -> from epochs
  int64_t epochs = 1;
  int64_t batch_size = 8;        // sequences per optimizer step
  int64_t micro_batch_size = 0;  // 0 = auto (memory plan)
  int64_t grad_accum = 0;        // 0 = derived
  double lr = 2e-4;
  LrScheduler lr_scheduler = LrScheduler::Cosine;
  int64_t warmup_steps = 0;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;  // 0 = no clipping
  int64_t max_seq_length = 512;
  TrainMode mode = TrainMode::Lora;
  LoraConfig lora;
  std::optional<bool> gradient_checkpointing;  // empty = auto: off when the memory plan says it fits
  uint64_t seed = 42;
  int64_t eval_every = 0;  // 0 = only at the end
  double holdout = 0.1;
  int64_t save_every = 0;  // 0 = only at the end
  int keep_checkpoints = 2;
  size_t max_memory_bytes = SIZE_MAX;
  int threads = 0;
  bool oom_recovery = true;
  int nan_max_consecutive = 3;
  bool strict = false;
  bool train_on_all = false;
  bool quiet = false;                // no progress bar (tests)
  nlohmann::json resolved_settings;  // written to <run>/settings.json (the CLI passes every setting)
  // Fault injection (tests): OOM at the first micro-batch of this step; NaN gradient at steps.
  int64_t fault_oom_step = -1;
  int64_t fault_oom_repeat = 1;  // how many consecutive attempts of that step fail
  std::vector<int64_t> fault_nan_steps;
  int64_t fault_eval_throw_at = -1;       // throw inside the eval after this step (tests)
  int64_t fault_crash_after_step = 0;     // SIGKILL self after this step (and its checkpoint); 0 = off
  std::string fault_crash_at;             // io_faults().crash_at for checkpoint writes
  int64_t fault_enospc_after_bytes = -1;  // io_faults().enospc_after_bytes
  int64_t stop_after_step_for_tests = 0;  // behave as if SIGINT arrived during this step

  static TrainOptions from_settings(const Settings& s);
};

struct StepRecord {
  int64_t step = 0;  // 1-based optimizer step
  double loss = 0, grad_norm = 0, lr = 0;
  int64_t tokens = 0;
  bool skipped = false;
  std::vector<int64_t> sample_ids;
};

struct TrainSummary {
  std::string run_id, output_dir, final_artifact;
  int64_t steps_done = 0, tokens = 0, oom_recoveries = 0, skipped_steps = 0, micro_batch_size = 0, grad_accum = 0;
  double seconds = 0, final_loss = 0;
  std::optional<double> initial_eval_loss, final_eval_loss, best_eval_loss;
  size_t peak_memory_bytes = 0;
  bool gradient_checkpointing = false;  // at the end of the run (auto may turn it on after an OOM)
  std::vector<StepRecord> history;
  nlohmann::json to_json() const;
};

// Observers the CLI (and tests) hook into; all optional.
struct TrainCallbacks {
  std::function<void(const StepRecord&, const TrainSummary&, int64_t total_steps)> on_step;
  std::function<void(const std::string& level, const std::string& message)> on_event;
};

class Trainer {
 public:
  explicit Trainer(TrainOptions options, TrainCallbacks callbacks = {});
  ~Trainer();
  TrainSummary run();
  // Access for tests after run(): the model and adapter as trained.
  Model& model();
  LoraAdapter* adapter();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace bp
