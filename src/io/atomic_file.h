// Crash-safe file output (DESIGN.md "Checkpoints").
//
// AtomicFile writes to "<path>.tmp", fsyncs, and renames over <path> on commit(); if it is
// destroyed without commit() (an exception, a crash) the temporary is removed and <path> is
// untouched. Write failures throw: ENOSPC/EDQUOT -> STATE_DISK_FULL, anything else ->
// RUNTIME_EXPORT_FAILED (callers may rethrow with their own code).
//
// Fault injection for tests (io_faults()): fail writes with ENOSPC once a byte budget is spent,
// or SIGKILL the process at a named point ("checkpoint:after_weights", ...), to prove that
// nothing half-written is ever taken for a finished file.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace bp {

struct IoFaults {
  // Writes fail with ENOSPC after this many more bytes (-1 = never): the one disk-full hook of
  // every crash-safe writer (checkpoints, settings, GGUF exports).
  int64_t enospc_after_bytes = -1;
  // The errno of that failure (tests of other write errors set EIO, say).
  int fail_errno = ENOSPC;
  // kill -9 self when crash_point(name) is reached with this name ("" = never).
  std::string crash_at;
};
IoFaults& io_faults();
// Called at named points of multi-file writes; kills the process if io_faults().crash_at matches.
void crash_point(std::string_view name);

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // Large streamed files (GGUF exports): every ~8 MiB written is handed to the disk at once and
  // the range before it waited for, so the disk works while the caller produces the next bytes,
  // the final fsync has little left, and dirty pages stay bounded (Linux sync_file_range).
  void stream_to_disk() { streaming_ = true; }
  size_t bytes_written() const { return written_; }
  // fsync + rename + fsync of the parent folder.
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_path_;
  int fd_ = -1;
  size_t written_ = 0;
  bool committed_ = false;
  bool streaming_ = false;
  size_t writeback_started_ = 0, writeback_waited_ = 0;  // ranges [0, started) handed over, [0, waited) done
  void writeback(bool wait_all);
};

// The suggestion of STATE_DISK_FULL raised by a file write (the catalog's default speaks of a
// previous checkpoint, which a file write cannot know about; CheckpointStore words its own).
inline constexpr const char* kDiskFullFileSuggestion =
    "Free disk space (or point --output elsewhere) and run the command again; the unfinished file was removed, "
    "files written before are untouched.";

// Whole-file helpers.
void write_file_atomic(const std::string& path, std::string_view contents);
// A small file whole (regular files only, capped at limits.max_config_bytes: core/file_read.h);
// throws INPUT_VALIDATION_FAILED when unreadable.
std::string read_file(const std::string& path);
void fsync_dir(const std::string& dir);
// Free bytes on the file system holding `path` (or its nearest existing parent).
uint64_t free_disk_bytes(const std::string& path);
// Throws STATE_DISK_FULL when fewer than `bytes_needed` are free at `path`.
void require_free_space(const std::string& path, uint64_t bytes_needed, std::string_view what);
// Moves the finished folder `partial` to `final_dir` so that a complete folder exists at every
// moment: an existing final_dir is renamed to "<final_dir>.old" first and deleted only after the
// new one is in place (a crash in between leaves both complete; see CheckpointStore's recovery).
// Crash points "<crash_prefix>:after_set_aside" and "<crash_prefix>:before_remove_aside". If a
// rename fails, the old folder is put back and the error propagates.
void promote_folder(const std::string& partial, const std::string& final_dir, std::string_view crash_prefix);
// Creates `dir` (and its parents) and proves a file can be created in it. Throws
// INPUT_VALIDATION_FAILED (a user error) naming `what`, the path and the reason (read-only file system, no
// permission, a file in the way), or STATE_DISK_FULL when the disk is full.
void ensure_writable_dir(const std::string& dir, std::string_view what);

}  // namespace bp
