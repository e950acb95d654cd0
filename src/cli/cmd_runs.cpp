// Run history commands (issue 21), all reading the runs folder (--output, default runs/) through
// train/run_history.h, all with --json:
//   backprop runs                    every run: id, status (code), model, data, steps, best eval
//   backprop show-run RUN            one run: status, settings that differ from the defaults,
//                                    metrics summary, checkpoints, the preset it used
//   backprop diff-runs A B           settings that differ and the metrics side by side
//   backprop replay RUN --set k=v    a new run with RUN's settings and data, with the overrides
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "cli/command.h"
#include "cli/progress.h"
#include "core/error.h"
#include "core/settings.h"
#include "train/run_history.h"
#include "train/trainer.h"

namespace {

using namespace bp;

struct RunsArgs {
  std::string run, other;
  std::vector<std::string> sets;
};
RunsArgs& args() {
  static RunsArgs a;
  return a;
}

std::string runs_dir() {
  return cli::settings().get_string("training.output");
}

std::string opt_loss(const std::optional<double>& v) {
  return v ? fmt::format("{:.4f}", *v) : "-";
}

int run_runs() {
  std::vector<SkippedRun> skipped;
  auto runs = list_runs(runs_dir(), &skipped);
  for (const auto& s : skipped)  // on stderr, so the listing (and --json) stays what it was
    spdlog::warn("[runs] skipped run folder {}: [{}] {}", s.path, error_info(s.code).name, s.message);
  if (cli::global_options().json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : runs) j.push_back(r.to_json());
    std::cout << j.dump(2) << std::endl;
    return 0;
  }
  if (runs.empty()) {
    std::cout << "no runs under " << runs_dir() << "\n";
    return 0;
  }
  std::cout << fmt::format("{:<38} {:<28} {:>7} {:>9}  {:<24} {}\n", "RUN", "STATUS", "STEPS", "BEST EVAL", "MODEL",
                           "DATA");
  for (const auto& r : runs)
    std::cout << fmt::format("{:<38} {:<28} {:>7} {:>9}  {:<24} {}\n", r.id,
                             r.code.empty() ? r.status : r.status + " " + r.code, r.steps, opt_loss(r.best_eval_loss),
                             r.model, r.data);
  return 0;
}

// The preset a run used ("" when none): settings.json's {"preset": {"name", "applied"}}.
std::string preset_line(const nlohmann::json& settings) {
  const auto it = settings.find("preset");
  if (it == settings.end() || !it->is_object()) return "";
  const auto name = it->find("name");
  if (name == it->end() || !name->is_string() || *name == "none") return "";
  const auto applied = it->find("applied");
  return name->get<std::string>() + " " + (applied == it->end() ? "{}" : applied->dump());
}

int run_show_run() {
  RunRecord r = find_run(runs_dir(), args().run);
  auto changed = changed_settings(r.settings);
  if (cli::global_options().json) {
    nlohmann::json j = r.to_json();
    j["settings"] = r.settings;
    nlohmann::json c = nlohmann::json::object();
    for (const auto& [k, v] : changed) c[k] = v;
    j["changed_settings"] = c;
    std::cout << j.dump(2) << std::endl;
    return 0;
  }
  std::cout << fmt::format("run        {}\nfolder     {}\nstatus     {}{}\nmodel      {}\ndata       {}\n", r.id,
                           r.path, r.status, r.code.empty() ? "" : " (" + r.code + ")", r.model, r.data);
  std::cout << fmt::format("steps      {}\nfinal loss {}\nbest eval  {}\n", r.steps, opt_loss(r.final_loss),
                           opt_loss(r.best_eval_loss));
  if (r.tokens_per_second) std::cout << fmt::format("speed      {:.0f} tokens/s\n", *r.tokens_per_second);
  if (r.world_size > 1) std::cout << fmt::format("processes  {} (data-parallel)\n", r.world_size);
  for (auto& [k, v] : r.eval_metrics.items()) std::cout << fmt::format("{:<22} {:.4f}\n", k, v.get<double>());
  if (!r.eval_results.empty()) std::cout << fmt::format("backprop eval on {}:\n", r.eval_results_data);
  for (auto& [k, v] : r.eval_results.items())
    if (v.is_object() && v.value("value", nlohmann::json()).is_number())
      std::cout << fmt::format("  {:<20} {:.4f}  [{:.4f}, {:.4f}]\n", k, v["value"].get<double>(),
                               v.value("ci_low", 0.0), v.value("ci_high", 0.0));
  if (const std::string preset = preset_line(r.settings); !preset.empty()) std::cout << "preset     " << preset << "\n";
  std::cout << "checkpoints " << (r.checkpoints.empty() ? "(none)" : fmt::format("{}", fmt::join(r.checkpoints, ", ")))
            << "\nsettings that differ from the defaults:\n";
  for (const auto& [k, v] : changed) std::cout << fmt::format("  {:<36} {}\n", k, v);
  return 0;
}

