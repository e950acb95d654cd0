// Run history (issue 21): what `backprop runs`, `show-run`, `diff-runs` and `replay` (and the web
// UI) know about the runs in a runs folder, read from the files every `train` run writes:
//   status.json     {"status": "running"|"finished"|"failed"|"interrupted", "pid", "code", "message"}
//                   (written by the trainer at start and end; a "running" run whose pid is gone
//                    is reported as "killed")
//   settings.json   the resolved settings (section -> key -> value), plus "preset"
//   summary.json    the final summary (finished runs)
//   metrics.jsonl   step / eval records (steps done and best eval loss of unfinished runs)
//   checkpoints/    checkpoint-<step> folders
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace bp {

struct RunRecord {
  std::string id, path, status, code;  // code: the error code of a failed run
  std::string model, data, started;    // started: ISO time of status.json's "started"
  int64_t steps = 0, total_steps = 0;
  int64_t world_size = 1;  // processes of a data-parallel run (summary.json; 1 until one is written)
  std::optional<double> best_eval_loss, final_loss, tokens_per_second;
  std::vector<std::string> checkpoints;
  nlohmann::json settings;  // settings.json as written
  // The last evaluation's other metrics (preference methods: eval_rewards/accuracies, ...).
  nlohmann::json eval_metrics = nlohmann::json::object();
  // `backprop eval`'s last results for this run (eval_results.json: label -> value, ci_low, ci_high).
  nlohmann::json eval_results = nlohmann::json::object();
  std::string eval_results_data;  // the file they were measured on
  nlohmann::json to_json() const;
};

// Status files: the trainer calls these (train/trainer.cpp).
void write_run_status_running(const std::string& run_dir);
void write_run_status_end(const std::string& run_dir, const std::string& status, const std::string& code = "",
                          const std::string& message = "");

// A run folder whose files cannot be read as run files: one is not a regular file (a link to
// /dev/zero), is larger than its cap (limits.max_*_bytes) or cannot be opened.
struct SkippedRun {
  std::string path;
  ErrorCode code;
  std::string message;
};

// Every run folder (one holding settings.json) directly under `runs_dir`, newest first.
// A missing folder gives an empty list; bad run folders are left out and listed in `skipped`.
std::vector<RunRecord> list_runs(const std::string& runs_dir, std::vector<SkippedRun>* skipped = nullptr);

// `ref` is a run folder path, or a run id (or unique prefix of one) under `runs_dir`.
// INPUT_RESUME_NOT_FOUND naming both when nothing matches; INPUT_VALIDATION_FAILED when a prefix
// is ambiguous; a bad run folder (see SkippedRun) throws that file's error.
RunRecord find_run(const std::string& runs_dir, const std::string& ref);

// Settings as dotted key -> value text, for replay and diffs ("lora.r" -> "16").
std::vector<std::pair<std::string, std::string>> flatten_settings(const nlohmann::json& settings);
// The settings of a run that differ from the built-in defaults, compared as JSON values the way
// settings.json holds them (Settings::to_json), so a float at its default (lora.alpha 32.0) equals
// it; the text forms differ ("32" and "32.0"). show-run lists them; a pushed model card turns them
// into the command that reproduces the run.
std::vector<std::pair<std::string, std::string>> changed_settings(const nlohmann::json& settings);

}  // namespace bp
