// TrainOptions: every knob of a training run, filled from the settings table by from_settings
// (train_options.cpp). Its own header so the data, plan and option code need not see the Trainer.
// Which member a setting fills is the last column of its row in core/settings_registry.inc
// (BP_FILLS(member)): a new training setting is that row plus the member here, nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/lora.h"
#include "model/transformer.h"
#include "train/lr_schedule.h"
#include "train/preference.h"
#include "train/safety_monitor.h"

namespace bp {

class Settings;

struct TrainOptions {
  std::string model_dir;
  std::string init_from_config;  // full mode from scratch: a config.json (weights random)
  std::string tokenizer_dir;     // defaults to model_dir (or the config's folder)
  std::string base_model_name;   // adapter_config's base_model_name_or_path when not model_dir (a hub name)
  std::string data_path;
  std::string data_format = "auto";
  std::string data_columns;          // --columns: the file's names for the formats' keys (text/dataset.h ColumnMap)
  std::string eval_data_path;        // a separate held-out file; replaces the --holdout split
  std::string output_root = "runs";  // runs folder: a new run writes to <output_root>/<run id>
  std::string output_dir;            // set explicitly (tests) to write exactly there
  std::string resume;                // "" | "latest" | run id | path
  std::string init_adapter;          // LoRA: start from this PEFT adapter folder instead of A random, B zero
  bool eval_only = false;            // set up, evaluate the held-out set once, return (multi-run's merge gate)
  bool refinish_finished = false;    // resuming a finished run at its last step finishes it again (multi-run's
                                     // uncommitted run) instead of refusing (CONFIG_RESUME_MISMATCH)
  std::string device = "auto";       // auto | cpu | cuda[:0] (trainer.cpp training_device)
  std::string base_dtype = "f32";    // model.base_dtype: auto | f32 | bf16 | q8_0 | q4_k (model/held_weights.h)
  bool shuffle = true;               // a new sample order each epoch (seeded); false = file order
  int64_t max_bad_rows = 100;        // more skipped (bad) rows than this stop the run; 0 = no limit
  int64_t steps = 0;                 // 0 -> from epochs (total_optimizer_steps)
  double epochs = 1.0;               // passes over the data; fractions allowed (0.5 = half the steps)
  int64_t batch_size = 8;            // sequences per optimizer step
  int64_t micro_batch_size = 0;      // 0 = auto (memory plan)
  int64_t grad_accum = 0;            // 0 = derived
  double lr = 2e-4;
  LrScheduler lr_scheduler = LrScheduler::Cosine;
  int64_t warmup_steps = 0;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;          // 0 = no clipping
  double router_aux_loss_coef = -1.0;  // MoE load-balancing loss; < 0 = config.json's, 0 = off
  int64_t max_seq_length = 512;
  TrainMode mode = TrainMode::Lora;
  TrainMethod method = TrainMethod::Sft;  // training.method
  PreferenceOptions pref;                 // the preference methods' settings (train/preference.h)
  LoraConfig lora;
  std::string matmul_dtype = "auto";           // training.matmul_dtype: auto | f32 | bf16 (full mode's GEMM copies)
  std::optional<bool> gradient_checkpointing;  // empty = auto: off when the memory plan says it fits
  std::optional<bool> shard_optimizer;         // ZeRO-1; empty = auto: on when more than one rank trains
  std::optional<bool> overlap_communication;   // the gradients reduced under the backward; empty = auto
  int optimizer_shards = 1;  // set by the trainer: ranks AdamW's state is split over (the memory plan counts 1/N)
  uint64_t seed = 42;
  int64_t eval_every = 0;             // 0 = only at the end
  std::string eval_metrics;           // --eval-metric: task metrics of each evaluation (train/eval_metrics.h)
  int64_t eval_metric_examples = 50;  // held-out rows they answer
  int64_t eval_max_new_tokens = 64;   // greedy answer length
  double holdout = 0.1;
  int64_t save_every = 0;  // 0 = only at the end
  int keep_checkpoints = 2;
  size_t max_memory_bytes = SIZE_MAX;
  bool max_memory_auto = false;  // --max-memory auto: the safety monitor's CPU budget (when it is on)
  MonitorOptions monitor;        // [monitor] settings (off unless from_settings or a test turns it on)
  int threads = 0;
  // Data-parallel runs (core/collective.h): auto | mpi | single, the MPI plugin's path ("" = beside the
  // binary) and how long a barrier waits for every rank.
  std::string distributed = "auto";
  std::string mpi_library;
  std::string nccl_library;  // training.nccl_library: "" search, a path, or "none"
  double distributed_timeout_s = 600;
  bool oom_recovery = true;
  int nan_max_consecutive = 3;
  bool strict = false;
  bool train_on_all = false;
  std::string chat_template;                // --chat-template: "" = the model's own, a file, or "chatml"
  std::string tools_path;                   // --tools: default tool definitions of conversation rows
  std::string template_kwargs;              // --template-kwargs: a JSON object ("" = none)
  std::string reasoning = "keep";           // --reasoning keep|drop
  std::string tool_arguments = "object";    // --tool-arguments object|string
  int64_t template_max_steps = 50'000'000;  // chat-template render budget (jinja::RenderLimits)
  int64_t template_max_bytes = 256 << 20;
  bool quiet = false;                // no progress bar (tests)
  nlohmann::json resolved_settings;  // written to <run>/settings.json (the CLI passes every setting)
  // Fault injection (tests): OOM at the first micro-batch of this step; NaN gradient at steps.
  int64_t fault_oom_step = -1;
  int64_t fault_oom_repeat = 1;  // how many consecutive attempts of that step fail
  std::vector<int64_t> fault_nan_steps;
  int64_t fault_eval_throw_at = -1;               // throw inside the eval after this step (tests)
  int64_t fault_crash_after_step = 0;             // SIGKILL self after this step (and its checkpoint); 0 = off
  std::string fault_crash_at;                     // io_faults().crash_at for checkpoint writes
  int64_t fault_enospc_after_bytes = -1;          // io_faults().enospc_after_bytes
  int64_t fault_records_enospc_after_bytes = -1;  // record_write_faults() (core/record_file.h)
  int64_t fault_records_failing_writes = 0;
  int64_t stop_after_step_for_tests = 0;  // behave as if SIGINT arrived during this step
  int fault_rank = -1;                    // the OOM, NaN and hang faults on this rank only (-1 = every rank)
  int64_t fault_hang_after_step = 0;      // wait for a signal after this step (and its checkpoint); 0 = off
  int64_t fault_layer_delay_ms = 0;       // sleep after each layer's backward (the overlap's tests); 0 = off