int run_diff_runs() {
  RunRecord a = find_run(runs_dir(), args().run), b = find_run(runs_dir(), args().other);
  auto fa = flatten_settings(a.settings), fb = flatten_settings(b.settings);
  std::map<std::string, std::pair<std::string, std::string>> diff;
  for (const auto& [k, v] : fa) diff[k].first = v;
  for (const auto& [k, v] : fb) diff[k].second = v;
  std::erase_if(diff, [](const auto& e) { return e.second.first == e.second.second; });
  auto metrics = [](const RunRecord& r) {
    return nlohmann::json{
        {"status", r.status},
        {"steps", r.steps},
        {"world_size", r.world_size},
        {"final_loss", r.final_loss ? nlohmann::json(*r.final_loss) : nlohmann::json(nullptr)},
        {"best_eval_loss", r.best_eval_loss ? nlohmann::json(*r.best_eval_loss) : nlohmann::json(nullptr)},
        {"tokens_per_second", r.tokens_per_second ? nlohmann::json(*r.tokens_per_second) : nlohmann::json(nullptr)},
        {"eval_metrics", r.eval_metrics},
        {"eval_results", r.eval_results}};
  };
  if (cli::global_options().json) {
    nlohmann::json s = nlohmann::json::object();
    for (const auto& [k, v] : diff) s[k] = {v.first, v.second};
    std::cout << nlohmann::json{{"a", a.id}, {"b", b.id}, {"settings", s}, {"metrics", {metrics(a), metrics(b)}}}.dump(
                     2)
              << std::endl;
    return 0;
  }
  std::cout << fmt::format("{:<36} {:<24} {}\n", "", "A " + a.id.substr(0, 8), "B " + b.id.substr(0, 8));
  std::cout << "settings that differ:\n";
  if (diff.empty()) std::cout << "  (none)\n";
  for (const auto& [k, v] : diff) std::cout << fmt::format("  {:<34} {:<24} {}\n", k, v.first, v.second);
  std::cout << "metrics:\n";
  auto ma = metrics(a), mb = metrics(b);
  for (const char* k : {"status", "steps", "final_loss", "best_eval_loss", "tokens_per_second"})
    std::cout << fmt::format("  {:<34} {:<24} {}\n", k, ma[k].dump(), mb[k].dump());
  std::set<std::string> evals;  // preference methods' eval_ metrics, of either run
  for (const RunRecord* r : {&a, &b})
    for (auto& [k, v] : r->eval_metrics.items()) evals.insert(k);
  for (const std::string& k : evals)
    std::cout << fmt::format("  {:<34} {:<24} {}\n", k, a.eval_metrics.value(k, nlohmann::json()).dump(),
                             b.eval_metrics.value(k, nlohmann::json()).dump());
  std::set<std::string> results;  // `backprop eval`'s, of either run
  for (const RunRecord* r : {&a, &b})
    for (auto& [k, v] : r->eval_results.items()) results.insert(k);
  auto result = [](const RunRecord& r, const std::string& k) {
    const auto it = r.eval_results.find(k);
    return it != r.eval_results.end() && it->is_object() && it->contains("value") ? (*it)["value"].dump()
                                                                                  : std::string("null");
  };
  for (const std::string& k : results)
    std::cout << fmt::format("  eval {:<29} {:<24} {}\n", k, result(a, k), result(b, k));
  return 0;
}

