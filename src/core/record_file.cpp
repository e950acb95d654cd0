// Append-only record files with a bounded retry buffer (contract in core/record_file.h).
#include "core/record_file.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace bp {

namespace {
std::mutex& faults_mutex() {  // the trainer's metrics and the logger's sinks write from several threads
  static std::mutex m;
  return m;
}

// ::write, or the injected failure: how many bytes of `size` were written, or -1 with errno set.
ssize_t write_or_fault(int fd, const char* data, size_t size) {
  {
    std::lock_guard<std::mutex> lock(faults_mutex());
    RecordWriteFaults& f = record_write_faults();
    if (f.fail_after_bytes == 0) {
      if (f.failing_writes > 0 && --f.failing_writes == 0) f.fail_after_bytes = -1;  // room again after this one
      errno = f.fail_errno;
      return -1;
    }
    if (f.fail_after_bytes > 0) {
      size = std::min<size_t>(size, static_cast<size_t>(f.fail_after_bytes));  // a short write at the edge
      f.fail_after_bytes -= static_cast<int64_t>(size);
    }
  }
  return ::write(fd, data, size);
}
}  // namespace

RecordWriteFaults& record_write_faults() {
  static RecordWriteFaults faults;
  return faults;
}

RecordFile::~RecordFile() {
  close();
}

void RecordFile::attach(int fd, std::string path, std::string what) {
  close();
  fd_ = fd;
  path_ = std::move(path);
  what_ = std::move(what);
}

bool RecordFile::write_some() {
  while (!pending_.empty()) {
    const ssize_t n = write_or_fault(fd_, pending_.data(), pending_.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      if (!failed_ && on_failure_)
        on_failure_(
            fmt::format("[records] cannot write the {} {}: {}; its records are kept in memory (up to {}) and "
                        "written when there is room again, and any that are lost are counted in the run's "
                        "summary.json",
                        what_, path_, std::strerror(err), format_bytes(kMaxPendingBytes)));
      failed_ = true;
      return false;
    }
    const auto done = static_cast<size_t>(n);
    waiting_records_ -= static_cast<uint64_t>(std::count(pending_.begin(), pending_.begin() + done, '\n'));
    pending_.erase(0, done);
  }
  return true;
}

bool RecordFile::write(std::string_view record) {
  if (fd_ < 0) return false;
  const auto lines = static_cast<uint64_t>(std::count(record.begin(), record.end(), '\n'));
  if (!pending_.empty() && pending_.size() + record.size() > kMaxPendingBytes) {
    lost_ += lines;  // the buffer is full: these are lost, the ones before them keep their order
  } else {
    pending_.append(record);
    waiting_records_ += lines;
  }
  return write_some();
}

bool RecordFile::flush_pending() {
  return fd_ < 0 || write_some();
}

void RecordFile::close() {
  if (fd_ < 0) return;
  write_some();
  lost_ += waiting_records_;
  waiting_records_ = 0;
  pending_.clear();
  ::close(fd_);
  fd_ = -1;
}

}  // namespace bp