  // Every row's fill (core/settings_registry.inc), then the checks that span settings (batch size
  // vs micro-batch x accumulation, a model and data named, LoRA and monitor values).
  static TrainOptions from_settings(const Settings& s);
  bool operator==(const TrainOptions&) const = default;
};

// training.reference for this run: auto becomes adapter-off for a LoRA run with a new adapter,
// precomputed otherwise (full fine-tuning, --init-adapter: the reference is the starting model);
// an explicit adapter-off that cannot be that throws CONFIG_INVALID_SETTING. The trainer calls it
// at the start of a run (multi-run sets init_adapter after from_settings).
ReferenceSource resolve_reference(const TrainOptions& o);

// What `train` does with a setting: the last column of its row in core/settings_registry.inc.
enum class TrainUse {
  Unmarked,       // no training column: a section train does not read (a training section's row must say)
  NotTaken,       // BP_NOT_FOR_TRAIN: another command's setting (estimate-vram)
  Fills,          // BP_FILLS / BP_FILLS_WITH: fills a TrainOptions member
  ReadByCommand,  // BP_READ_BY_TRAIN_COMMAND: the train command reads it before TrainOptions
};
TrainUse train_use(std::string_view key);
// Does `train` bind this setting's flag (Fills or ReadByCommand)?
bool train_takes_setting(std::string_view key);
// Runs the fills of the rows whose key starts with `prefix` ("" = every row); no cross-setting checks.
void fill_train_options(TrainOptions& o, const Settings& s, std::string_view prefix = "");

// The optimizer steps a run takes: `steps` when set, else ceil(epochs x steps per epoch), where an
// epoch is ceil(train_samples / batch_size) steps (Hugging Face Trainer's num_train_epochs: 0.5 of
// a 4-step epoch is 2 steps, 1.5 is 6); at least 1.
int64_t total_optimizer_steps(const TrainOptions& o, int64_t train_samples);

// training.matmul_dtype ("auto", "f32" or "bf16") resolved for a run of `mode` on `device`: BF16 =
// full fine-tuning's bf16 GEMM copies, which auto picks on a CUDA card with bf16 tensor cores
// (f16_card false) and never elsewhere; F32 otherwise. bf16 asked on an f16 card (no bf16 tensor
// cores, and its f16 path checks a weight's range once, for frozen weights) is CONFIG_INVALID_SETTING
// naming `device_name`. One function for `train` and `estimate-vram`.
DType resolve_matmul_dtype(std::string_view setting, TrainMode mode, DeviceType device, bool f16_card,
                           const std::string& device_name);

}  // namespace bp
