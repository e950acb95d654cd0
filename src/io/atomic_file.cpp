#include "io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_read.h"

namespace bp {

namespace fs = std::filesystem;

IoFaults& io_faults() {
  static IoFaults f;
  return f;
}

void crash_point(std::string_view name) {
  if (!io_faults().crash_at.empty() && io_faults().crash_at == name) {
    std::fprintf(stderr, "[fault] crash injected at %.*s\n", static_cast<int>(name.size()), name.data());
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
  }
}

static Error io_error(int err, const std::string& path, const char* what) {
  if (err == ENOSPC || err == EDQUOT)
    return std::move(Error(ErrorCode::STATE_DISK_FULL,
                           fmt::format("[io] no space left on device while {} {}", what, path), {{"path", path}})
                         .with_suggestion(kDiskFullFileSuggestion));
  return Error(ErrorCode::RUNTIME_EXPORT_FAILED, fmt::format("[io] {} {}: {}", what, path, std::strerror(err)),
               {{"path", path}, {"errno", err}});
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw io_error(errno, tmp_path_, "creating");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    size_t chunk = bytes;
    auto& f = io_faults();
    if (f.enospc_after_bytes >= 0) {
      if (f.enospc_after_bytes == 0) throw io_error(f.fail_errno, tmp_path_, "writing");
      chunk = std::min<size_t>(chunk, static_cast<size_t>(f.enospc_after_bytes));
      f.enospc_after_bytes -= static_cast<int64_t>(chunk);
    }
    ssize_t n = ::write(fd_, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error(errno, tmp_path_, "writing");
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
  if (streaming_) writeback(false);
}

void AtomicFile::writeback(bool wait_all) {
#if defined(__linux__)
  constexpr size_t kWritebackBytes = 8u << 20;
  if (written_ > writeback_started_ && (wait_all || written_ - writeback_started_ >= kWritebackBytes)) {
    ::sync_file_range(fd_, static_cast<off_t>(writeback_started_), static_cast<off_t>(written_ - writeback_started_),
                      SYNC_FILE_RANGE_WRITE);
    if (writeback_started_ > writeback_waited_)
      ::sync_file_range(fd_, static_cast<off_t>(writeback_waited_),
                        static_cast<off_t>(writeback_started_ - writeback_waited_),
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
    writeback_waited_ = writeback_started_;
    writeback_started_ = written_;
  }
#else
  (void)wait_all;
#endif
}

void AtomicFile::commit() {
  if (streaming_) writeback(true);  // errors surface in the fsync below
  if (::fsync(fd_) != 0) throw io_error(errno, tmp_path_, "syncing");
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) throw io_error(errno, path_, "renaming to");
  committed_ = true;
  fsync_dir(fs::path(path_).parent_path().string());
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  AtomicFile f(path);
  f.write(contents);
  f.commit();
}

std::string read_file(const std::string& path) {
  return read_file_capped(path, FileKind::Config, {"io", ErrorCode::INPUT_VALIDATION_FAILED});
}

void promote_folder(const std::string& partial, const std::string& final_dir, std::string_view crash_prefix) {
  namespace fs = std::filesystem;
  const std::string aside = final_dir + ".old";
  const std::string parent = fs::path(final_dir).parent_path().string();
  std::error_code ec;
  bool set_aside = false;
  try {
    if (fs::exists(final_dir, ec)) {
      fs::remove_all(aside, ec);
      fs::rename(final_dir, aside);
      set_aside = true;
      fsync_dir(parent);
      crash_point(fmt::format("{}:after_set_aside", crash_prefix));
    }
    fs::rename(partial, final_dir);
    fsync_dir(parent);
  } catch (...) {
    if (set_aside && !fs::exists(final_dir, ec)) fs::rename(aside, final_dir, ec);
    throw;
  }
  crash_point(fmt::format("{}:before_remove_aside", crash_prefix));
  fs::remove_all(aside, ec);
}

void ensure_writable_dir(const std::string& dir, std::string_view what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  int err = ec ? ec.value() : 0;
  if (!err && !fs::is_directory(dir, ec)) err = ENOTDIR;
  if (!err) {  // permissions and read-only mounts show only when a file is created
    const std::string probe = (fs::path(dir) / fmt::format(".backprop-write-check-{}", ::getpid())).string();
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      err = errno;
    } else {
      ::close(fd);
      ::unlink(probe.c_str());
    }
  }
  if (!err) return;
  const bool full = err == ENOSPC || err == EDQUOT;
  throw Error(full ? ErrorCode::STATE_DISK_FULL : ErrorCode::INPUT_VALIDATION_FAILED,
              fmt::format("[io] {} {} cannot be written: {}", what, dir, std::strerror(err)),
              {{"path", dir}, {"errno", err}})
      .with_suggestion(full ? "Free disk space or pass --output a folder on another disk."
                            : fmt::format("Pass --output a folder you can write to ({} is {}).", dir,
                                          err == ENOTDIR || err == EEXIST ? "not a folder" : "not writable"));
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

uint64_t free_disk_bytes(const std::string& path) {
  fs::path p = fs::absolute(path);
  while (!p.empty() && p != p.root_path() && !fs::exists(p)) p = p.parent_path();
  struct statvfs st {};
  if (::statvfs(p.empty() ? "/" : p.c_str(), &st) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

void require_free_space(const std::string& path, uint64_t bytes_needed, std::string_view what) {
  uint64_t free_b = free_disk_bytes(path);
  if (free_b < bytes_needed)
    throw Error(ErrorCode::STATE_DISK_FULL,
                fmt::format("[io] {} needs {} but only {} is free at {}", what, format_bytes(bytes_needed),
                            format_bytes(free_b), path),
                {{"bytes_needed", bytes_needed}, {"bytes_free", free_b}, {"path", path}})
        .with_suggestion(kDiskFullFileSuggestion);
}

}  // namespace bp
