// Append-only record files (issue 37): a run's metrics.jsonl and the JSON-lines log files
// (--log-file, the run folder's log). A record that cannot be written (a full disk, a quota, an I/O
// error) is not dropped silently:
//   * the first failure of a file is reported once through `on_failure` (what, which file, the
//     errno text: the caller warns on stderr and in the log);
//   * the unwritten bytes stay buffered and are written before the next record (a disk that has
//     room again gets every record, in order); the buffer holds at most kMaxPendingBytes, and
//     records that no longer fit it are lost;
//   * records lost (over the buffer, or still unwritten at close()) are counted: the trainer puts
//     the count into summary.json and `train` exits 3 (partial success).
// A short write keeps its unwritten tail, so a record is never written twice or cut in half on disk
// by a retry.
//
// Fault injection for tests (record_write_faults(), set from training.fault_inject_records_*):
// record writes fail with ENOSPC once a byte budget is spent, for a number of attempts or for good.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace bp {

struct RecordWriteFaults {
  // Record writes fail after this many more bytes (-1 = never).
  int64_t fail_after_bytes = -1;
  // How many write attempts fail from then on (0 = every one: the disk stays full).
  int64_t failing_writes = 0;
  int fail_errno = ENOSPC;
};
RecordWriteFaults& record_write_faults();

class RecordFile {
 public:
  static constexpr size_t kMaxPendingBytes = size_t{4} << 20;

  RecordFile() = default;
  ~RecordFile();
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;

  // Takes an open file descriptor (opened for appending); `what` names the file in messages
  // ("metrics.jsonl", "log file").
  void attach(int fd, std::string path, std::string what);
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

  // Called once, at the first failed write, with a message naming the file and the errno text.
  void set_on_failure(std::function<void(const std::string&)> f) { on_failure_ = std::move(f); }

  // Appends a record (whole lines, each ending in '\n'); earlier unwritten records go first.
  // Returns false while records are waiting (this one may be among them).
  bool write(std::string_view record);
  // Tries the waiting records once more; true when none wait.
  bool flush_pending();
  // Flushes what it can, then closes: records still waiting are counted as lost.
  void close();

  uint64_t records_lost() const { return lost_; }
  uint64_t records_waiting() const { return waiting_records_; }
  bool failed() const { return failed_; }  // a write has failed at least once

 private:
  bool write_some();  // writes pending_ as far as it goes; false on a failure
  int fd_ = -1;
  std::string path_, what_;
  std::string pending_;           // unwritten bytes: whole records, the first maybe begun
  uint64_t waiting_records_ = 0;  // records (lines) in pending_, counting a begun one
  uint64_t lost_ = 0;
  bool failed_ = false;
  std::function<void(const std::string&)> on_failure_;
};

}  // namespace bp
