// Run history: reading run folders (see run_history.h for the files).
#include "train/run_history.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <filesystem>

#include "core/error.h"
#include "core/file_lines.h"
#include "core/settings.h"
#include "io/atomic_file.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

// Run files are read like every other input (core/file_read.h): regular files only (a status.json
// linked to /dev/zero is refused, not read forever) under the caps of limits.max_config_bytes
// (status, summary, settings) and limits.max_dataset_bytes (metrics.jsonl, read line by line).
// Those refusals throw (INPUT_FILE_NOT_REGULAR, INPUT_FILE_TOO_LARGE, or INPUT_VALIDATION_FAILED when
// the file cannot be opened): the run folder is bad, and `runs` skips it while `show-run` fails.
const FileReader kRunFiles{"runs", ErrorCode::INPUT_VALIDATION_FAILED};

std::optional<nlohmann::json> read_json_file(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(p, ec)) return std::nullopt;  // not written yet (or a link to nothing)
  const std::string text = read_file_capped(p.string(), FileKind::Config, kRunFiles);
  try {
    const nlohmann::json j = parse_json_bounded(text, p.string(), "runs");
    if (j.is_discarded()) return std::nullopt;  // half-written by a crash: treated as absent
    return j;
  } catch (const Error&) {  // nested too deep: not a file backprop wrote
    return std::nullopt;
  }
}

// The run files as objects: one that parses to something else ([] or 5, not a file backprop wrote)
// is treated as absent, like a broken one.
std::optional<nlohmann::json> read_json_object(const fs::path& p) {
  std::optional<nlohmann::json> j = read_json_file(p);
  return j && j->is_object() ? j : std::nullopt;
}

// A field of a run file when it has the type backprop writes, else `fallback`: a hand-edited or
// foreign file ({"status": 5}, {"steps": "x"}) leaves that field unknown instead of failing the
// whole listing with nlohmann's type_error.
std::string string_field(const nlohmann::json& j, const char* key, const std::string& fallback = "") {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}
int64_t int_field(const nlohmann::json& j, const char* key, int64_t fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}
std::optional<double> number_field(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? std::optional<double>(it->get<double>()) : std::nullopt;
}

std::string now_iso() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool pid_alive(int64_t pid) {
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

RunRecord read_run(const fs::path& dir) {
  RunRecord r;
  // The id is the folder's name, also when it is given as "runs/ID/" or ".".
  fs::path named = fs::absolute(dir).lexically_normal();
  if (!named.has_filename()) named = named.parent_path();
  r.id = named.filename().string();
  r.path = dir.string();
  r.settings = read_json_object(dir / "settings.json").value_or(nlohmann::json::object());
  auto str = [&](const char* sec, const char* key) {
    const auto it = r.settings.find(sec);
    return it != r.settings.end() && it->is_object() ? string_field(*it, key) : std::string();
  };
  r.model = str("model", "path");
  r.data = str("data", "path");
  const auto status = read_json_object(dir / "status.json");
  const auto summary = read_json_object(dir / "summary.json");
  r.status = status ? string_field(*status, "status", "unknown") : summary ? "finished" : "unknown";
  if (status) {
    r.code = string_field(*status, "code");
    r.started = string_field(*status, "started");
    if (r.status == "running" && !pid_alive(int_field(*status, "pid", 0))) r.status = "killed";
  }
  // Steps, losses and speed from the metrics (they exist for unfinished runs too).
  std::error_code ec;
  if (const fs::path metrics = dir / "metrics.jsonl"; fs::exists(metrics, ec))
    for_each_line_capped(metrics.string(), FileKind::Dataset, kRunFiles, [&](std::string_view line) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object()) return;
      const std::string type = string_field(j, "type");
      if (type == "step") {
        r.steps = std::max(r.steps, int_field(j, "step", 0));
        if (auto loss = number_field(j, "loss")) r.final_loss = loss;
      } else if (type == "eval") {
        if (auto v = number_field(j, "eval_loss"); v && (!r.best_eval_loss || *v < *r.best_eval_loss))
          r.best_eval_loss = v;
        r.eval_metrics = nlohmann::json::object();
        for (auto& [k, v] : j.items())
          if (k.rfind("eval_", 0) == 0 && k != "eval_loss" && v.is_number()) r.eval_metrics[k] = v;
      }
    });
  if (summary) {
    r.steps = int_field(*summary, "steps", r.steps);
    r.world_size = std::max<int64_t>(1, int_field(*summary, "world_size", 1));
    if (auto v = number_field(*summary, "best_eval_loss")) r.best_eval_loss = v;
    const double secs = number_field(*summary, "seconds").value_or(0.0);
    if (secs > 0) r.tokens_per_second = number_field(*summary, "tokens").value_or(0.0) / secs;
  }
  if (const auto it = r.settings.find("training"); it != r.settings.end() && it->is_object())
    r.total_steps = int_field(*it, "steps", 0);
  if (const auto ev = read_json_object(dir / "eval_results.json")) {
    const auto m = ev->find("metrics");
    if (m != ev->end() && m->is_object()) {
      r.eval_results = *m;
      r.eval_results_data = string_field(*ev, "eval_data");
    }
  }
  for (const auto& e : fs::directory_iterator(dir / "checkpoints", ec))
    if (e.is_directory() && e.path().filename().string().rfind("checkpoint-", 0) == 0 &&
        e.path().extension() != ".partial")
      r.checkpoints.push_back(e.path().filename().string());
  std::sort(r.checkpoints.begin(), r.checkpoints.end());
  return r;
}

}  // namespace

