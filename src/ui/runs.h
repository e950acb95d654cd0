// What `backprop ui` knows about runs: the runs folder as `backprop train` writes it
// (<runs>/<run id>/{settings.json, metrics.jsonl, summary.json, checkpoints/, adapter/}) plus the
// UI's own launch records (<runs>/.ui/launches/<launch id>.{json,out,err}): which command it
// started, its pid, its stdout (the --json summary or error envelope) and its stderr (the log).
//
// Status comes from the files and /proc, never from the UI's memory, so a restarted UI finds every
// run again and runs started from the command line show up too:
//   running      a live process holds <run>/metrics.jsonl open;
//   finished     summary.json exists;
//   interrupted  the launch ended with RUNTIME_TRAINING_ABORTED (Stop, SIGINT) or, for runs the UI
//                did not start, the run ended without a summary;
//   failed       the launch ended with another error code (shown).
// Every path from a request goes through resolve_inside(), which throws INPUT_PATH_TRAVERSAL.
#pragma once

#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace bp::ui {

// `name` (one path component, or a relative path when allow_subdirs) resolved inside `root`; throws
// INPUT_PATH_TRAVERSAL for absolute paths, "..", empty names and links leading out of root.
std::filesystem::path resolve_inside(const std::filesystem::path& root, const std::string& name,
                                     bool allow_subdirs = false);

class RunStore {
 public:
  RunStore(std::filesystem::path runs_root, std::string backprop_exe);

  const std::filesystem::path& root() const { return root_; }
  nlohmann::json list();
  nlohmann::json detail(const std::string& run_id);
  // Metric records (step, eval, checkpoint, event lines of metrics.jsonl) from byte `offset`;
  // *next_offset is where the next read starts (only whole lines are consumed).
  std::vector<nlohmann::json> metrics_since(const std::string& run_id, size_t offset, size_t* next_offset);
  // The last `max_bytes` of the run's log (the stderr of the UI's launches of it).
  std::string log_tail(const std::string& run_id, size_t max_bytes);

  // `backprop train` with these arguments (flags after "train"); returns the launch id.
  std::string start_train(const std::vector<std::string>& train_args);
  // `backprop train --resume` of the run with its settings.json; steps > 0 sets a new end step.
  std::string resume(const std::string& run_id, int64_t steps = 0);
  // SIGINT (save and exit) to the `backprop train` process that holds this run's metrics.jsonl
  // open, never to another program that has it open. {"stopped": true, "pid"} once the signal was
  // delivered to it; {"stopped": false, "reason"} otherwise.
  nlohmann::json stop(const std::string& run_id);
  std::string start_export(const std::string& run_id, const std::string& format, const std::string& quantization,
                           bool ollama);
  // {launch_id, kind, pid, running, run_id (when known), result (the --json output when done)}.
  nlohmann::json launch(const std::string& launch_id);

 private:
  std::filesystem::path launches_dir() const;
  std::string spawn(const std::string& kind, const std::string& run_id, const std::vector<std::string>& args);
  nlohmann::json read_launch(const std::string& launch_id);
  std::vector<nlohmann::json> launches_of(const std::string& run_id);
  nlohmann::json run_entry(const std::filesystem::path& dir);

  std::filesystem::path root_;
  std::string exe_;
  std::mutex mu_;
};

}  // namespace bp::ui
