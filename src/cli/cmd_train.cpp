// `backprop train`: fine-tune with LoRA or all weights (train/trainer.h does the work).
// Every flag is a setting (settings table), so TOML and BACKPROPAGATE_* variables work too.
// Prints a progress bar on stderr, a final summary on stdout (or JSON with --json). Exit 3 (partial
// success) when the run finished but some of its records could not be written (records_lost).
#include <iostream>
#include <string>

#include "cli/command.h"
#include "cli/model_ref.h"
#include "cli/mpirun_launcher.h"
#include "cli/progress.h"
#include "cli/train_flags.h"
#include "cli/train_quickstart.h"
#include "core/collective.h"
#include "core/log.h"
#include "core/settings.h"
#include "hub/hf_cache.h"
#include "train/presets.h"
#include "train/resume_settings.h"
#include "train/trainer.h"

namespace {

int run_train() {
  using namespace bp;
  if (cli::is_quickstart(cli::settings())) return cli::run_quickstart(cli::settings(), cli::global_options().json);
  const LaunchInfo launch = launch_from_environment();
  const int64_t nproc = cli::settings().get_int("training.nproc");
  if (nproc > 1 && launch.launcher.empty()) return cli::run_under_mpirun(nproc);
  // Ranks other than 0 of a data-parallel run: no progress bar and no summary (rank 0 speaks for the
  // run; their console shows warnings and errors only, their --log-file is FILE.rank<r>: core/log.h).
  const bool quiet_rank = launch.rank > 0;
  bool json = cli::global_options().json;
  TrainOptions o = cli::train_options_with_preset(json);
  cli::ProgressBar bar(!json && !o.quiet && !quiet_rank);
  Trainer trainer(o, bar.callbacks());
  TrainSummary sum = trainer.run();
  bar.finish();
  finalize_process_collective();  // every rank finished the run: MPI ends cleanly
  if (quiet_rank) return sum.records_lost > 0 ? 3 : 0;
  if (json) {
    std::cout << sum.to_json().dump(2) << std::endl;
  } else {
    std::cout << cli::format_train_summary(sum, o);
  }
  // Trained and saved, but some of its records (metrics.jsonl, log files) could not be written:
  // partial success (summary.json's records_lost says how many and where).
  return sum.records_lost > 0 ? 3 : 0;
}

}  // namespace

namespace bp::cli {
void bind_train_settings(CLI::App& sub) {
  // Every setting whose row says what training does with it (core/settings_registry.inc's last
  // column): a new training setting is bound here without an edit. Testing settings (fault
  // injection) get hidden flags (cli/setting_flags.h).
  bind_settings_where(sub, [](const SettingSpec& spec) { return train_takes_setting(spec.key); });
}

TrainOptions train_options_with_preset(bool json) {
  Settings st = settings();  // a copy: the preset fills the settings left at their defaults
  // --resume: the run continues with its own settings.json; explicit values may change only what
  // does not break the continuation (train/resume_settings.h).
  const nlohmann::json resumed_preset = resume_with_saved_settings(st);
  // --model as a folder, a hub name (cache, then download), a GGUF file or ollama:NAME.
  const std::string reference = st.get_string("model.path");
  const std::string model_dir = reference.empty() ? reference : resolve_model(reference);
  PresetApplied preset = apply_preset(st, model_dir);
  if (!preset.describe().empty()) (json ? std::cerr : std::cout) << preset.describe() << "\n";
  TrainOptions o = TrainOptions::from_settings(st);
  o.model_dir = model_dir;
  // --data / --eval-data as hf://datasets/... : the cached file (downloaded when missing); the run's
  // settings.json keeps the reference.
  o.data_path = resolve_data(o.data_path);
  if (!o.eval_data_path.empty()) o.eval_data_path = resolve_data(o.eval_data_path);
  // A hub name stays the adapter's base (portable to transformers/PEFT); the cache path is local.
  if (model_dir != reference && hub::parse_hub_ref(reference)) o.base_model_name = reference;
  o.resolved_settings["preset"] = resumed_preset.is_null() ? preset.to_json() : resumed_preset;
  return o;
}
}  // namespace bp::cli

namespace {
bp::cli::RunFn setup_train(CLI::App& sub) {
  bp::cli::bind_train_settings(sub);
  sub.footer(
      "Exit codes: 0 trained and every record written; 3 trained and saved, but records of the run could not be "
      "written (a full disk: summary.json's records_lost counts them, and names the files); 1 user error; 2 runtime "
      "error; 130 interrupted.");
  return run_train;
}
}  // namespace

BP_REGISTER_COMMAND("train", "Fine-tune a model (LoRA or full) on a JSONL/JSON/TXT dataset", setup_train);
