// `backprop multi-run`: several LoRA runs over fresh windows of the data, merged with SLAO (or
// linear / TIES / DARE) behind drift and eval gates (train/multi_run.h does the work). Takes every
// flag of `train` plus the [multirun] settings; prints one line per run and the merge history.
#include <fmt/format.h>

#include <iostream>

#include "cli/command.h"
#include "cli/progress.h"
#include "cli/train_flags.h"
#include "train/multi_run.h"

namespace {

int run_multi_run() {
  using namespace bp;
  const bool json = cli::global_options().json;
  MultiRunOptions o = MultiRunOptions::from_settings(cli::settings(), cli::train_options_with_preset(json));
  cli::ProgressBar bar(!json && !o.train.quiet);
  MultiRunCallbacks cb;
  cb.train = bar.callbacks();
  cb.on_run_start = [&](int64_t i, const TrainOptions& t) {
    bar.clear_line();
    if (!json) std::cerr << fmt::format("== run {} of {} (lr {:.3g}, data {}) ==\n", i, o.runs, t.lr, t.data_path);
  };
  cb.on_decision = [&](const nlohmann::json& d) {
    bar.finish();
    if (json) return;
    std::cout << fmt::format("run {}: {}", d["run"].get<int64_t>(), d["decision"].get<std::string>());
    if (d.contains("heldout_loss")) std::cout << fmt::format(", held-out loss {:.4f}", d["heldout_loss"].get<double>());
    if (d.contains("lambda")) std::cout << fmt::format(", lambda {:.3f}", d["lambda"].get<double>());
    if (d.contains("b_cosine")) std::cout << fmt::format(", B cosine {:.3f}", d["b_cosine"].get<double>());
    if (d.contains("code")) std::cout << " [" << d["code"].get<std::string>() << "]";
    if (d.contains("reason")) std::cout << " (" << d["reason"].get<std::string>() << ")";
    if (d.contains("early_stop")) std::cout << "; early stop: " << d["early_stop"].get<std::string>();
    std::cout << "\n";
  };
  MultiRunSummary sum = run_multi(o, cb);
  if (json) {
    std::cout << sum.to_json().dump(2) << std::endl;
    return 0;
  }
  std::cout << fmt::format("\n{} run(s), {} merged{}; best held-out loss {}\n", sum.runs_done, sum.runs_merged,
                           sum.stopped_early ? " (stopped early)" : "",
                           sum.best_heldout_loss ? fmt::format("{:.4f}", *sum.best_heldout_loss) : "n/a");
  std::cout << "merged adapter: " << (sum.final_adapter.empty() ? "(none: no run was merged)" : sum.final_adapter)
            << "\n"
            << "history:        " << sum.output_dir << "/history.json\n";
  return 0;
}

bp::cli::RunFn setup_multi_run(CLI::App& sub) {
  bp::cli::bind_train_settings(sub);
  bp::cli::bind_settings_where(
      sub, [](const bp::SettingSpec& spec) { return std::string_view(spec.key).starts_with("multirun."); });
  return run_multi_run;
}

}  // namespace

BP_REGISTER_COMMAND("multi-run",
                    "Train several LoRA runs on fresh data windows and merge them (SLAO, linear, TIES, DARE)",
                    setup_multi_run);
