// Checkpoints (DESIGN.md "Checkpoints").
//
// A checkpoint is a folder <root>/checkpoint-<step>/ holding the files the trainer hands over
// (trainable weights, optimizer state — any writer), trainer_state.json and manifest.json with
// the size and SHA-256 of every other file. It is built in checkpoint-<step>.partial/, every file
// and the folder fsynced, then renamed; so a folder without ".partial" is complete unless the
// disk itself damaged it, and the manifest catches that. Resume takes the newest checkpoint
// whose manifest verifies; damaged ones are reported (STATE_CHECKPOINT_INVALID) and skipped.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace bp {

struct CheckpointFile {
  std::string name;                                    // file name inside the checkpoint folder
  std::function<void(const std::string& path)> write;  // writes the file at `path` (may throw)
};

struct CheckpointInfo {
  std::string path;
  int64_t step = 0;
  nlohmann::json trainer_state;
};

class CheckpointStore {
 public:
  explicit CheckpointStore(std::string root);
  const std::string& root() const { return root_; }

  // Deletes leftover *.partial folders of interrupted writes; returns their paths.
  std::vector<std::string> remove_stale_partials() const;
  // Writes checkpoint-<step> atomically; returns its path. On failure (e.g. STATE_DISK_FULL) the
  // partial folder is removed, earlier checkpoints are untouched, and the error propagates.
  std::string write(int64_t step, const std::vector<CheckpointFile>& files, const nlohmann::json& trainer_state) const;
  // Complete checkpoint folders, oldest first (by step).
  std::vector<CheckpointInfo> list() const;
  // Newest checkpoint that verifies; on_invalid is told about each damaged one skipped.
  std::optional<CheckpointInfo> latest_valid(
      const std::function<void(const std::string& path, const Error& why)>& on_invalid = {}) const;
  // Keeps the newest keep_last checkpoints and `keep_also` (the best by eval loss); deletes the rest.
  std::vector<std::string> prune(int keep_last, const std::string& keep_also = "") const;

  // Checks manifest sizes and checksums; returns trainer_state.json. Throws STATE_CHECKPOINT_INVALID.
  static nlohmann::json verify(const std::string& checkpoint_dir);

 private:
  std::string root_;
};

}  // namespace bp
