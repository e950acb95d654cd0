// Logging (DESIGN.md "Logs"): one process-wide spdlog logger (also spdlog's default, so library
// code just calls spdlog::info(...)) with
//   - a console sink on stderr: human lines ("12:00:01.234 [info] message") or, with
//     logging.format=json, the same JSON records as the file;
//   - optional JSON-lines file sinks (--log-file, and the run folder's log once a run starts):
//     {"ts": "...Z", "level": "info", "run_id": "<uuid4>", "msg": "..."} on every line.
// Every sink passes the message through redact() before writing it.
//
// The run id is a UUID4 made when logging starts (it identifies this invocation in every record);
// begin_run() marks that a training run exists (optionally adopting a resumed run's id), after
// which errors print "Run id: ...".
#pragma once

#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace bp {
class Settings;
}

namespace bp::log {

// Where console records go instead of a FILE* (the Python package hands them to Python's `logging`):
// spdlog's level (0 trace ... 5 critical) and the redacted message, without time or level prefix.
using ConsoleHandler = std::function<void(int level, const std::string& message)>;

struct LogOptions {
  std::string level = "info";      // trace|debug|info|warn|error|off
  std::string format = "console";  // console|json
  std::string file;                // JSON-lines file; empty = none
  FILE* console = stderr;          // console sink target (tests pass a temporary file)
  ConsoleHandler console_handler;  // when set, console records go here (format console) instead
  std::string console_level;       // when set, the console shows only this level and above (the file all)
};

// (Re)configures the logger. Throws CONFIG_INVALID_SETTING for an unknown level or format and
// INPUT_VALIDATION_FAILED when the log file cannot be opened.
void init(const LogOptions& options);
// logging.level/format/file from settings; security.redact_secrets; registers secret settings
// (the password of ui.auth) with the redactor. In rank r > 0 of a data-parallel launch (mpirun,
// srun: core/collective.h) the console shows warnings and errors only (rank 0 speaks for the run)
// and the log file is FILE.rank<r>, so every rank keeps its whole log.
void init_from_settings(const Settings& settings, ConsoleHandler console_handler = {});
// Adds another JSON-lines file sink (a run folder's log). Same errors as init.
void add_file(const std::string& path);
void flush();
// Per JSON-lines file sink: its path and the records that could not be written to it (a full
// disk; see core/record_file.h), counting those still waiting for room. The trainer puts them in
// summary.json.
std::vector<std::pair<std::string, uint64_t>> records_lost();
// The error a command ends with, as one record in the JSON-lines files only (the console shows the
// error its own way, cli/main.cpp): the usual ts/level/run_id/msg with level "error" and msg
// "[CODE] message", plus `fields` (render_error_json: code, message, suggestion, retryable,
// details), so `backprop doctor <log file>` recognises it by its code. No file sink: nothing.
void record_error_in_files(const nlohmann::json& fields);

// This invocation's run id (a UUID4, created on first use).
std::string run_id();
// Marks that a run exists; with a non-empty id (a resumed run) that id becomes the run id.
void begin_run(const std::string& id = "");
bool run_started();

}  // namespace bp::log
