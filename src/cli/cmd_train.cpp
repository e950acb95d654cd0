// `backprop train`: fine-tune with LoRA or all weights (train/trainer.h does the work).
// Every flag is a setting (settings table), so TOML and BACKPROPAGATE_* variables work too.
// Prints a progress bar on stderr, a final summary on stdout (or JSON with --json).
#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "cli/model_ref.h"
#include "cli/progress.h"
#include "cli/train_quickstart.h"
#include "core/log.h"
#include "core/settings.h"
#include "train/trainer.h"

namespace {

int run_train() {
  using namespace bp;
  const Settings& st = cli::settings();
  if (cli::is_quickstart(st)) return cli::run_quickstart(st, cli::global_options().json);
  TrainOptions o = TrainOptions::from_settings(st);
  const std::string reference = o.model_dir;
  o.model_dir = cli::resolve_model(reference);
  // A hub name stays the adapter's base (portable to transformers/PEFT); the cache path is local.
  if (o.model_dir != reference && hub::parse_hub_ref(reference)) o.base_model_name = reference;
  bool json = cli::global_options().json;
  cli::ProgressBar bar(!json && !o.quiet);
  TrainCallbacks cb;
  cb.on_step = [&](const StepRecord& r, const TrainSummary& s, int64_t total) { bar.update(r, s, total); };
  cb.on_event = [&](const std::string&, const std::string&) { bar.clear_line(); };
  Trainer trainer(o, cb);
  TrainSummary sum = trainer.run();
  bar.finish();
  if (json) {
    std::cout << sum.to_json().dump(2) << std::endl;
  } else {
    std::cout << cli::format_train_summary(sum, o);
  }
  return 0;
}

bp::cli::RunFn setup_train(CLI::App& sub) {
  bp::cli::bind_settings(sub, {"model.path",
                               "model.offline",
                               "data.path",
                               "training.output",
                               "training.steps",
                               "training.epochs",
                               "training.batch_size",
                               "training.micro_batch_size",
                               "training.grad_accum",
                               "training.lr",
                               "training.lr_scheduler",
                               "training.warmup_steps",
                               "training.weight_decay",
                               "training.max_grad_norm",
                               "training.max_seq_length",
                               "training.mode",
                               "lora.r",
                               "lora.alpha",
                               "lora.dropout",
                               "lora.target_modules",
                               "lora.use_rslora",
                               "training.gradient_checkpointing",
                               "training.seed",
                               "training.eval_every",
                               "data.holdout",
                               "data.eval_path",
                               "data.shuffle",
                               "data.max_errors",
                               "model.device",
                               "training.save_every",
                               "training.keep_checkpoints",
                               "training.resume",
                               "training.max_memory",
                               "training.threads",
                               "training.oom_recovery",
                               "training.init_from_config",
                               "data.format",
                               "data.strict",
                               "data.train_on_all",
                               "training.nan_guard_max_consecutive",
                               "training.fault_inject_oom_step",
                               "training.fault_inject_oom_count",
                               "training.fault_inject_nan_step",
                               "training.fault_inject_nan_count",
                               "training.fault_inject_crash_step",
                               "training.fault_inject_crash_at",
                               "training.fault_inject_enospc_after_bytes"});
  return run_train;
}

}  // namespace

BP_REGISTER_COMMAND("train", "Fine-tune a model (LoRA or full) on a JSONL/JSON/TXT dataset", setup_train);
