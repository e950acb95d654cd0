// The runs folder as the UI sees it (runs.h): listing, status, metrics, logs, and the launches of
// `backprop train` / `backprop export` it starts.
#include "ui/runs.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/file_lines.h"
#include "core/system_readings.h"
#include "ui/auth.h"
#include "ui/process.h"

namespace bp::ui {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The whole file (or its first max_bytes), empty when it cannot be read.
std::string read_text(const fs::path& p, size_t max_bytes = 64 << 20) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return {};
  std::string s;
  char buf[65536];
  while (s.size() < max_bytes && in.read(buf, sizeof buf).gcount() > 0)
    s.append(buf, static_cast<size_t>(std::min<std::streamsize>(in.gcount(), max_bytes - s.size())));
  return s;
}

// A run file's JSON, or null when it is missing or not JSON (a discarded value must never be sent).
// Read like every input (core/file_read.h): a link to /dev/zero or a file over the cap is null too.
json read_json(const fs::path& p) {
  try {
    json j = read_json_file_capped(p.string(), FileKind::Config, {"ui"});
    return j.is_discarded() ? json() : j;
  } catch (const Error&) {  // missing, not a regular file, too large, nested too deep
    return json();
  }
}

// The last JSON object printed on a launch's stdout (--json output: summary or error envelope).
json last_json_object(const std::string& text) {
  const auto start = text.rfind("\n{");
  json j = json::parse(start == std::string::npos ? text : text.substr(start + 1), nullptr, false);
  return j.is_object() ? j : json();
}

// Every metrics.jsonl some live process holds open: path -> pid (one scan of /proc per listing).
std::map<std::string, pid_t> open_metrics_files() {
  std::map<std::string, pid_t> out;
  for_each_open_file([&](pid_t pid, const std::string& target) {
    if (fs::path(target).filename() == "metrics.jsonl") out[target] = pid;
    return true;
  });
  return out;
}

// True when `pid` runs this program's `train` command: its executable is named backprop* and one of
// its arguments is "train".
bool is_backprop_train(pid_t pid) {
  std::error_code ec;
  const std::string exe = fs::read_symlink(fmt::format("/proc/{}/exe", pid), ec).filename().string();
  if (ec || exe.rfind("backprop", 0) != 0) return false;
  const std::string cmdline = read_text(fmt::format("/proc/{}/cmdline", pid), 1 << 16);
  std::istringstream args(cmdline);
  std::string arg;
  std::getline(args, arg, '\0');  // argv[0]
  while (std::getline(args, arg, '\0'))
    if (arg == "train") return true;
  return false;
}

json get_path(const json& j, std::initializer_list<const char*> keys) {
  const json* cur = &j;
  for (const char* k : keys) {
    if (!cur->is_object() || !cur->contains(k)) return json();
    cur = &(*cur)[k];
  }
  return *cur;
}

}  // namespace

fs::path resolve_inside(const fs::path& root, const std::string& name, bool allow_subdirs) {
  auto refuse = [&](const std::string& why) {
    return Error(ErrorCode::INPUT_PATH_TRAVERSAL,
                 fmt::format("[ui] '{}' is not a name inside {}: {}", name, root.string(), why));
  };
  if (name.empty()) throw refuse("empty");
  const fs::path p(name);
  if (p.is_absolute()) throw refuse("absolute path");
  for (const auto& part : p) {
    const std::string s = part.string();
    if (s == ".." || s == ".") throw refuse("'.' or '..'");
    if (!s.empty() && s[0] == '.') throw refuse("hidden name");
  }
  if (!allow_subdirs && std::distance(p.begin(), p.end()) != 1) throw refuse("not one name");
  if (name.find('\0') != std::string::npos || name.find('\\') != std::string::npos) throw refuse("bad character");
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(root, ec);
  const fs::path full = fs::weakly_canonical(base / p, ec);
  auto rel = full.lexically_relative(base);
  if (ec || rel.empty() || *rel.begin() == "..") throw refuse("leads out of the folder");
  return full;
}

RunStore::RunStore(fs::path runs_root, std::string backprop_exe)
    : root_(fs::absolute(runs_root)), exe_(std::move(backprop_exe)) {
  fs::create_directories(launches_dir());
}

fs::path RunStore::launches_dir() const {
  return root_ / ".ui" / "launches";
}

