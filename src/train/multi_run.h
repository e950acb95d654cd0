// Multi-run training (issue 21): several LoRA runs over fresh windows of the data, each merged
// into the adapter of the runs before it (train/adapter_merge.h), with gates that refuse a merge.
//
//   1. The JSONL pool is shuffled (seed); `validation` of it is held out first and never trained
//      on (or --eval-data names the held-out file). K = samples per run must fit in the pool.
//   2. Run i (1-based) trains on pool window [(i−1)·K, i·K) (wrapping round the pool), plus
//      `replay`·K rows drawn from earlier windows, at lr·lr_decay^(i−1); it starts from the merge
//      so far (slao: its A rows orthonormalised first).
//   3. Gates, in order: drift — cos(B_new, B_merged) < drift_threshold keeps the run as a side
//      branch, unmerged; non-finite merged values — RUNTIME_SLAO_MERGE_DIVERGED stops the
//      multi-run (the merge before it stays on disk); eval — a merge whose held-out loss rises
//      more than eval_tolerance above the previous merge's is undone (RUNTIME_EVAL_GATE_REGRESSED
//      recorded) and the next run starts from the previous merge.
//   4. Early stopping: `patience` runs in a row without a better held-out loss end the multi-run.
//
// Output folder:
//   holdout.jsonl, run-<i>/ (train.jsonl and a whole `train` run folder: adapter/, checkpoints/,
//   metrics.jsonl, summary.json), merged/run-<i>/ (the merge after run i), adapter/ (the final
//   merge), history.json (per run: decision, λ, cosine, held-out loss), multirun_state.json.
// multirun_state.json is rewritten atomically after each run's decision: it is the commit point.
// With `resume`, a crash anywhere (inside a run, in the merge, in the gate) continues from it:
// an unfinished run resumes from its own checkpoints, a finished one is merged again from the
// committed merge, so the final adapter is the same as an uninterrupted multi-run's.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "train/adapter_merge.h"
#include "train/trainer.h"

namespace bp {

class Settings;

struct MultiRunOptions {
  TrainOptions train;  // the settings each run trains with (data_path = the whole pool)
  std::string output_dir;
  int64_t runs = 3;
  int64_t samples_per_run = 0;  // 0 = pool / runs
  double replay = 0.0;          // fraction of K drawn from earlier windows
  double lr_decay = 1.0;        // lr of run i = lr · lr_decay^(i−1)
  AdapterMergeOptions merge;
  double drift_threshold = -1.0;  // below this cosine a run becomes a side branch; −1 = off
  double eval_tolerance = 0.0;    // allowed held-out loss rise of a merge
  int64_t patience = 0;           // 0 = no early stopping
  double validation = 0.1;        // held-out fraction of the pool (ignored when eval_data_path is set)
  bool resume = false;
  // Tests: "crash_merge:<i>" SIGKILLs the process after writing merge i, before committing it;
  // "nan_merge:<i>" puts a NaN into merge i.
  std::string fault_inject;

  // `train` = the options each run trains with (the CLI applies --preset to them first).
  static MultiRunOptions from_settings(const Settings& s, TrainOptions train);
};

struct MultiRunSummary {
  std::string output_dir, final_adapter;
  int64_t runs_done = 0, runs_merged = 0;
  std::optional<double> best_heldout_loss;
  bool stopped_early = false;
  nlohmann::json history = nlohmann::json::array();
  nlohmann::json to_json() const;
};

struct MultiRunCallbacks {
  std::function<void(int64_t run_index, const TrainOptions&)> on_run_start;
  TrainCallbacks train;  // passed to every run's Trainer
  std::function<void(const nlohmann::json& decision)> on_decision;
};

MultiRunSummary run_multi(const MultiRunOptions& opt, const MultiRunCallbacks& cb = {});

}  // namespace bp
