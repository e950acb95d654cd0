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
#include "train/train_options.h"

namespace bp {

struct StepRecord {
  int64_t step = 0;  // 1-based optimizer step
  double loss = 0, grad_norm = 0, lr = 0;
  int64_t tokens = 0;
  bool skipped = false;
  std::vector<int64_t> sample_ids;
  // Preference methods: TRL's metrics of the step ("rewards/chosen", "logps/rejected", ...).
  std::vector<std::pair<std::string, double>> metrics;
};

struct TrainSummary {
  std::string run_id, output_dir, final_artifact;
  std::string final_gguf_adapter;  // a LoRA run from a GGUF base: the GGUF LoRA adapter ("" otherwise)
  int64_t steps_done = 0, tokens = 0, oom_recoveries = 0, skipped_steps = 0, micro_batch_size = 0, grad_accum = 0;
  double seconds = 0, final_loss = 0;
  std::optional<double> initial_eval_loss, final_eval_loss, best_eval_loss;
  size_t peak_memory_bytes = 0;
  size_t planned_memory_bytes = 0;      // the memory plan's total for the micro-batch chosen before step 1
  std::string base_dtype;               // how the frozen base was held (model/held_weights.h describe_held_weights)
  std::string matmul_dtype = "f32";     // input type of the trained matrices' GEMMs (training.matmul_dtype)
  bool gradient_checkpointing = false;  // at the end of the run (auto may turn it on after an OOM)
  int world_size = 1;                   // processes of a data-parallel run (mpirun / srun / --nproc)
  // Data-parallel: the steps' wall seconds in collectives and the payload bytes this rank sent (the
  // sums of the step records' comm_s and comm_bytes); 0 in one process.
  double comm_seconds = 0;
  uint64_t comm_bytes = 0;
  // Records (metrics.jsonl lines, log records) that could not be written, e.g. on a full disk, and
  // the files they belong to: `train` exits 3 (partial success) when there are any.
  uint64_t records_lost = 0;
  std::vector<std::string> records_lost_files;
  std::vector<StepRecord> history;
  // Preference methods: the method, and the held-out metrics before and after training
  // (eval_rewards/accuracies, ...; empty objects without a held-out set).
  std::string method = "sft";
  nlohmann::json initial_eval_metrics = nlohmann::json::object(), final_eval_metrics = nlohmann::json::object();
  nlohmann::json to_json() const;
};

// Observers the CLI (and tests) hook into; all optional.
struct TrainCallbacks {
  std::function<void(const StepRecord&, const TrainSummary&, int64_t total_steps)> on_step;
  std::function<void(const std::string& level, const std::string& message)> on_event;
  // Every record of metrics.jsonl (step, eval, event, checkpoint, OOM recovery, ...), as written,
  // with the run's total steps: the Python package's callback and progress bar.
  std::function<void(const nlohmann::json& record, int64_t total_steps)> on_record;
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
  TrainSummary run_impl();
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace bp