json RunStore::read_launch(const std::string& launch_id) {
  const fs::path base = launches_dir() / launch_id;
  json rec = read_json(base.string() + ".json");
  if (!rec.is_object()) return json();
  const pid_t pid = rec.value("pid", 0);
  const long long start = live_process_start(pid);
  if (rec.contains("pid_start"))  // the process we started, whatever its command line reads at this instant
    rec["running"] = start >= 0 && start == rec.value("pid_start", -2LL);
  else  // a record from before pid_start was kept
    rec["running"] =
        start >= 0 && read_text(fmt::format("/proc/{}/cmdline", pid), 4096).find("backprop") != std::string::npos;
  if (!rec["running"].get<bool>()) {
    json result = last_json_object(read_text(base.string() + ".out"));
    rec["result"] = result;
    if (rec.value("run_id", "").empty() && result.is_object() && result.value("run_id", json()).is_string())
      rec["run_id"] = result["run_id"];
  } else if (rec.value("run_id", "").empty()) {
    // A fresh run names its folder once it starts: find the metrics file the process holds open.
    std::error_code ec;
    for (const auto& fd : fs::directory_iterator(fmt::format("/proc/{}/fd", pid), ec)) {
      std::error_code ec2;
      const fs::path target = fs::read_symlink(fd.path(), ec2);
      if (!ec2 && target.filename() == "metrics.jsonl") rec["run_id"] = target.parent_path().filename().string();
    }
  }
  if (!rec.value("run_id", "").empty()) {
    json stored = read_json(base.string() + ".json");
    if (stored.value("run_id", "").empty()) {
      stored["run_id"] = rec["run_id"];
      std::ofstream(base.string() + ".json", std::ios::trunc) << stored.dump(2);
    }
  }
  return rec;
}

json RunStore::launch(const std::string& launch_id) {
  resolve_inside(launches_dir(), launch_id + ".json");
  json rec = read_launch(launch_id);
  if (rec.is_null()) throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[ui] no launch {}", launch_id));
  return rec;
}

std::vector<json> RunStore::launches_of(const std::string& run_id) {
  std::vector<json> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(launches_dir(), ec))
    if (e.path().extension() == ".json") {
      json rec = read_launch(e.path().stem().string());
      if (rec.is_object() && rec.value("run_id", "") == run_id) out.push_back(rec);
    }
  std::sort(out.begin(), out.end(),
            [](const json& a, const json& b) { return a.value("started", 0.0) < b.value("started", 0.0); });
  return out;
}

json RunStore::run_entry(const fs::path& dir) {
  const std::string id = dir.filename().string();
  json settings = read_json(dir / "settings.json");
  json summary = read_json(dir / "summary.json");
  json e = {{"id", id},
            {"model", get_path(settings, {"model", "path"})},
            {"data", get_path(settings, {"data", "path"})},
            {"steps_total", get_path(settings, {"training", "steps"})}};
  int64_t steps = 0;
  json best_eval;
  try {
    for_each_line_capped((dir / "metrics.jsonl").string(), FileKind::Dataset, {"ui"}, [&](std::string_view line) {
      json r = json::parse(line, nullptr, false);
      if (!r.is_object()) return;
      if (r.value("type", "") == "step") steps = std::max<int64_t>(steps, r.value("step", int64_t{0}));
      if (r.value("type", "") == "eval" && r["eval_loss"].is_number() &&
          (best_eval.is_null() || r["eval_loss"].get<double>() < best_eval.get<double>()))
        best_eval = r["eval_loss"];
    });
  } catch (const Error&) {  // missing, not a regular file, too large: no steps known
  }
  e["steps_done"] = steps;
  e["best_eval_loss"] = summary.is_object() ? summary.value("best_eval_loss", best_eval) : best_eval;
  struct stat st {};  // Unix seconds of the last change (metrics.jsonl grows with every step)
  e["updated"] = ::stat((dir / "metrics.jsonl").c_str(), &st) == 0 ? static_cast<double>(st.st_mtime) : 0.0;
  return e;
}

json RunStore::list() {
  const auto open = open_metrics_files();
  json runs = json::array();
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(root_, ec)) {
    const std::string name = d.path().filename().string();
    if (!d.is_directory() || name.empty() || name[0] == '.' || !fs::exists(d.path() / "metrics.jsonl")) continue;
    json e = run_entry(d.path());
    std::error_code ec2;
    auto it = open.find(fs::weakly_canonical(d.path() / "metrics.jsonl", ec2).string());
    json last;
    for (const auto& l : launches_of(name))
      if (l.value("kind", "") != "export") last = l;
    if (it != open.end()) {
      e["status"] = "running";
      e["pid"] = it->second;
    } else if (last.is_object() && last["result"].is_object() && last["result"].contains("code")) {
      const std::string code = last["result"]["code"];
      e["status"] = code == "RUNTIME_TRAINING_ABORTED" ? "interrupted" : "failed";
      e["error_code"] = code;
    } else if (fs::exists(d.path() / "summary.json")) {
      e["status"] = "finished";
    } else {
      e["status"] = "interrupted";
    }
    runs.push_back(e);
  }
  std::sort(runs.begin(), runs.end(), [](const json& a, const json& b) { return a["updated"] > b["updated"]; });
  return runs;
}

