// Checkpoints (DESIGN.md "Checkpoints").
//
// A checkpoint is a folder <root>/checkpoint-<step>/ holding the files the trainer hands over
// (trainable weights, optimizer state — any writer), trainer_state.json and manifest.json with
// the size and SHA-256 of every other file. It is built in checkpoint-<step>.partial/, every file
// and the folder fsynced, then renamed; so a folder without ".partial" is complete unless the
// disk itself damaged it, and the manifest catches that. Resume takes the newest checkpoint
// whose manifest verifies; damaged ones are reported (STATE_CHECKPOINT_INVALID) and skipped.
//
// Re-writing a step that already has a folder (the final save after a periodic one) never has a
// moment without a complete checkpoint: the old folder is renamed aside to checkpoint-<step>.old,
// the new one renamed in, and only then the aside folder deleted. recover_interrupted_writes()
// (run before resuming) promotes a leftover .partial or .old folder whose manifest verifies when
// its step has no complete folder, and deletes the rest.
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

  // Tidies what an interrupted write left (*.partial, *.old): a leftover whose manifest verifies
  // and whose step has no complete checkpoint-<step> folder is renamed into place (the newest
  // such: .partial before .old); every other leftover is deleted. Returns one line per action.
  std::vector<std::string> recover_interrupted_writes() const;
  // Writes checkpoint-<step> atomically; returns its path. On failure (e.g. STATE_DISK_FULL) the
  // partial folder is removed, earlier checkpoints are untouched, and the error propagates.
  std::string write(int64_t step, const std::vector<CheckpointFile>& files, const nlohmann::json& trainer_state) const;
  // Complete checkpoint folders, oldest first (by step).
  std::vector<CheckpointInfo> list() const;
  // Newest checkpoint that verifies and passes `check` (which throws STATE_CHECKPOINT_INVALID to
  // skip a checkpoint; any other error propagates); on_invalid is told about each one skipped,
  // including folders named checkpoint-<digits> whose number does not fit a step.
  std::optional<CheckpointInfo> latest_valid(
      const std::function<void(const std::string& path, const Error& why)>& on_invalid = {},
      const std::function<void(const CheckpointInfo&)>& check = {}) const;
  // Keeps the newest keep_last checkpoints and `keep_also` (the best by eval loss); deletes the
  // rest. keep_last <= 0 keeps every checkpoint (--keep-checkpoints 0 = keep all).
  std::vector<std::string> prune(int keep_last, const std::string& keep_also = "") const;

  // Checks manifest sizes and checksums; returns trainer_state.json (a JSON object). Throws
  // STATE_CHECKPOINT_INVALID for anything malformed, wrong JSON types included.
  static nlohmann::json verify(const std::string& checkpoint_dir);
  // The suggestion of a STATE_DISK_FULL raised while writing: names the newest checkpoint left,
  // or says that there is none.
  std::string disk_full_suggestion() const;

 private:
  std::string root_;
};

}  // namespace bp
