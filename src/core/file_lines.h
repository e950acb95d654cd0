// Reading a user's (or a run's) line-based file safely: core/file_read.h's rules for a file read
// line by line. metrics.jsonl is the case: `runs`, `show-run`, the UI and a resume read it, and a
// metrics.jsonl linked to /dev/zero must be refused, not read until memory runs out.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "core/file_read.h"

namespace bp {

// Calls `line` with each line (without its '\n') of a regular file no larger than the cap of
// `kind`, reading it in pieces: the file is never held whole, and a line longer than
// max_line_bytes (not a record anyone wrote) is skipped instead of growing without bound.
// Throws as read_file_capped does (INPUT_FILE_NOT_REGULAR, INPUT_FILE_TOO_LARGE, reader.open_error).
// Returns the number of lines skipped for their length.
size_t for_each_line_capped(const std::string& path, FileKind kind, const FileReader& reader,
                            const std::function<void(std::string_view)>& line, size_t max_line_bytes = 16 << 20);

}  // namespace bp
