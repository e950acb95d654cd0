// The Trainer's private state and the steps of a run (Trainer::run_impl in trainer.cpp). Only the
// trainer's own files include this: trainer.cpp (setup and the step) and trainer_checkpoints.cpp
// (the run folder: open, resume, save, finish).
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/collective.h"
#include "core/record_file.h"
#include "model/lora.h"
#include "text/data_cursor.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/eval_metrics.h"
#include "train/grad_overlap.h"
#include "train/oom_recovery.h"
#include "train/optimizer.h"
#include "train/preference.h"
#include "train/safety_monitor.h"
#include "train/train_data.h"
#include "train/trainer.h"

namespace bp {

// Saves the template the samples were rendered with beside the weights in `dir` (issue 15), so
// `backprop export` ships exactly it (trainer_checkpoints.cpp).
void record_chat_template(const std::string& dir, const TrainData& data);

// An example's reference log-probabilities (preference methods with a reference): chosen,
// rejected (pairs) and KTO's mismatched KL sequence; f32 as they are kept in checkpoints.
// One GPU per rank of a data-parallel CUDA run (trainer_distributed.cpp).
void assign_rank_gpu(const std::string& device);

struct RefLogps {
  float c = 0, r = 0, kl = 0;
};

struct Trainer::State {
  TrainOptions opt;
  TrainCallbacks cb;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<LoraAdapter> adapter;
  TrainData data;
  AdamW adamw;
  std::unique_ptr<DataCursor> cursor;
  std::unique_ptr<OomRecovery> oom;
  std::unique_ptr<CheckpointStore> checkpoints;
  std::unique_ptr<SafetyMonitor> safety;
  TrainSummary summary;
  int64_t total_steps = 0;
  int64_t step = 0;  // optimizer steps done
  std::string best_checkpoint;
  RecordFile metrics;  // metrics.jsonl: a failed write warns once, is retried, and a loss is counted
  int consecutive_nonfinite = 0;
  int64_t fault_oom_left = 0;
  Device device;               // where the model trains (--device)
  Allocator* alloc = nullptr;  // that device's allocator
  std::string tok_dir;         // tokenizer files (copied next to a full model)
  std::optional<CheckpointInfo> resume_from;
  // The run folder is written from start_run_files on (a new run: at once; a resumed one: after
  // check_resume), so a refused resume leaves it as it was. Records made before wait here.
  bool run_files_started = false;
  std::vector<nlohmann::json> pending_records;
  std::vector<TrainableParam> params;
  std::vector<Tensor*> grads;
  std::chrono::steady_clock::time_point t0;
  // Data parallelism (trainer_distributed.cpp): the ranks' collective (one rank: in-process), and
  // whether this rank writes the run folder (rank 0).
  Collective* comm = nullptr;
  std::unique_ptr<Collective> device_comm;  // NCCL over the process's MPI collective (CUDA runs)
  bool writer = true;
  std::unique_ptr<GradientOverlap> overlap;  // training.overlap_communication (trainer_distributed.cpp)
  void start_overlap();
  CommTotals step_comm_start;  // the collectives' totals when the step began (log_step)
  std::chrono::steady_clock::time_point step_start;

