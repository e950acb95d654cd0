// `backprop data report FILE` and `backprop data split FILE` (issue 43; train/data_report.h has what
// each finding means). report: text for people, --json for machines, exit 1 when a kind named by
// --fail-on is found (CI gates); split: train and eval JSONL files with near-duplicates on one side.
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/command.h"
#include "cli/model_ref.h"
#include "core/error.h"
#include "train/data_report.h"

namespace {

namespace fs = std::filesystem;

struct DataOptions {
  std::string file, eval_file, model, chat_template, format = "auto", fail_on;
  int64_t max_seq_length = 2048, max_findings = 50;
  bool json = false;
  double eval_fraction = 0.1;
  uint64_t seed = 0;
  std::string train_out, eval_out;
};

std::vector<std::string> fail_kinds(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  const auto& kinds = bp::data_finding_kinds();
  for (std::string k; std::getline(ss, k, ',');) {
    if (k.empty()) continue;
    if (k == "any") {
      out = kinds;
      continue;
    }
    if (std::find(kinds.begin(), kinds.end(), k) == kinds.end())
      throw bp::Error(bp::ErrorCode::INPUT_VALIDATION_FAILED,
                      fmt::format("[data] --fail-on {}: not a finding kind ({}, or any)", k, fmt::join(kinds, ", ")));
    out.push_back(k);
  }
  return out;
}

int run_report(const DataOptions& o) {
  const std::vector<std::string> gates = fail_kinds(o.fail_on);  // refused before any work
  bp::DataReportOptions r;
  r.file = bp::cli::resolve_data(o.file);
  r.eval_file = o.eval_file.empty() ? o.eval_file : bp::cli::resolve_data(o.eval_file);
  if (!o.model.empty()) r.model_dir = bp::cli::resolve_model(o.model, bp::hub::ModelFiles::Tokenizer);
  r.chat_template = o.chat_template;
  r.chat = bp::ChatDataOptions::from_settings(bp::cli::settings());
  r.format = bp::parse_dataset_format(o.format);
  r.max_seq_length = o.max_seq_length;
  r.near_threshold = bp::cli::settings().get_float("data.near_duplicate_threshold");
  const bp::DataReport rep = bp::build_data_report(r);
  const auto counts = rep.counts();
  std::vector<std::string> failed;
  for (const std::string& k : gates)
    if (counts.at(k) > 0) failed.push_back(k);
  if (o.json || bp::cli::global_options().json) {
    nlohmann::ordered_json j = rep.to_json(-1);
    j["failed_gates"] = failed;
    std::cout << j.dump(2) << std::endl;
  } else {
    std::cout << rep.to_text(o.max_findings);
    if (!failed.empty()) std::cout << fmt::format("FAIL: --fail-on found {}\n", fmt::join(failed, ", "));
  }
  return failed.empty() ? 0 : 1;
}

int run_split(const DataOptions& o) {
  bp::DataSplitOptions s;
  s.file = bp::cli::resolve_data(o.file);
  s.eval_fraction = o.eval_fraction;
  s.seed = o.seed;
  s.train_out = o.train_out;
  s.eval_out = o.eval_out;
  if (s.file != o.file) {  // a hub file: the halves go to this folder, named after it, never into the cache
    const std::string stem = fs::path(s.file).stem().string();
    if (s.train_out.empty()) s.train_out = stem + ".train.jsonl";
    if (s.eval_out.empty()) s.eval_out = stem + ".eval.jsonl";
  }
  s.near_threshold = bp::cli::settings().get_float("data.near_duplicate_threshold");
  s.columns = bp::parse_column_map(bp::cli::settings().get_string("data.columns"));
  const bp::DataSplitResult r = bp::split_dataset(s);
  if (o.json || bp::cli::global_options().json) {
    std::cout << nlohmann::ordered_json{{"train", r.train_path},      {"eval", r.eval_path},
                                        {"train_rows", r.train_rows}, {"eval_rows", r.eval_rows},
                                        {"groups", r.groups},         {"grouped_rows", r.grouped_rows}}
                     .dump(2)
              << std::endl;
  } else {
    std::cout << fmt::format(
        "train {} ({} rows)\neval  {} ({} rows)\n{} groups of near-duplicates ({} rows) kept on one side each\n",
        r.train_path, r.train_rows, r.eval_path, r.eval_rows, r.groups, r.grouped_rows);
  }
  return 0;
}

bp::cli::RunFn setup_data(CLI::App& sub) {
  auto o = std::make_shared<DataOptions>();
  sub.require_subcommand(1);
  CLI::App* report = sub.add_subcommand("report",
                                        "Duplicates, near-duplicates, eval contamination, rows with nothing "
                                        "to learn, over-long rows and bad rows, each with its line number");
  report->add_option("file", o->file, "Dataset file (JSONL, JSON array or .txt)")->required();
  report->add_option("--eval-data", o->eval_file,
                     "An eval file: its rows found in the training file are contamination");
  report->add_option(
      "--model", o->model,
      "Model folder or hub name: exact token lengths and loss masks with its tokenizer and chat template "
      "(default: lengths in characters)");
  report->add_option("--chat-template", o->chat_template,
                     "Chat template as training uses it: a Jinja file or 'chatml'");
  report->add_option("--format", o->format, "Row format, as train's --format")->capture_default_str();
  report->add_option("--max-seq-length", o->max_seq_length, "Rows longer than this are reported")
      ->capture_default_str();
  report->add_option("--max-findings", o->max_findings, "Findings to print (all are counted; --json lists all)")
      ->capture_default_str();
  report->add_option("--fail-on", o->fail_on,
                     fmt::format("Exit 1 when any of these kinds is found (comma-separated: {}, or any)",
                                 fmt::join(bp::data_finding_kinds(), ", ")));
  report->add_flag("--json", o->json, "Machine-readable report");
  bp::cli::bind_settings(*report, {"data.near_duplicate_threshold", "model.offline", "data.columns", "data.tools",
                                   "data.template_kwargs", "data.reasoning", "data.tool_arguments"});
  CLI::App* split = sub.add_subcommand("split", "Write train and eval JSONL files, near-duplicates on one side");
  split->add_option("file", o->file, "Dataset file (JSONL)")->required();
  split->add_option("--eval-fraction", o->eval_fraction, "Share of rows for the eval file, in (0, 1)")
      ->capture_default_str();
  split->add_option("--seed", o->seed, "Seed of the split (same file and seed: same files)")->capture_default_str();
  split->add_option("--train-out", o->train_out, "Train file (default: FILE's stem + .train.jsonl)");
  split->add_option("--eval-out", o->eval_out, "Eval file (default: FILE's stem + .eval.jsonl)");
  split->add_flag("--json", o->json, "Machine-readable result");
  bp::cli::bind_settings(*split, {"data.near_duplicate_threshold", "data.columns"});
  return [o, report] { return report->parsed() ? run_report(*o) : run_split(*o); };
}

}  // namespace

BP_REGISTER_COMMAND("data", "Dataset tools: `data report` (what is wrong with it) and `data split` (train/eval)",
                    setup_data);
