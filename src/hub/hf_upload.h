// Uploading a folder's files to a Hugging Face hub repository in one commit, with the API paths
// huggingface_hub's HfApi uses (the hub's documented HTTP API; nothing of it is copied):
//
//   POST {endpoint}/api/repos/create                      {"name", "organization", "private"}: 200 made,
//        409 exists already (fine); 403 with the repository readable = no right to create, but it exists
//   POST {endpoint}/api/models/{repo}/branch/{branch}     a missing branch, made from main (409: exists)
//   POST {endpoint}/api/models/{repo}/preupload/{rev}     {"files": [{"path", "sample" (base64 of the
//        first 512 bytes), "size"}]} -> {"files": [{"path", "uploadMode": "lfs"|"regular", "shouldIgnore"}]}
//   POST {endpoint}/{repo}.git/info/lfs/objects/batch     Git LFS batch API, operation "upload",
//        transfers basic and multipart, objects [{"oid": sha256, "size"}] -> per object either no
//        "actions" (the hub has it already: skipped) or actions.upload {href, header} and maybe
//        actions.verify. basic: PUT the file to href. multipart: header.chunk_size and one URL per part
//        under the keys "1", "2", ...; each part PUT, its ETag kept, then POST href (the completion
//        URL) {"oid", "parts": [{"partNumber", "etag"}]}. verify: POST {"oid", "size"}.
//   POST {endpoint}/api/models/{repo}/commit/{rev}        NDJSON: {"key": "header", "value": {"summary",
//        "description"}}, {"key": "file", "value": {"path", "content" (base64), "encoding": "base64"}}
//        per regular file, {"key": "lfsFile", "value": {"path", "algo": "sha256", "oid", "size"}} per
//        LFS file -> {"commitUrl", "commitOid"}
//
// Resuming: a push that stopped (a broken connection, the retries spent, Ctrl-C) is run again.
// LFS objects the hub already holds come back without actions and are not sent again. Within a
// multipart upload every part's ETag is written, as it is acknowledged, to
// <state_dir>/<oid>.json with the completion URL's sha256; when the hub hands out the same
// upload again (the same completion URL), the parts listed there are not sent again. The file's
// sha256 is its LFS oid: the hub checks the bytes against it when the upload is completed, and the
// file is hashed again after its upload so a file changed meanwhile is refused before the commit.
// The state file holds no URL and no token.
//
// Retries: a broken connection, 429 and 5xx answers are retried up to max_retries times, waiting
// retry_wait_s, doubled each time (at most 30 s), or a 429's Retry-After (at most 60 s).
// Errors: 401/403 -> DEP_HUB_AUTH_FAILED, 404 -> DEP_HUB_NOT_FOUND, the rest (retries spent, other
// answers, a file the hub refuses) -> DEP_HUB_UPLOAD_FAILED; each with what to do. The token is
// sent to the endpoint's origin only (hf_http.h), never printed: the messages name whether one was sent.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "hub/hf_cache.h"

namespace bp::hub {

struct UploadFile {
  std::string path_in_repo;  // "adapter_model.safetensors", "README.md"
  std::string local_path;
};

struct UploadProgress {
  std::string file;  // path in the repository
  uint64_t bytes_done = 0, bytes_total = 0;
};

struct UploadRequest {
  std::string repo_id;  // org/name
  std::string revision = "main";
  bool private_repo = false;
  std::string commit_message, commit_description;
  std::vector<UploadFile> files;
  std::string state_dir;  // multipart part records (resume); "" = none kept
  int max_retries = 5;
  double retry_wait_s = 1;
  std::function<void(const UploadProgress&)> progress;
  std::function<void(const std::string&)> on_event;  // one line per step ("created ...", "retrying ...")
};

struct UploadResult {
  std::string repo_url, commit_url, commit_oid;
  bool created_repo = false, created_branch = false;
  std::vector<std::string> regular_files, lfs_files;  // paths in the repository, as committed
  std::vector<std::string> lfs_skipped;               // LFS files the hub already had
  std::vector<std::string> ignored;                   // files the hub said to leave out (shouldIgnore)
  uint64_t bytes_sent = 0;                            // LFS bytes sent in this run
  int parts_sent = 0, parts_resumed = 0;              // multipart: sent now, found acknowledged earlier
  int retries = 0;                                    // requests repeated after 429/5xx/broken connections
};

// Creates the repository (and branch) when needed, uploads the files and commits them. `o` gives
// the endpoint, token and timeout. Throws the errors of the file comment; a bad repo_id or
// revision -> INPUT_VALIDATION_FAILED before any request.
UploadResult upload_to_hub(const UploadRequest& request, const HubOptions& o);

// "org/name" as the hub allows it (the same shape parse_hub_ref accepts, without a revision):
// empty when usable, else why not.
std::string hub_repo_id_problem(const std::string& repo_id);

// Standard base64 (with '=' padding), for the commit's file contents and the preupload samples.
std::string base64_encode(std::string_view bytes);

}  // namespace bp::hub