  // Setup, in order (Trainer::run_impl).
  void open_run();
  void start_run_files();     // status.json running, metrics.jsonl (trimmed on resume), settings.json
  void write_run_settings();  // settings.json (and the chat template once the data is read)
  void load_data();
  void build_model();
  void warn_beyond_context();  // samples longer than max_position_embeddings (build_model)
  DType matmul_dtype() const;  // training.matmul_dtype resolved for this device and mode
  void plan_memory();
  void check_resume();  // every refusal of the resume, before start_run_files
  void resume();
  // The step and what runs on its schedule.
  struct Batch {
    CursorState start;                   // the cursor before the step: a monitor stop saves the last finished step
    std::vector<int64_t> ids;            // the step's sequences (the global batch)
    std::vector<int64_t> local_ids;      // this rank's share of them (all of them in one process)
    int64_t n_labels = 0, n_tokens = 0;  // of the global batch
  };
  Batch next_batch();
  double forward_backward(const Batch& batch);
  void save_last_finished_step(const Batch& batch);
  double aux_loss_sum = 0;  // Mixture-of-Experts: the step's micro-batches' load-balancing losses
  int64_t aux_micro_batches = 0;
  void report_oom(const OomEvent& ev);
  bool clip_and_check(const Batch& batch, StepRecord& rec);
  void update(const StepRecord& rec);
  void log_step(const Batch& batch, const StepRecord& rec);
  void after_step();
  std::optional<double> evaluate();
  // --eval-metric (SFT): the metrics, the held-out examples they answer (load_data), and the values of
  // the last evaluation as eval_<label> (its record and the summary carry them).
  std::vector<EvalMetric> task_metrics;
  std::vector<TaskExample> task_examples;
  nlohmann::json task_values = nlohmann::json::object();
  void parse_task_metrics();    // load_data: the setting, against the method, before the data is read
  void prepare_task_metrics();  // and the examples, against the data
  void evaluate_task_metrics();
  const nlohmann::json& eval_metrics_json() const;  // the preference metrics or task_values
  std::string save_checkpoint(std::optional<double> eval_loss);
  void finish();
  void count_lost_records();  // into the summary: metrics.jsonl's and the log files' (finish)
  void save_final_artifact();
  // Preference methods (trainer_preference.cpp).
  struct PreferenceState {
    std::vector<RefLogps> train_ref, eval_ref;  // precomputed reference: by position in data.train / data.eval
    PreferenceMetrics step_metrics;             // of the last step (TRL's names in metrics.jsonl)
    nlohmann::json eval_metrics;                // of the last evaluate(): eval_rewards/..., eval_logps/...
  } pref;
  struct PreferenceStep {
    StepNorms norms;
    double loss = 0;
    PreferenceMetrics metrics;
  };
  bool reference_precomputed() const;
  std::vector<double> forward_logps(const std::vector<Sample>& seqs, bool adapter_off);
  std::vector<double> reference_logps(const std::vector<Sample>& seqs);
  std::vector<RefLogps> references(const std::vector<Sample>& pool, const std::vector<int64_t>& idx, bool eval);
  std::vector<RefLogps> computed_references(const std::vector<Sample>& pool, const std::vector<int64_t>& idx);
  std::vector<Sample> kl_samples(const std::vector<Sample>& pool, const std::vector<int64_t>& idx) const;
  double kto_z(const std::vector<Sample>& pool, const std::vector<int64_t>& idx, bool eval, bool across_ranks);
  void precompute_reference();
  void write_reference(const std::string& path) const;
  void load_reference(const std::string& checkpoint_dir);
  std::vector<std::pair<std::string, std::function<void(const std::string&)>>> reference_files() const;
  PreferenceStep begin_preference_step(const Batch& batch);
  std::vector<float> preference_terms(const std::vector<const Sample*>& examples, const std::vector<double>& logp,
                                      const std::vector<RefLogps>& refs, const std::vector<int64_t>& counts,
                                      PreferenceStep& ps);
  void preference_micro_batch(const std::vector<int64_t>& idx, PreferenceStep& ps, uint64_t dropout_seed);
  std::optional<double> preference_evaluate();
  // An "eval" record of metrics.jsonl, with the preference metrics of that evaluation.
  nlohmann::json eval_record(int64_t at_step, double eval_loss) const;

  // Data parallelism (trainer_distributed.cpp).
  void start_distributed();
  void init_optimizer();
  std::string shared_run_id(const std::string& resumed_id) const;
  std::vector<int64_t> local_share(const std::vector<int64_t>& ids) const;
  int64_t local_batch_size() const;
  void check_ranks_agree();
  double forward_backward_all_ranks(const Batch& batch);
  double gradient_norm();
  void mark_run_of_lost_writer(const Error& lost);
  void merge_preference_metrics();
  bool on_any_rank(bool value);

  // Fault injection for tests (the fault_* options), at these points of the loop only.
  enum class FaultPoint { Start, MicroBatch, Backward, Eval, Checkpointed };
  void inject_fault(FaultPoint where);

  void event(const std::string& level, const std::string& msg) {
    if (level == "warn")
      spdlog::warn("{}", msg);
    else if (level == "error")
      spdlog::error("{}", msg);
    else
      spdlog::info("{}", msg);
    if (cb.on_event) cb.on_event(level, msg);
    record({{"type", "event"}, {"level", level}, {"message", msg}});
  }
  void record(nlohmann::json j) {
    j["run_id"] = summary.run_id;
    // Wall-clock seconds since the epoch: rates (tokens/s in `backprop ui`) come from the gaps.
    j["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    if (cb.on_record) cb.on_record(j, total_steps);
    if (metrics.is_open()) {
      metrics.write(j.dump() + "\n");
    } else if (!run_files_started && writer) {
      pending_records.push_back(std::move(j));
    }
  }
};

}  // namespace bp
