// Safe reading of user files (contracts in core/file_read.h and core/file_lines.h).
#include "core/file_read.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/file_lines.h"

namespace bp {

namespace {

const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void not_regular(const std::string& path, mode_t mode, std::string_view component) {
  throw Error(ErrorCode::INPUT_FILE_NOT_REGULAR,
              fmt::format("[{}] {} is {}, not a regular file", component, path, file_type_name(mode)),
              {{"path", path}, {"file_type", file_type_name(mode)}});
}

// read(2) of up to `size` bytes, retried on EINTR; 0 at the end of the file. A read error throws
// reader.open_error naming the file.
size_t read_some(const OpenFile& file, char* data, size_t size, const std::string& path, const FileReader& reader) {
  for (;;) {
    const ssize_t n = ::read(file.fd(), data, size);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno != EINTR)
      throw Error(reader.open_error,
                  fmt::format("[{}] cannot read {}: {}", reader.component, path, std::strerror(errno)),
                  {{"path", path}});
  }
}

}  // namespace

FileReadLimits& file_read_limits() {
  static FileReadLimits limits;
  return limits;
}

uint64_t file_read_cap(FileKind kind) {
  const FileReadLimits& l = file_read_limits();
  switch (kind) {
    case FileKind::Config: return l.config_bytes;
    case FileKind::Tokenizer: return l.tokenizer_bytes;
    case FileKind::Dataset: return l.dataset_bytes;
  }
  return l.config_bytes;
}

const char* file_read_cap_setting(FileKind kind) {
  switch (kind) {
    case FileKind::Config: return "limits.max_config_bytes";
    case FileKind::Tokenizer: return "limits.max_tokenizer_bytes";
    case FileKind::Dataset: return "limits.max_dataset_bytes";
  }
  return "limits.max_config_bytes";
}

OpenFile::~OpenFile() {
  if (fd_ >= 0) ::close(fd_);
}

OpenFile open_regular_file(const std::string& path, const FileReader& reader) {
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) not_regular(path, st.st_mode, reader.component);
    throw Error(reader.open_error, fmt::format("[{}] cannot open {}: {}", reader.component, path, std::strerror(err)),
                {{"path", path}});
  }
  OpenFile file(fd, 0);  // closes fd if a check below throws
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw Error(reader.open_error, fmt::format("[{}] cannot stat {}: {}", reader.component, path, std::strerror(errno)),
                {{"path", path}});
  if (!S_ISREG(st.st_mode)) not_regular(path, st.st_mode, reader.component);
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  file.size_ = static_cast<uint64_t>(st.st_size);
  return file;
}

void check_not_special_file(const std::string& path, std::string_view component) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) not_regular(path, st.st_mode, component);
}

void check_file_size(const std::string& path, uint64_t bytes, FileKind kind, std::string_view component) {
  const uint64_t cap = file_read_cap(kind);
  if (bytes <= cap) return;
  const char* key = file_read_cap_setting(kind);
  throw Error(ErrorCode::INPUT_FILE_TOO_LARGE,
              fmt::format("[{}] {} is {} bytes, larger than the {}-byte cap for this kind of file ({})", component,
                          path, bytes, cap, key),
              {{"path", path}, {"bytes", bytes}, {"cap_bytes", cap}, {"key", key}});
}

std::string read_file_capped(const std::string& path, FileKind kind, const FileReader& reader) {
  const OpenFile file = open_regular_file(path, reader);
  check_file_size(path, file.size(), kind, reader.component);
  // Read at most cap + 1 bytes whatever fstat said: a file that grows while we read stays capped.
  const uint64_t cap = file_read_cap(kind);
  std::string out;
  out.resize(static_cast<size_t>(file.size()));
  size_t have = 0;
  for (;;) {
    if (have == out.size()) {
      if (have > cap) break;
      out.resize(std::max<size_t>(out.size() + 4096, std::min<uint64_t>(out.size() * 2, cap + 1)));
    }
    const size_t n = read_some(file, out.data() + have, out.size() - have, path, reader);
    if (n == 0) break;
    have += n;
  }
  out.resize(have);
  check_file_size(path, have, kind, reader.component);
  return out;
}

// core/file_lines.h
size_t for_each_line_capped(const std::string& path, FileKind kind, const FileReader& reader,
                            const std::function<void(std::string_view)>& line, size_t max_line_bytes) {
  const OpenFile file = open_regular_file(path, reader);
  check_file_size(path, file.size(), kind, reader.component);
  uint64_t total = 0;
  size_t skipped = 0;
  bool too_long = false;  // inside a line already past max_line_bytes: drop until its '\n'
  std::string pending;
  std::vector<char> buf(size_t{1} << 16);
  for (;;) {
    const size_t n = read_some(file, buf.data(), buf.size(), path, reader);
    if (n == 0) break;
    total += n;
    check_file_size(path, total, kind, reader.component);  // a file that grows while we read stays capped
    std::string_view chunk(buf.data(), n);
    for (size_t nl; (nl = chunk.find('\n')) != std::string_view::npos; chunk.remove_prefix(nl + 1)) {
      if (!too_long && pending.size() + nl <= max_line_bytes) {
        pending.append(chunk.substr(0, nl));
        line(pending);
      } else {
        ++skipped;
      }
      pending.clear();
      too_long = false;
    }
    if (too_long || pending.size() + chunk.size() > max_line_bytes) {
      too_long = true;
      pending.clear();
    } else {
      pending.append(chunk);
    }
  }
  if (too_long)
    ++skipped;
  else if (!pending.empty())
    line(pending);
  return skipped;
}

int json_nesting_depth(std::string_view s) {
  int depth = 0, best = 0;
  bool in_str = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      best = std::max(best, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return best;
}

void check_json_depth(std::string_view text, const std::string& source, std::string_view component, int max_depth) {
  const int depth = json_nesting_depth(text);
  if (depth > max_depth)
    throw Error(ErrorCode::INPUT_JSON_TOO_DEEP,
                fmt::format("[{}] {}: JSON nested {} levels deep; at most {} are accepted", component, source, depth,
                            max_depth),
                {{"path", source}, {"depth", depth}, {"max_depth", max_depth}});
}

nlohmann::json parse_json_bounded(std::string_view text, const std::string& source, std::string_view component,
                                  int max_depth) {
  check_json_depth(text, source, component, max_depth);
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

nlohmann::json read_json_file_capped(const std::string& path, FileKind kind, const FileReader& reader) {
  return parse_json_bounded(read_file_capped(path, kind, reader), path, reader.component);
}

}  // namespace bp