int run_replay() {
  RunRecord r = find_run(runs_dir(), args().run);
  std::vector<SettingOverride> layers;
  const auto saved = flatten_settings(r.settings);
  auto saved_value = [&](const std::string& key) {
    for (const auto& [k, v] : saved)
      if (k == key) return v;
    return std::string();
  };
  // batch_size is derived when both micro-batch and accumulation were given: replaying it as a
  // flag could disagree with them.
  const bool batch_derived =
      saved_value("training.grad_accum") != "0" && saved_value("training.micro_batch_size") != "auto";
  for (const auto& [k, v] : saved)
    if (k != "training.resume" && k != "training.output" && !(batch_derived && k == "training.batch_size"))
      layers.push_back({k, v});
  layers.push_back({"training.output", std::filesystem::path(r.path).parent_path().string()});
  for (const auto& s : args().sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(ErrorCode::CONFIG_INVALID, fmt::format("[replay] --set {}: expected key=value (e.g. lora.r=8)", s));
    layers.push_back({s.substr(0, eq), s.substr(eq + 1)});  // unknown keys fail in Settings::load, named
  }
  Settings st = Settings::load("", {}, layers);
  TrainOptions o = TrainOptions::from_settings(st);
  o.resolved_settings["replay_of"] = r.id;
  if (r.settings.contains("preset")) o.resolved_settings["preset"] = r.settings["preset"];
  const bool json = cli::global_options().json;
  cli::ProgressBar bar(!json && !o.quiet);
  TrainSummary sum = Trainer(o, bar.callbacks()).run();
  bar.finish();
  if (json)
    std::cout << sum.to_json().dump(2) << std::endl;
  else
    std::cout << "replay of " << r.id << ":\n" << cli::format_train_summary(sum, o);
  return 0;
}

bp::cli::RunFn setup_runs(CLI::App& sub) {
  bp::cli::bind_settings(sub, {"training.output"});
  return run_runs;
}
bp::cli::RunFn setup_show_run(CLI::App& sub) {
  sub.add_option("run", args().run, "Run id (or a unique prefix) under --output, or a run folder")->required();
  bp::cli::bind_settings(sub, {"training.output"});
  return run_show_run;
}
bp::cli::RunFn setup_diff_runs(CLI::App& sub) {
  sub.add_option("a", args().run, "First run (id, prefix or folder)")->required();
  sub.add_option("b", args().other, "Second run (id, prefix or folder)")->required();
  bp::cli::bind_settings(sub, {"training.output"});
  return run_diff_runs;
}
bp::cli::RunFn setup_replay(CLI::App& sub) {
  sub.add_option("run", args().run, "Run to replay (id, prefix or folder)")->required();
  sub.add_option("--set", args().sets, "Override a setting of the replayed run: section.key=value (repeatable)");
  bp::cli::bind_settings(sub, {"training.output"});
  return run_replay;
}

}  // namespace

BP_REGISTER_COMMAND("runs", "List the runs in a runs folder with status, model, data, steps and best eval loss",
                    setup_runs);
BP_REGISTER_COMMAND("show-run", "Show one run: status, settings, metrics, checkpoints", setup_show_run);
BP_REGISTER_COMMAND("diff-runs", "Compare two runs: settings that differ and metrics side by side", setup_diff_runs);
BP_REGISTER_COMMAND("replay", "Start a new run with the settings and data of an earlier one, with --set overrides",
                    setup_replay);
