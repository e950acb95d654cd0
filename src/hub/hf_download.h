// Downloading a model from the Hugging Face hub into the local cache (hf_cache.h), with the API
// paths huggingface_hub uses:
//
//   GET  {endpoint}/api/models/{repo}/revision/{revision}  -> {"sha": commit, "siblings": [{"rfilename"}]}
//   HEAD {endpoint}/{repo}/resolve/{commit}/{file}         -> X-Repo-Commit, ETag or X-Linked-Etag (the
//        LFS sha256) and X-Linked-Size; an LFS file answers with a redirect to its CDN URL
//   GET  that URL (Range: bytes=N- to resume)               -> the bytes
//
// Only what training needs is fetched: config.json, generation_config.json, the tokenizer files,
// chat_template.jinja, and the safetensors weights (model.safetensors, or the index and the shards
// it names). A file is written to blobs/<etag>.incomplete, resumed from its size after a broken
// connection (in this run, up to max_attempts, and in the next run), checked against its LFS
// sha256 and size, then renamed to blobs/<etag> and linked from snapshots/<commit>/.
//
// Errors: 401/403 (gated or private) and 404 -> DEP_MODEL_LOAD_FAILED with the fixes; a connection
// that keeps failing or a checksum mismatch -> DEP_MODEL_DOWNLOAD_FAILED (running again resumes).
// Nothing from the hub is trusted (issue 37, hf_names.h): a listed or indexed file name that would
// leave the snapshot -> DEP_MODEL_LOAD_FAILED before any file call; an ETag that is not a blob name
// or a size header that is not a byte count -> DEP_MODEL_DOWNLOAD_FAILED naming the header; the
// hub's text (X-Error-Message, URLs) is escaped and cut before it reaches a message. A file larger
// than the free space of the cache's file system, or a write failing with ENOSPC mid-file ->
// STATE_DISK_FULL with the bytes needed and free (the partial file is kept and resumed).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "hub/hf_cache.h"

namespace bp::hub {

// Downloads what is missing of ref into the cache and returns the snapshot folder. Writes
// refs/<revision> = commit. Never call with o.offline.
std::string download_snapshot(const HubRepoRef& ref, const HubOptions& o);

// One file of a repository (a dataset's data file: hf_dataset.h), through the same revision API,
// blob download, resume and sha256 check: GET {endpoint}/api/datasets/{repo}/revision/{rev}, then
// {endpoint}/datasets/{repo}/resolve/{commit}/{file}. Returns snapshots/<commit>/<file>; writes
// refs/<revision>. For a dataset, 401/403/404 (a private or gated dataset without a token, or no such
// dataset, revision or file) are INPUT_DATASET_NOT_FOUND; the rest as above. Never call with o.offline.
std::string download_repo_file(const HubRepoRef& ref, const std::string& file, const HubOptions& o);

// Tests: replaces the free bytes of the cache's file system at a folder (empty = statvfs).
std::function<uint64_t(const std::string&)>& hub_free_disk_bytes_for_tests();

}  // namespace bp::hub