json RunStore::detail(const std::string& run_id) {
  const fs::path dir = resolve_inside(root_, run_id);
  if (!fs::is_directory(dir))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[ui] no run {} in {}", run_id, root_.string()));
  json out;
  for (const auto& r : list())
    if (r["id"] == run_id) out = r;
  if (out.is_null()) out = run_entry(dir);
  out["settings"] = read_json(dir / "settings.json");
  out["summary"] = read_json(dir / "summary.json");
  out["eval_results"] = read_json(dir / "eval_results.json");  // `backprop eval`'s last results (null: none)
  json cps = json::array();
  std::error_code ec;
  for (const auto& c : fs::directory_iterator(dir / "checkpoints", ec))
    if (c.is_directory() && c.path().extension() != ".partial") cps.push_back(c.path().string());
  std::sort(cps.begin(), cps.end());
  out["checkpoints"] = cps;
  json exports = json::array();
  for (const auto& l : launches_of(run_id))
    if (l.value("kind", "") == "export") exports.push_back(l);
  out["exports"] = exports;
  out["path"] = dir.string();
  return out;
}

std::vector<json> RunStore::metrics_since(const std::string& run_id, size_t offset, size_t* next_offset) {
  const fs::path file = resolve_inside(root_, run_id) / "metrics.jsonl";
  std::vector<json> out;
  *next_offset = offset;
  try {
    check_not_special_file(file.string(), "ui");  // a link to /dev/zero would be one endless line
  } catch (const Error&) {
    return out;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return out;
  in.seekg(static_cast<std::streamoff>(offset));
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a line still being written: read it next time
    *next_offset += line.size() + 1;
    json r = json::parse(line, nullptr, false);
    if (!r.is_object()) continue;
    r.erase("samples");
    out.push_back(std::move(r));
  }
  return out;
}

std::string RunStore::log_tail(const std::string& run_id, size_t max_bytes) {
  resolve_inside(root_, run_id);
  std::string text;
  for (const auto& l : launches_of(run_id))
    text += read_text((launches_dir() / l.value("launch_id", "")).string() + ".err");
  if (text.size() > max_bytes) text = text.substr(text.size() - max_bytes);
  return text;
}

std::string RunStore::spawn(const std::string& kind, const std::string& run_id, const std::vector<std::string>& args) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string id = random_hex(8);
  const std::string base = (launches_dir() / id).string();
  std::vector<std::string> argv = {exe_};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = spawn_detached(argv, base + ".out", base + ".err");
  if (pid <= 0) throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[ui] could not start {}", exe_));
  json rec = {{"launch_id", id},
              {"kind", kind},
              {"pid", pid},
              {"pid_start", live_process_start(pid)},
              {"run_id", run_id},
              {"argv", argv},
              {"started", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()}};
  std::ofstream(base + ".json", std::ios::trunc) << rec.dump(2);
  return id;
}

std::string RunStore::start_train(const std::vector<std::string>& train_args) {
  std::vector<std::string> args = {"train", "--json", "--output", root_.string()};
  args.insert(args.end(), train_args.begin(), train_args.end());
  return spawn("train", "", args);
}

// The run starts again from its own settings.json: `train --resume` restores them itself
// (train/resume_settings.h); only a later end (--steps) is passed.
std::string RunStore::resume(const std::string& run_id, int64_t steps) {
  const fs::path dir = resolve_inside(root_, run_id);
  for (const auto& r : list())
    if (r["id"] == run_id && r["status"] == "running")
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[ui] run {} is still running", run_id));
  std::vector<std::string> args = {"train", "--json", "--output", root_.string(), "--resume", dir.string()};
  if (steps > 0) args.push_back(fmt::format("--steps={}", steps));
  return spawn("train", run_id, args);
}

json RunStore::stop(const std::string& run_id) {
  const fs::path dir = resolve_inside(root_, run_id);
  std::error_code ec;
  const fs::path metrics = fs::weakly_canonical(dir / "metrics.jsonl", ec);
  // Only `backprop train` itself: any program may hold the file open (a `tail -f`, an editor).
  std::vector<pid_t> others;
  pid_t trainer = 0;
  for_each_open_file([&](pid_t pid, const std::string& target) {
    if (fs::path(target) != metrics) return true;
    if (is_backprop_train(pid)) {
      trainer = pid;
      return false;
    }
    others.push_back(pid);
    return true;
  });
  if (trainer == 0)
    return {{"stopped", false},
            {"reason", others.empty() ? fmt::format("no backprop train process is training run {}", run_id)
                                      : fmt::format("no backprop train process is training run {} (other programs "
                                                    "have its metrics open; none was signalled)",
                                                    run_id)}};
  if (::kill(trainer, SIGINT) != 0)
    return {{"stopped", false},
            {"pid", trainer},
            {"reason", fmt::format("could not signal process {}: {}", trainer, std::strerror(errno))}};
  return {{"stopped", true}, {"pid", trainer}};
}

std::string RunStore::start_export(const std::string& run_id, const std::string& format,
                                   const std::string& quantization, bool ollama) {
  const fs::path dir = resolve_inside(root_, run_id);
  std::vector<std::string> args = {"export", dir.string(), "--json", "--format=" + format};
  if (format == "gguf") {
    args.push_back("--quantization=" + quantization);
    if (ollama) args.push_back("--ollama");
  }
  return spawn("export", run_id, args);
}

}  // namespace bp::ui
