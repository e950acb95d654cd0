// `--model` (and hf:// data files) for every command: one call that hands the reference to hub::resolve_model_source
// with the settings (model.offline) and the environment (HF_* variables), and draws the download progress bar on stderr
// (in place on a terminal, one line per file and per 10% otherwise).
#pragma once

#include <string>

#include "hub/hf_cache.h"

namespace bp::cli {

// The local path to load for `reference` (a folder as given, or the Hugging Face cache snapshot of
// an org/name[@revision], downloaded when missing). Empty stays empty.
// `need` says which files a hub download fetches (estimate-vram: config only).
std::string resolve_model(const std::string& reference, hub::ModelFiles need = hub::ModelFiles::All);

// A data file for every command that reads one (--data, --eval-data, validate, data report|split,
// eval): a path as given, or the cached file of an hf://datasets/ORG/NAME/PATH[@REV] reference,
// downloaded when missing (hub/hf_dataset.h), with the same progress bar and --offline.
std::string resolve_data(const std::string& reference);

}  // namespace bp::cli
