// THE settings table (DESIGN.md "Settings"; CONVENTIONS.md "One table, not many lists").
// Every setting backprop reads is one row here: TOML key, environment variable, command-line flag,
// `backprop info --env-vars` and the docs all come from this table. Add a row, never a private flag.
// Columns: key, type, default (text), min, max, enum choices, string rule, flag, secret, help.
#include <limits>

#include "core/settings.h"

namespace bp {

namespace {
using T = SettingType;
using R = StringRule;
constexpr double kNoMin = 0, kNoMax = 0;
constexpr double kI64Max = 9.2e18;
constexpr double kU64Max = 18446744073709551615.0;  // an Int with this max is read as a uint64 (get_uint)

// clang-format off
constexpr SettingSpec kSettings[] = {
  // ---- model ----------------------------------------------------------------------------------
  {"model.path", T::String, "", kNoMin, kNoMax, "", R::Any, "--model", false,
   "The model: a Hugging Face folder (config.json, *.safetensors, tokenizer.json) or a hub name org/name[@revision], taken from the Hugging Face cache or downloaded into it."},
  {"model.offline", T::Bool, "false", kNoMin, kNoMax, "", R::Any, "--offline", false,
   "Never use the network to find --model: a Hugging Face name must be in the local cache (HF_HUB_OFFLINE=1 does the same)."},
  {"model.dtype", T::Enum, "auto", kNoMin, kNoMax, "auto|f32|bf16|f16", R::Any, "--dtype", false,
   "Compute dtype of the frozen base weights; auto = f32 on the CPU, bf16 on a GPU."},
  {"model.base_dtype", T::Enum, "auto", kNoMin, kNoMax, "auto|f32|bf16|q8_0|q4_k", R::Any, "--base-dtype", false,
   "How the frozen base weights (linear projections, embedding, LM head) live in memory in LoRA mode: auto = a GGUF "
   "base keeps its stored types (q8_0, q4_K, q6_K, f16, ...), any other base f32; bf16, q8_0 or q4_k quantize on load "
   "(QLoRA). Rows that are not whole q4_K blocks are held as q5_0 (q8_0: bf16), as llama.cpp does. Norms, LoRA "
   "weights and the optimizer stay f32."},
  {"model.device", T::String, "auto", kNoMin, kNoMax, "", R::Device, "--device", false,
   "Where to train: auto, cpu, cuda or cuda:N. This version trains on the CPU: auto means the CPU, and cuda "
   "stops with DEP_GPU_NOT_AVAILABLE and the reason."},

  // ---- lora -----------------------------------------------------------------------------------
  {"lora.r", T::Int, "16", 1, 4096, "", R::Any, "--lora-r", false,
   "LoRA rank r (lora_A is [r, in], lora_B is [out, r])."},
  {"lora.alpha", T::Float, "32", 1e-6, 1e6, "", R::Any, "--lora-alpha", false,
   "LoRA alpha; the update is scaled by alpha / r (alpha / sqrt(r) with rsLoRA)."},
  {"lora.dropout", T::Float, "0.05", 0, 0.99, "", R::Any, "--lora-dropout", false,
   "Dropout probability on the LoRA input during training."},
  {"lora.target_modules", T::String, "all-linear", kNoMin, kNoMax, "", R::Any, "--target-modules", false,
   "Comma-separated module names to adapt (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj) or all-linear."},
  {"lora.use_rslora", T::Bool, "false", kNoMin, kNoMax, "", R::Any, "--use-rslora", false,
   "Rank-stabilised LoRA: scale by alpha / sqrt(r) instead of alpha / r."},

  // ---- training -------------------------------------------------------------------------------
  {"training.mode", T::Enum, "lora", kNoMin, kNoMax, "lora|full", R::Any, "--mode", false,
   "lora trains adapters on frozen weights; full trains every weight."},
  {"training.preset", T::Enum, "none", kNoMin, kNoMax, "none|fast|balanced|quality|auto", R::Any, "--preset", false,
   "Starting values for settings left at their defaults (explicit flags, TOML and environment win): fast = r 8 on "
   "q/v, lr 3e-4; balanced = r 16 all-linear, lr 2e-4; quality = r 64 all-linear rsLoRA, lr 1e-4, 2 epochs; auto = "
   "rank, alpha, sequence length and learning rate by the model's parameter count. The applied values are printed "
   "and saved in the run's settings.json."},
  {"training.steps", T::Int, "0", 0, kI64Max, "", R::Any, "--steps", false,
   "Optimizer steps to run; 0 = as many as `epochs` passes over the data take."},
  {"training.epochs", T::Float, "1", 0.001, 1e6, "", R::Any, "--epochs", false,
   "Passes over the training data (fractions allowed) when steps is 0."},
  {"training.batch_size", T::Int, "8", 1, 1 << 20, "", R::Any, "--batch-size", false,
   "Sequences per optimizer step (micro_batch_size x grad_accum); OOM recovery keeps it unchanged."},
  {"training.micro_batch_size", T::String, "auto", kNoMin, kNoMax, "", R::AutoOrPositiveInt, "--micro-batch-size", false,
   "Sequences per forward/backward pass: auto (the largest the memory plan fits) or a number."},
  {"training.grad_accum", T::Int, "0", 0, 1 << 20, "", R::Any, "--grad-accum", false,
   "Micro-batches accumulated per optimizer step; 0 = batch_size / micro_batch_size."},
  {"training.lr", T::Float, "0.0002", 0, 10, "", R::Any, "--lr", false,
   "Peak learning rate (AdamW)."},
  {"training.lr_scheduler", T::Enum, "cosine", kNoMin, kNoMax, "cosine|linear|constant", R::Any, "--lr-scheduler", false,
   "Learning-rate schedule after warm-up."},
  {"training.warmup_steps", T::Int, "10", 0, kI64Max, "", R::Any, "--warmup-steps", false,
   "Steps of linear warm-up from 0 to lr."},
  {"training.weight_decay", T::Float, "0", 0, 10, "", R::Any, "--weight-decay", false,
   "AdamW decoupled weight decay."},
  {"training.max_grad_norm", T::Float, "1", 0, 1e6, "", R::Any, "--max-grad-norm", false,
   "Clip the global gradient norm to this value; 0 = no clipping."},
  {"training.max_seq_length", T::Int, "2048", 1, 1 << 24, "", R::Any, "--max-seq-length", false,
   "Longest sequence in tokens; longer samples are truncated (and reported)."},
  {"training.gradient_checkpointing", T::Enum, "auto", kNoMin, kNoMax, "auto|true|false", R::Any,
   "--gradient-checkpointing", false,
   "Recompute activations in backward instead of keeping them (less memory, ~30% more compute); auto = only when "
   "the memory plan says the micro-batch would not fit without it (and as the first OOM recovery)."},
  {"training.seed", T::Int, "42", 0, kU64Max, "", R::Any, "--seed", false,
   "Seed for initialisation, dropout and shuffling; a resumed run continues its RNG state."},
  {"training.eval_every", T::Int, "0", 0, kI64Max, "", R::Any, "--eval-every", false,
   "Evaluate on the held-out split every N steps; 0 = only at the end (when a holdout exists)."},
  {"training.save_every", T::Int, "100", 0, kI64Max, "", R::Any, "--save-every", false,
   "Write a checkpoint every N steps; 0 = only at the end."},
  {"training.keep_checkpoints", T::Int, "3", 0, 1 << 20, "", R::Any, "--keep-checkpoints", false,
   "How many recent checkpoints to keep; 0 = keep all."},
  {"training.output", T::String, "runs", kNoMin, kNoMax, "", R::Any, "--output", false,
   "Folder for runs: <output>/<run id>/ holds checkpoints, logs and the final adapter."},
  {"training.resume", T::String, "", kNoMin, kNoMax, "", R::Any, "--resume", false,
   "Resume from a checkpoint folder, a run id, or latest; empty = start a new run."},
  {"training.max_memory", T::String, "auto", kNoMin, kNoMax, "", R::AutoOrBytes, "--max-memory", false,
   "Memory budget of the training device (e.g. 8G, 512M): auto = the GPU's free memory; on the CPU the smaller of "
   "MemAvailable and the cgroup's room, minus monitor.memory_headroom (no limit with --no-monitor); none = no limit."},
  {"training.vram_gb", T::Float, "0", 0, 1e6, "", R::Any, "--vram-gb", false,
   "Memory size in GiB (2^30 bytes) that `backprop estimate-vram` fits the plan into; 0 = training.max_memory when it is a size, else the GPU's free memory, else this machine's RAM."},
  {"training.threads", T::Int, "0", 0, 4096, "", R::Any, "--threads", false,
   "CPU threads for OpenMP and BLAS; 0 = all cores."},
  {"training.oom_recovery", T::Bool, "true", kNoMin, kNoMax, "", R::Any, "--oom-recovery", false,
   "On out-of-memory, turn gradient checkpointing on (when auto left it off), else halve the micro-batch and "
   "double accumulation; redo the step with the same samples."},
  {"training.nan_guard_max_consecutive", T::Int, "3", 1, 1000000, "", R::Any, "--nan-guard-max-consecutive", false,
   "Skip steps with non-finite loss or gradients; fail after this many in a row."},
  {"training.init_from_config", T::String, "", kNoMin, kNoMax, "", R::Any, "--init-from-config", false,
   "Path to a config.json: start from randomly initialised weights (needs --mode full); tokenizer files are read from that folder."},
  {"training.fault_inject_oom_step", T::Int, "0", 0, kI64Max, "", R::Any, "--fault-inject-oom-step", false,
   "Testing: the first micro-batch of optimizer step N (1-based) runs out of memory; 0 = off."},
  {"training.fault_inject_oom_count", T::Int, "1", 1, 1000, "", R::Any, "--fault-inject-oom-count", false,
   "Testing: how many consecutive attempts of that step run out of memory."},
  {"training.fault_inject_nan_step", T::Int, "0", 0, kI64Max, "", R::Any, "--fault-inject-nan-step", false,
   "Testing: make a gradient of optimizer step N (1-based) NaN; 0 = off."},
  {"training.fault_inject_nan_count", T::Int, "1", 1, 1000000, "", R::Any, "--fault-inject-nan-count", false,
   "Testing: how many consecutive steps from that step get a NaN gradient."},
  {"training.fault_inject_crash_step", T::Int, "0", 0, kI64Max, "", R::Any, "--fault-inject-crash-step", false,
   "Testing: kill the process (SIGKILL) right after optimizer step N and its checkpoint; 0 = off."},
  {"training.fault_inject_crash_at", T::String, "", kNoMin, kNoMax, "", R::Any, "--fault-inject-crash-at", false,
   "Testing: kill the process at a named point inside a checkpoint write (checkpoint:before_manifest, checkpoint:before_rename, checkpoint:after_<file>)."},
  {"training.fault_inject_enospc_after_bytes", T::Int, "-1", -1, kI64Max, "", R::Any, "--fault-inject-enospc-after-bytes", false,
   "Testing: file writes fail with 'no space left on device' after this many more bytes; -1 = off."},

  // ---- data -----------------------------------------------------------------------------------
  {"data.path", T::String, "", kNoMin, kNoMax, "", R::Any, "--data", false,
   "Training data: a JSONL/JSON file of conversations or instructions, or a .txt file."},
  {"data.format", T::Enum, "auto", kNoMin, kNoMax, "auto|sharegpt|openai|alpaca|text|txt", R::Any, "--format", false,
   "Dataset format; auto detects it from the first rows."},
  {"data.eval_path", T::String, "", kNoMin, kNoMax, "", R::Any, "--eval-data", false,
   "A separate held-out file for evaluation (same formats as --data); when set, --holdout is not used."},
  {"data.holdout", T::Float, "0.1", 0, 0.9, "", R::Any, "--holdout", false,
   "Fraction of samples held out for evaluation."},
  {"data.strict", T::Bool, "false", kNoMin, kNoMax, "", R::Any, "--strict", false,
   "Fail on the first bad row instead of skipping it (and reporting it)."},
  {"data.train_on_all", T::Bool, "false", kNoMin, kNoMax, "", R::Any, "--train-on-all", false,
   "Take the loss on every token, not only on assistant replies."},
  {"data.chat_template", T::String, "", kNoMin, kNoMax, "", R::Any, "--chat-template", false,
   "Chat template to train with: empty = the model's own (chat_template.jinja, else tokenizer_config.json; ChatML with "
   "a warning when it has none), a Jinja file, or 'chatml'."},
  {"data.template_max_steps", T::Int, "50000000", 1000, kI64Max, "", R::Any, "", false,
   "Most Jinja steps (statements, expressions, loop iterations) one chat-template render may take."},
  {"data.template_max_bytes", T::Int, "268435456", 1024, kI64Max, "", R::Any, "", false,
   "Largest string (bytes) or list (items) one chat-template render may build, its output included."},
  {"data.max_errors", T::Int, "100", 0, kI64Max, "", R::Any, "--max-errors", false,
   "Training stops before step 1 when more rows than this are bad (skipped); 0 = no limit."},
  {"data.shuffle", T::Bool, "true", kNoMin, kNoMax, "", R::Any, "--shuffle", false,
   "Shuffle samples every epoch (seeded by training.seed)."},

  // ---- export ---------------------------------------------------------------------------------
  {"export.format", T::Enum, "lora", kNoMin, kNoMax, "lora|merged|gguf", R::Any, "--format", false,
   "lora = PEFT adapter folder, merged = HF model with LoRA merged in, gguf = one GGUF file."},
  {"export.quantization", T::Enum, "f16", kNoMin, kNoMax, "f32|f16|bf16|q8_0|q4_0|q4_k_m|q5_k_m|q6_k", R::Any,
   "--quantization", false, "Tensor type of a GGUF export."},
  {"export.output", T::String, "", kNoMin, kNoMax, "", R::Any, "--output", false,
   "Where to write the export; empty = next to the checkpoint it comes from."},
  {"export.ollama", T::Bool, "false", kNoMin, kNoMax, "", R::Any, "--ollama", false,
   "Register the GGUF export with the Ollama server at ollama_host."},
  {"export.ollama_name", T::String, "", kNoMin, kNoMax, "", R::Any, "--ollama-name", false,
   "Model name in Ollama; empty = derived from the run."},
  {"export.ollama_host", T::String, "http://127.0.0.1:11434", kNoMin, kNoMax, "", R::Any, "--ollama-host", false,
   "Address of the Ollama server."},
  {"export.ollama_retries", T::Int, "4", 0, 20, "", R::Any, "--ollama-retries", false,
   "Retries of a failed request to the Ollama server (connection refused, timeout, 5xx), with exponential "
   "backoff from 0.5 s; 0 = fail at the first error."},

  // ---- monitor --------------------------------------------------------------------------------
  {"monitor.enabled", T::Bool, "true", kNoMin, kNoMax, "", R::Any, "--monitor", false,
   "Safety monitor in every training run: memory (MemAvailable, cgroup v2), CPU and GPU temperatures, disk space "
   "before checkpoints; --no-monitor turns it off."},
  {"monitor.poll_period_s", T::Float, "5", 0, 3600, "", R::Any, "", false,
   "Seconds between readings (a background thread); also the wait between readings while paused. 0 = read at "
   "every micro-batch boundary on the training thread."},
  {"monitor.temperature_warning_c", T::Float, "80", 1, 200, "", R::Any, "", false,
   "Warning level in degrees Celsius: logged; a paused run resumes once every sensor is below it."},
  {"monitor.temperature_critical_c", T::Float, "90", 1, 200, "", R::Any, "", false,
   "Critical level (or threshold_margin_c under the card's slowdown threshold): training pauses between "
   "micro-batches until it cools down (RUNTIME_GPU_TEMPERATURE_CRITICAL)."},
  {"monitor.temperature_emergency_c", T::Float, "95", 1, 200, "", R::Any, "", false,
   "Emergency level (or threshold_margin_c under the card's shutdown threshold): the last finished step is saved "
   "and training stops (RUNTIME_TEMPERATURE_EMERGENCY)."},
  {"monitor.threshold_margin_c", T::Float, "3", 0, 50, "", R::Any, "", false,
   "Degrees under a sensor's own slowdown / shutdown threshold (NVML, hwmon temp*_max / temp*_crit) at which "
   "the critical / emergency level is reached, when that is lower than the fixed levels."},
  {"monitor.cooldown_s", T::Float, "30", 0, 86400, "", R::Any, "", false,
   "A paused run resumes after every sensor has stayed below the warning level this many seconds."},
  {"monitor.max_pause_s", T::Float, "1800", 0, 1e7, "", R::Any, "", false,
   "Longest pause; when it is still too hot after this, the last finished step is saved and training stops "
   "(RUNTIME_GPU_TEMPERATURE_CRITICAL)."},
  {"monitor.memory_headroom", T::String, "auto", kNoMin, kNoMax, "", R::AutoOrBytes, "", false,
   "Memory kept free by --max-memory auto on the CPU (budget = the smaller of MemAvailable and the cgroup's "
   "memory.max - memory.current, minus this): auto = 10% of that, none = 0."},
  {"monitor.memory_low", T::String, "auto", kNoMin, kNoMax, "", R::AutoOrBytes, "", false,
   "When the memory available to the run falls under this during training, it turns gradient checkpointing on, "
   "then halves the micro-batch (same samples, same batch): auto = half the headroom, none = off."},
  {"monitor.disk_warn_checkpoints", T::Int, "3", 0, 1000000, "", R::Any, "", false,
   "Warn when the output folder's free space holds fewer than this many checkpoints; with less than one, "
   "STATE_DISK_FULL before writing (the earlier checkpoint stays intact)."},
  {"monitor.system_root", T::String, "", kNoMin, kNoMax, "", R::Any, "", false,
   "Testing: read /proc and /sys under this folder instead of / (a fake meminfo, cgroup and hwmon tree)."},
  {"monitor.nvml_library", T::String, "libnvidia-ml.so.1", kNoMin, kNoMax, "", R::Any, "", false,
   "NVML library loaded with dlopen for GPU temperatures; empty = do not watch GPUs."},
  // ---- multirun -------------------------------------------------------------------------------
  {"multirun.runs", T::Int, "3", 1, 10000, "", R::Any, "--runs", false,
   "multi-run: how many runs, each on a fresh window of the shuffled training pool."},
  {"multirun.samples", T::Int, "0", 0, kI64Max, "", R::Any, "--samples", false,
   "multi-run: training rows per run (K); 0 = the pool divided by --runs."},
  {"multirun.replay", T::Float, "0", 0, 1, "", R::Any, "--replay", false,
   "multi-run: fraction of K added to each run from earlier runs' rows (replay against forgetting)."},
  {"multirun.lr_decay", T::Float, "1", 0.001, 1, "", R::Any, "--lr-decay", false,
   "multi-run: run i trains at lr x lr_decay^(i-1)."},
  {"multirun.merge_mode", T::Enum, "slao", kNoMin, kNoMax, "slao|linear|ties|dare", R::Any, "--merge-mode", false,
   "multi-run: how each run's adapter joins the merge (docs: train/adapter_merge.h): slao = A replaced, B blended "
   "by clamp(1/sqrt(i), 0.1, 1); linear = running mean; ties = trim, elect sign, disjoint mean; dare = drop and "
   "rescale the B update."},
  {"multirun.ties_trim", T::Float, "0.2", 0, 0.99, "", R::Any, "--ties-trim", false,
   "multi-run, ties: fraction of the smallest-magnitude entries of each adapter zeroed before merging."},
  {"multirun.dare_drop", T::Float, "0.5", 0, 0.99, "", R::Any, "--dare-drop", false,
   "multi-run, dare: probability of dropping each entry of the B update (the rest scaled by 1/(1-p))."},
  {"multirun.drift_threshold", T::Float, "-1", -1, 1, "", R::Any, "--drift-threshold", false,
   "multi-run drift gate: a run whose B has a cosine similarity below this to the merged B is kept as a side "
   "branch, not merged; -1 = off."},
  {"multirun.eval_tolerance", T::Float, "0", 0, 1e6, "", R::Any, "--eval-tolerance", false,
   "multi-run eval gate: a merge that raises the held-out loss by more than this is undone "
   "(RUNTIME_EVAL_GATE_REGRESSED) and the next run starts from the previous merge."},
  {"multirun.patience", T::Int, "0", 0, 10000, "", R::Any, "--patience", false,
   "multi-run early stopping: stop after this many runs in a row without a better held-out loss; 0 = off."},
  {"multirun.validation_split", T::Float, "0.1", 0, 0.9, "", R::Any, "--validation-split", false,
   "multi-run: fraction of the data held out first (never trained on) for the gates and early stopping; "
   "0 = none (then the eval gate and early stopping need --eval-data)."},
  {"multirun.fault_inject", T::String, "", kNoMin, kNoMax, "", R::Any, "--fault-inject-multirun", false,
   "Testing: crash_merge:<i> kills the process (SIGKILL) after writing merge i, before it is committed; "
   "nan_merge:<i> makes merge i non-finite."},
  // ---- ui (backprop ui, the web dashboard) ------------------------------------------------------
  {"ui.host", T::String, "127.0.0.1", kNoMin, kNoMax, "", R::Any, "--host", false,
   "Address the web UI listens on. Anything but loopback (127.0.0.1, ::1, localhost) needs --auth or --auth-file."},
  {"ui.port", T::Int, "7862", 1, 65535, "", R::Any, "--port", false, "TCP port of the web UI."},
  {"ui.auth", T::String, "", kNoMin, kNoMax, "", R::UserPass, "--auth", true,
   "user:password required by every page, asset, event stream and action (login page or HTTP basic auth)."},
  {"ui.auth_file", T::String, "", kNoMin, kNoMax, "", R::Any, "--auth-file", false,
   "File of user:pbkdf2-sha256$iterations$salt$hash lines (mode 0600), written by `backprop ui --set-password`."},
  {"ui.runs", T::String, "runs", kNoMin, kNoMax, "", R::Any, "--runs", false,
   "Runs folder the UI lists, starts runs in and exports from (training.output of its runs)."},
  {"ui.data_dir", T::String, "datasets", kNoMin, kNoMax, "", R::Any, "--data-dir", false,
   "Dataset folder: uploads are written here and datasets are picked from here. The UI reads and writes no "
   "other files than these two folders."},
  {"ui.allowed_hosts", T::String, "", kNoMin, kNoMax, "", R::Any, "--allowed-hosts", false,
   "Extra Host names the UI answers to (comma-separated), besides localhost, IP addresses and --host."},
  {"ui.max_upload_mb", T::Int, "256", 1, 1 << 20, "", R::Any, "--max-upload-mb", false,
   "Largest dataset upload accepted, in MiB."},
  {"ui.max_login_failures", T::Int, "5", 1, 1000, "", R::Any, "--max-login-failures", false,
   "Failed logins from one address before its logins are refused for 5 minutes."},

  // ---- security -------------------------------------------------------------------------------
  {"security.redact_secrets", T::Bool, "true", kNoMin, kNoMax, "", R::Any, "--redact-secrets", false,
   "Replace tokens and passwords with *** in every log line and printed message."},

  // ---- limits ---------------------------------------------------------------------------------
  {"limits.max_config_bytes", T::String, "64M", kNoMin, kNoMax, "", R::Bytes, "", false,
   "Largest settings/config file read (TOML --config, config.json, generation_config.json, adapter_config.json, "
   "safetensors index); a bigger one is INPUT_FILE_TOO_LARGE. The environment's value also caps the --config file."},
  {"limits.max_tokenizer_bytes", T::String, "1G", kNoMin, kNoMax, "", R::Bytes, "", false,
   "Largest tokenizer file read (tokenizer.json, tokenizer_config.json, chat_template.jinja)."},
  {"limits.max_dataset_bytes", T::String, "64G", kNoMin, kNoMax, "", R::Bytes, "", false,
   "Largest dataset file read (--data, --eval-data; datasets are read into memory whole)."},
  // ---- runtime --------------------------------------------------------------------------------
  {"runtime.cpu_kernels", T::Enum, "auto", kNoMin, kNoMax, "auto|generic|avx2|avx512", R::Any, "--cpu-kernels", false,
   "Instruction-set variant of the hand-vectorised CPU kernels (attention softmax, cross-entropy, SwiGLU, AdamW, "
   "f16 conversion): auto = the best this CPU runs (from CPUID); a variant the CPU lacks stops with "
   "DEP_CPU_KERNELS_UNSUPPORTED. `backprop info` names the one in use."},

  // ---- logging --------------------------------------------------------------------------------
  {"logging.level", T::Enum, "info", kNoMin, kNoMax, "trace|debug|info|warn|error|off", R::Any, "--log-level", false,
   "Least severe log level shown and written."},
  {"logging.format", T::Enum, "console", kNoMin, kNoMax, "console|json", R::Any, "--log-format", false,
   "Console log lines for people (console) or as JSON lines (json)."},
  {"logging.file", T::String, "", kNoMin, kNoMax, "", R::Any, "--log-file", false,
   "Also write the log as JSON lines (the run id on every record) to this file."},
};
// clang-format on

constexpr const char* kSections[] = {"model",    "lora", "training", "data",    "export", "monitor",
                                     "multirun", "ui",   "security", "runtime", "limits", "logging"};
}  // namespace

std::span<const SettingSpec> settings_registry() {
  return kSettings;
}
std::span<const char* const> setting_sections() {
  return kSections;
}

}  // namespace bp
