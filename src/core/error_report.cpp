#include "core/error_report.h"

#include <fmt/format.h>

#include <cerrno>

#include "core/redact.h"

namespace bp {

namespace {
nlohmann::json redact_json(const nlohmann::json& j) {
  if (j.is_string()) return redact(j.get<std::string>());
  if (j.is_object() || j.is_array()) {
    nlohmann::json out = j;
    for (auto it = out.begin(); it != out.end(); ++it) *it = redact_json(*it);
    return out;
  }
  return j;
}
}  // namespace

Error error_from_filesystem(const std::filesystem::filesystem_error& e) {
  const int err = e.code().value();
  const std::string path = e.path1().string();
  if (err == ENOSPC || err == EDQUOT) return Error(ErrorCode::STATE_DISK_FULL, std::string("[fs] ") + e.what());
  if (err == EACCES || err == EPERM || err == EROFS || err == ENOTDIR || err == EEXIST || err == EISDIR ||
      err == ENOENT || err == ENAMETOOLONG)
    return std::move(Error(ErrorCode::INPUT_VALIDATION_FAILED, std::string("[fs] ") + e.what(), {{"path", path}})
                         .with_suggestion("Check the path named in the message: a folder you can write to, with no "
                                          "file in the way."));
  return Error(ErrorCode::RUNTIME_INTERNAL, std::string("[fs] ") + e.what());
}

std::string render_error_text(const Error& e, const std::string& run_id) {
  std::string s = fmt::format("[ERROR] [{}] {}\n", e.info().name, redact(e.what()));
  if (!run_id.empty()) s += fmt::format("Run id: {}\n", run_id);
  s += fmt::format("Suggestion: {}\n", redact(e.suggestion()));
  return s;
}

nlohmann::json render_error_json(const Error& e, const std::string& run_id) {
  return {{"code", e.info().name},
          {"message", redact(e.what())},
          {"retryable", retryable_name(e.info().retryable)},
          {"suggestion", redact(e.suggestion())},
          {"details", redact_json(e.details())},
          {"run_id", run_id.empty() ? nlohmann::json(nullptr) : nlohmann::json(run_id)}};
}

std::string error_catalog_markdown() {
  std::string s =
      "# Error codes\n\n"
      "<!-- Generated from src/core/error_catalog.inc by `backprop info --error-codes --markdown`;\n"
      "     do not edit by hand (a test fails when this file is stale). -->\n\n"
      "Every error `backprop` reports carries one of these codes. The command prints\n"
      "`[ERROR] [CODE] message`, then `Run id: ...` when a run exists, then `Suggestion: ...`;\n"
      "with `--json` it prints `{code, message, retryable, suggestion, details, run_id}`.\n\n"
      "Exit codes: 0 ok, 1 user error (config and input codes), 2 runtime error (dependency,\n"
      "runtime and state codes), 3 partial success (`train`: the run is saved, but some of its records\n"
      "could not be written, e.g. on a full disk; summary.json's `records_lost` counts them), 130\n"
      "interrupted (`RUNTIME_TRAINING_ABORTED`).\n\n"
      "| Code | Category | Retryable | Exit code |\n|---|---|---|---|\n";
  for (const auto& e : error_catalog())
    s += fmt::format(
        "| [`{}`](#{}) | {} | {} | {} |\n", e.name,
        [&] {
          std::string a = e.name;
          for (auto& c : a) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          return a;
        }(),
        e.category, retryable_name(e.retryable), exit_code_for(e.code));
  for (const auto& e : error_catalog())
    s += fmt::format("\n## {}\n\n- Category: {}\n- Retryable: {}\n- When: {}\n- What to do: {}\n", e.name, e.category,
                     retryable_name(e.retryable), e.trigger, e.suggestion);
  return s;
}

}  // namespace bp
