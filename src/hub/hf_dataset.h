// Dataset files from the Hugging Face hub (issue 43): `--data hf://datasets/org/name/path/file.jsonl`
// (also `--eval-data`, `validate`, `data report|split`, `eval`), fetched into the same cache as models
// (<cache>/datasets--org--name/, laid out as huggingface_hub lays it out) by the same downloader
// (hf_download.h download_repo_file: resume, sha256, escaped server text) and read as a local file.
//
// The reference, as huggingface_hub's HfFileSystem writes it, with the revision after the name or at
// the end:
//   hf://datasets/ORG/NAME/PATH               revision main
//   hf://datasets/ORG/NAME@REVISION/PATH      a branch, tag or 40-hex commit
//   hf://datasets/ORG/NAME/PATH@REVISION      the same (the form `backprop` prints)
// PATH is the file's path inside the repository (one file; no globs). Offline (--offline,
// HF_HUB_OFFLINE=1) the cached copy is used or the command stops with INPUT_DATASET_NOT_FOUND.
#pragma once

#include <optional>
#include <string>

#include "hub/hf_cache.h"

namespace bp::hub {

struct HubDatasetRef {
  HubRepoRef repo;   // type Dataset
  std::string file;  // path inside the repository
};

// True for anything starting with "hf://" (then parse_dataset_ref decides whether it is usable).
bool is_hub_dataset_reference(const std::string& s);
// The parts of an hf://datasets/... reference; INPUT_VALIDATION_FAILED naming what is wrong (not
// hf://datasets/, no org/name, no file, a revision or file name the hub rules refuse: hf_names.h).
HubDatasetRef parse_dataset_ref(const std::string& s);

// The local file for `reference`: itself when it is not hf://, else the cached snapshot file,
// downloaded when missing (never with o.offline: then INPUT_DATASET_NOT_FOUND with the fix).
std::string resolve_dataset_file(const std::string& reference, const HubOptions& o);

}  // namespace bp::hub
