// How an error is shown to a person or a program (DESIGN.md "Errors"). Used by cli/ and ui/.
//   text: "[ERROR] [CODE] message\nRun id: <id>\nSuggestion: <suggestion>\n" (Run id only when a run exists)
//   json: {"code", "message", "retryable", "suggestion", "details", "run_id" (null without a run)}
// Message, suggestion and details are passed through redact().
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace bp {

std::string render_error_text(const Error& e, const std::string& run_id);
nlohmann::json render_error_json(const Error& e, const std::string& run_id);
// A std::filesystem error that escaped the library (a path that cannot be written or read) is the
// user's to fix, not a bug: a full disk is STATE_DISK_FULL; no permission, a read-only file system
// or a file in the way is INPUT_VALIDATION_FAILED naming the path; anything else RUNTIME_INTERNAL.
Error error_from_filesystem(const std::filesystem::filesystem_error& e);
// The catalog as a Markdown page (docs/errors.md is this text).
std::string error_catalog_markdown();

}  // namespace bp
