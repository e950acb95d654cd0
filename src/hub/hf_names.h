// Names and text a model source hands us, checked before they reach a path or a terminal
// (issue 37: a hostile hub, index.json or Ollama store must not write outside the cache or
// reach the user's terminal with escape sequences).
//
//   revisions   "org/name@REV": a git branch or tag name as `git check-ref-format` allows it
//               (no "..", "@{", "//", control characters, space, \ ~ ^ : ? * [, no leading '/'
//               or '-', no trailing '/', '.' or ".lock", no component starting with '.'), at most
//               255 bytes, or a 40-hex commit. Checked before refs/<revision> is made.
//   file names  a repository file (the hub's listing, an index's weight_map): a relative path of
//               '/'-separated components, none empty, "." or "..", no '\', no control bytes, at
//               most 255 bytes a component and 1024 in all. Checked before any filesystem call.
//   blob names  an ETag used as blobs/<etag>: 1-128 of [A-Za-z0-9_-] (hex in practice).
//   sizes       X-Linked-Size / Content-Length: decimal digits only, no overflow.
//   server text X-Error-Message, error bodies, URLs from Location: printable ASCII kept, every
//               other byte written as \xNN, cut at 300 bytes, before it goes into a message.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace bp::hub {

// Empty when `revision` is a usable branch, tag or commit; else why not.
std::string revision_problem(std::string_view revision);
// Throws INPUT_VALIDATION_FAILED (with a suggestion) for a revision revision_problem refuses.
void check_revision(const std::string& repo_id, const std::string& revision);

// Empty when `name` is a safe relative file name inside a snapshot; else why not.
std::string remote_file_problem(std::string_view name);
// Throws DEP_MODEL_LOAD_FAILED naming `name` (sanitized), where it came from and why it is refused.
void check_remote_file_name(std::string_view name, const std::string& source, const std::string& repo_id);

bool is_safe_blob_name(std::string_view etag);
// The value of a size header; nullopt unless it is 1-20 decimal digits that fit 64 bits.
std::optional<uint64_t> parse_size_header(std::string_view text);

// Server-provided text made safe to print (see the file comment).
std::string sanitize_server_text(std::string_view text, size_t max_bytes = 300);

}  // namespace bp::hub