nlohmann::json RunRecord::to_json() const {
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  return {{"id", id},
          {"path", path},
          {"status", status},
          {"code", code},
          {"model", model},
          {"data", data},
          {"started", started},
          {"steps", steps},
          {"total_steps", total_steps},
          {"world_size", world_size},
          {"best_eval_loss", opt(best_eval_loss)},
          {"final_loss", opt(final_loss)},
          {"tokens_per_second", opt(tokens_per_second)},
          {"checkpoints", checkpoints},
          {"eval_metrics", eval_metrics},
          {"eval_results", eval_results},
          {"eval_results_data", eval_results_data}};
}

void write_run_status_running(const std::string& run_dir) {
  write_file_atomic(
      (fs::path(run_dir) / "status.json").string(),
      nlohmann::json{{"status", "running"}, {"pid", static_cast<int64_t>(::getpid())}, {"started", now_iso()}}.dump(2));
}

void write_run_status_end(const std::string& run_dir, const std::string& status, const std::string& code,
                          const std::string& message) {
  const fs::path p = fs::path(run_dir) / "status.json";
  nlohmann::json j = nlohmann::json::object();
  try {
    j = read_json_object(p).value_or(j);
  } catch (const Error&) {  // not a file we can read back (a link to a device): replaced by this one
  }
  j["status"] = status;
  j["ended"] = now_iso();
  if (!code.empty()) j["code"] = code;
  if (!message.empty()) j["message"] = message;
  write_file_atomic(p.string(), j.dump(2));
}

std::vector<RunRecord> list_runs(const std::string& runs_dir, std::vector<SkippedRun>* skipped) {
  std::vector<RunRecord> runs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(runs_dir, ec)) {
    if (!e.is_directory() || !fs::exists(e.path() / "settings.json")) continue;
    try {
      runs.push_back(read_run(e.path()));
    } catch (const Error& err) {  // one bad run folder does not hide the others
      if (skipped) skipped->push_back({e.path().string(), err.code(), err.what()});
    }
  }
  std::sort(runs.begin(), runs.end(), [](const RunRecord& a, const RunRecord& b) {
    return a.started != b.started ? a.started > b.started : a.id > b.id;
  });
  return runs;
}

RunRecord find_run(const std::string& runs_dir, const std::string& ref) {
  if (fs::exists(fs::path(ref) / "settings.json")) return read_run(fs::path(ref));
  std::vector<fs::path> matches;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(runs_dir, ec))
    if (e.is_directory() && e.path().filename().string().rfind(ref, 0) == 0 && fs::exists(e.path() / "settings.json"))
      matches.push_back(e.path());
  if (matches.empty())
    throw Error(ErrorCode::INPUT_RESUME_NOT_FOUND,
                fmt::format("[runs] no run '{}': neither a run folder nor a run id under {}", ref, runs_dir))
        .with_suggestion("`backprop runs --output DIR` lists the runs in a runs folder.");
  if (matches.size() > 1)
    throw Error(
        ErrorCode::INPUT_VALIDATION_FAILED,
        fmt::format("[runs] '{}' matches {} runs under {}: give more of the run id", ref, matches.size(), runs_dir));
  return read_run(matches.front());
}

std::vector<std::pair<std::string, std::string>> flatten_settings(const nlohmann::json& settings) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& spec : settings_registry()) {
    const std::string key = spec.key;
    const size_t dot = key.find('.');
    const std::string sec = key.substr(0, dot), name = key.substr(dot + 1);
    if (!settings.contains(sec) || !settings[sec].contains(name)) continue;
    const auto& v = settings[sec][name];
    out.emplace_back(key, v.is_string() ? v.get<std::string>() : v.dump());
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> changed_settings(const nlohmann::json& settings) {
  std::vector<std::pair<std::string, std::string>> out;
  const nlohmann::json defaults = Settings().to_json();
  for (const auto& [key, value] : flatten_settings(settings)) {
    const size_t dot = key.find('.');
    const std::string sec = key.substr(0, dot), name = key.substr(dot + 1);
    const nlohmann::json saved = settings.at(sec).at(name);  // flatten_settings listed it
    if (!defaults.contains(sec) || !defaults[sec].contains(name) || defaults[sec][name] != saved)
      out.emplace_back(key, value);
  }
  return out;
}

}  // namespace bp
