// Reading files a user hands us, safely (issue 13: "nothing hangs").
//
// Every file backprop reads from a user — a TOML config, config.json, tokenizer files, datasets,
// adapter configs, safetensors and GGUF files, logs for `doctor` — goes through these functions:
//   * open_regular_file opens without blocking (O_NONBLOCK, so a FIFO cannot hang the open) and
//     refuses anything but a regular file: directories, FIFOs, sockets, character and block
//     devices (/dev/zero would be read forever) -> INPUT_FILE_NOT_REGULAR naming the path;
//   * read_file_capped reads a whole file only when it is below the cap of its kind
//     (limits.max_*_bytes settings) -> INPUT_FILE_TOO_LARGE with the size and the cap;
//   * parse_json_bounded refuses JSON nested deeper than kMaxJsonFileDepth before parsing it
//     (nlohmann's copies and dumps recurse once per level: 100,000 levels overflow the stack)
//     -> INPUT_JSON_TOO_DEEP naming the file.
// Failures to open (missing file, no permission) throw the caller's own code, so each reader keeps
// its wording ("[tokenizer] ... cannot open", DEP_MODEL_LOAD_FAILED).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"

namespace bp {

// Which cap applies to a file.
enum class FileKind {
  Config,     // TOML settings, config.json, generation_config.json, adapter_config.json, index files
  Tokenizer,  // tokenizer.json, tokenizer_config.json, chat_template.jinja
  Dataset,    // training and evaluation data
};

// The caps, in bytes. Settings::load sets them from the limits.* settings (environment first, so
// the --config file itself is read under the environment's cap); these defaults match the table.
struct FileReadLimits {
  uint64_t config_bytes = uint64_t{64} << 20;
  uint64_t tokenizer_bytes = uint64_t{1} << 30;
  uint64_t dataset_bytes = uint64_t{64} << 30;
};
FileReadLimits& file_read_limits();
uint64_t file_read_cap(FileKind kind);
const char* file_read_cap_setting(FileKind kind);  // "limits.max_config_bytes", ...

// Deepest JSON nesting accepted in files we read (Hugging Face files nest fewer than 10 levels).
inline constexpr int kMaxJsonFileDepth = 256;

// How a reader names itself and what it throws when the file cannot be opened at all.
struct FileReader {
  std::string_view component;  // "tokenizer" -> messages start with "[tokenizer]"
  ErrorCode open_error = ErrorCode::INPUT_VALIDATION_FAILED;
};

// An open regular file: fd (blocking mode restored, close-on-exec) and its size. Closes on destruction.
class OpenFile {
 public:
  OpenFile(int fd, uint64_t size) : fd_(fd), size_(size) {}
  ~OpenFile();
  OpenFile(OpenFile&& o) noexcept : fd_(o.fd_), size_(o.size_) { o.fd_ = -1; }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
  OpenFile& operator=(OpenFile&&) = delete;
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

 private:
  friend OpenFile open_regular_file(const std::string& path, const FileReader& reader);
  int fd_;
  uint64_t size_;
};

// Opens `path` for reading; throws INPUT_FILE_NOT_REGULAR for anything but a regular file and
// reader.open_error when it cannot be opened.
OpenFile open_regular_file(const std::string& path, const FileReader& reader);
// Throws INPUT_FILE_NOT_REGULAR when `path` exists and is not a regular file (no open; used for
// paths written to, such as --log-file, where a FIFO or a directory must be refused up front).
void check_not_special_file(const std::string& path, std::string_view component);
// The whole file, when it is a regular file no larger than the cap of `kind`.
std::string read_file_capped(const std::string& path, FileKind kind, const FileReader& reader);
// Throws INPUT_FILE_TOO_LARGE when `bytes` is over the cap of `kind` (for readers that map files).
void check_file_size(const std::string& path, uint64_t bytes, FileKind kind, std::string_view component);

// Deepest nesting of [ and { outside strings (an upper bound for invalid JSON).
int json_nesting_depth(std::string_view text);
// Throws INPUT_JSON_TOO_DEEP naming `source` when json_nesting_depth(text) > max_depth.
void check_json_depth(std::string_view text, const std::string& source, std::string_view component,
                      int max_depth = kMaxJsonFileDepth);
// Parses `text` (from `source`, for messages); INPUT_JSON_TOO_DEEP past max_depth. Invalid JSON
// (including trailing garbage) gives a discarded value, for the caller to report in its words.
nlohmann::json parse_json_bounded(std::string_view text, const std::string& source, std::string_view component,
                                  int max_depth = kMaxJsonFileDepth);
// read_file_capped + parse_json_bounded.
nlohmann::json read_json_file_capped(const std::string& path, FileKind kind, const FileReader& reader);

}  // namespace bp
