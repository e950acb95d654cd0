// `backprop train`: fine-tune with LoRA or all weights (train/trainer.h does the work).
// Every flag is a setting (settings table), so TOML and BACKPROPAGATE_* variables work too.
// Prints a progress bar on stderr, a final summary on stdout (or JSON with --json).
#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "cli/model_ref.h"
#include "cli/progress.h"
#include "cli/train_flags.h"
#include "cli/train_quickstart.h"
#include "core/log.h"
#include "core/settings.h"
#include "hub/hf_cache.h"
#include "train/presets.h"
#include "train/trainer.h"

namespace {

int run_train() {
  using namespace bp;
  if (cli::is_quickstart(cli::settings())) return cli::run_quickstart(cli::settings(), cli::global_options().json);
  bool json = cli::global_options().json;
  TrainOptions o = cli::train_options_with_preset(json);
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

}  // namespace

namespace bp::cli {
void bind_train_settings(CLI::App& sub) {
  bind_settings(sub, {"model.path",
                      "training.preset",
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
                      "model.base_dtype",
                      "training.save_every",
                      "training.keep_checkpoints",
                      "training.resume",
                      "training.max_memory",
                      "training.threads",
                      "training.oom_recovery",
                      "monitor.enabled",
                      "model.offline",
                      "training.init_from_config",
                      "data.format",
                      "data.strict",
                      "data.train_on_all",
                      "data.chat_template",
                      "training.nan_guard_max_consecutive",
                      "training.fault_inject_oom_step",
                      "training.fault_inject_oom_count",
                      "training.fault_inject_nan_step",
                      "training.fault_inject_nan_count",
                      "training.fault_inject_crash_step",
                      "training.fault_inject_crash_at",
                      "training.fault_inject_enospc_after_bytes"});
  // Fault injection is for tests: still settings and flags (docs/settings.md), listed apart from the
  // training options in `--help`. (Hiding them would break the rule that every flag of the
  // settings table shows in some command's help, tests/cli/cli_test.cpp.)
  for (CLI::Option* opt : sub.get_options())
    for (const std::string& name : opt->get_lnames())
      if (name.rfind("fault-inject-", 0) == 0) opt->group("Testing (fault injection, for tests only)");
}

TrainOptions train_options_with_preset(bool json) {
  Settings st = settings();  // a copy: the preset fills the settings left at their defaults
  // --model as a folder, a hub name (cache, then download), a GGUF file or ollama:NAME.
  const std::string reference = st.get_string("model.path");
  const std::string model_dir = reference.empty() ? reference : resolve_model(reference);
  PresetApplied preset = apply_preset(st, model_dir);
  if (!preset.describe().empty()) (json ? std::cerr : std::cout) << preset.describe() << "\n";
  TrainOptions o = TrainOptions::from_settings(st);
  o.model_dir = model_dir;
  // A hub name stays the adapter's base (portable to transformers/PEFT); the cache path is local.
  if (model_dir != reference && hub::parse_hub_ref(reference)) o.base_model_name = reference;
  o.resolved_settings["preset"] = preset.to_json();
  return o;
}
}  // namespace bp::cli

namespace {
bp::cli::RunFn setup_train(CLI::App& sub) {
  bp::cli::bind_train_settings(sub);
  return run_train;
}
}  // namespace

BP_REGISTER_COMMAND("train", "Fine-tune a model (LoRA or full) on a JSONL/JSON/TXT dataset", setup_train);
