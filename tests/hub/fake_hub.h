// A fake Hugging Face hub for the tests: a cpp-httplib server on 127.0.0.1 (ephemeral port) that
// answers the paths huggingface_hub uses, as the hub does:
//   GET  /api/models/{org}/{name}/revision/{rev}  {"sha", "siblings": [{"rfilename"}]}; 401 + X-Error-Code
//        GatedRepo for a gated repository (403 when a token was sent), 404 RepoNotFound / RevisionNotFound
//   HEAD|GET /{org}/{name}/resolve/{sha}/{file}   small files: 200, ETag (git sha1) and X-Repo-Commit;
//        LFS files (*.safetensors): 302 to /cdn/{sha256} with X-Linked-Etag and X-Linked-Size
//   GET  /api/datasets/..., /datasets/{org}/{name}/resolve/...  the same for dataset repositories
//   GET  /cdn/{sha256}                            the bytes, with Range support (206), from a second
//                                                 server: the CDN is another origin, as on the real hub
// plus a renamed repository (old-org/* answers 307 with a relative Location to org/*), a connection
// cut after `cut_after_bytes` bytes for the next `cuts_left` CDN answers, and a repository whose
// LFS sha256 is wrong, and the hostile answers of issue 37 (any revision accepted, extra listed
// names, a chosen X-Error-Message, replaced /resolve/ headers). Every request is recorded (path, Range, Authorization).
//
// Uploads (fake_hub_upload_impl.h), as the hub's documented API answers them:
//   POST /api/repos/create                       {"name", "organization", "private"}: 200, 409 when it exists
//   GET  /api/models/{org}/{name}                {"id", "private", "cardData": {"license"}}; 404 RepoNotFound
//   POST /api/models/{org}/{name}/branch/{b}     200, 409 when it exists
//   POST /api/models/{org}/{name}/preupload/{rev}  uploadMode "lfs" for *.safetensors, *.gguf, *.bin and files
//        larger than lfs_threshold, else "regular"
//   POST /{org}/{name}.git/info/lfs/objects/batch  no actions for an oid the hub has; else basic (PUT to the
//        CDN origin's /upload/{oid}, then verify) or, above multipart_threshold, multipart: chunk_size and
//        part URLs on the CDN origin, the same upload id (completion URL) until it is completed
//   PUT  /upload/{oid}[/{id}/{part}]             on the CDN origin (no token expected there); a part answers
//        its ETag; a basic upload whose bytes do not hash to oid is refused (400)
//   POST /lfs-complete/{oid}/{id}                {"oid", "parts"}: every part, ETags matching, the bytes hashing
//        to oid -> stored; else 400
//   POST /api/models/{org}/{name}/commit/{rev}   NDJSON header / file (base64) / lfsFile lines; an lfsFile the
//        hub does not hold -> 422; a commit to main replaces the files the download routes serve
// With write_token set, every write answers 401 without a token and 403 with another one. fail()
// makes the next `count` requests whose path contains a string answer a status (with Retry-After).
#pragma once

#include <httplib.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace bp::test {

// The bytes of a file ("" when unreadable).
std::string read_bytes(const std::string& path);

struct FakeRequest {
  std::string method, path, range, authorization;
  std::string body;  // uploads: what was sent (parts and files as bytes)
};

// A commit the fake hub took.
struct FakeCommit {
  std::string repo, revision, summary;
  std::map<std::string, std::string> files;  // path -> bytes (LFS files resolved to their bytes)
  std::vector<std::string> lfs_paths;
};

class FakeHub {
 public:
  FakeHub();
  ~FakeHub();
  // Serves files under repo `repo_id` ("org/name", or "datasets/org/name" for a dataset) at commit
  // `sha`; names ending in .safetensors (and a dataset's .jsonl files) are LFS files.
  void add_repo(const std::string& repo_id, const std::string& sha, const std::map<std::string, std::string>& files);
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string cdn_endpoint() const { return "http://127.0.0.1:" + std::to_string(cdn_port_); }  // another origin
  std::vector<FakeRequest> requests();
  void clear_requests();
  size_t count_requests(const std::string& path_part);

  std::vector<std::string> gated;  // repos answering 401 (403 with a token)
  std::string wrong_sha256_repo;   // its LFS files advertise a wrong sha256
  uint64_t cut_after_bytes = 0;    // with cuts_left > 0: the CDN closes the connection here
  int cuts_left = 0;
  // A hostile or broken hub (issue 37):
  bool any_revision = false;                // the API answers every revision with the repo's commit
  std::vector<std::string> extra_siblings;  // names added to every file listing
  std::vector<std::string> unlisted;        // files served but left out of the listing
  std::string error_message;                // X-Error-Message of gated answers ("" = the hub's words)
  std::map<std::string, std::map<std::string, std::string>> header_overrides;  // file -> resolve headers
  // Uploads:
  std::string write_token;                      // "" = writes need no token
  uint64_t lfs_threshold = 10 << 20;            // larger files go through LFS whatever their name
  uint64_t multipart_threshold = 1ull << 40;    // larger LFS objects are uploaded in parts
  uint64_t chunk_size = 5 << 20;                // of a multipart upload
  std::map<std::string, std::string> licenses;  // repo -> cardData.license
  // The next `count` requests whose path contains path_part, after `skip` of them pass, answer `status`.
  void fail(const std::string& path_part, int status, int count, const std::string& retry_after = "", int skip = 0);
  std::vector<FakeCommit> commits();
  void forget_uploads();  // open multipart uploads expire: the next batch answer starts new ones
  bool has_repo(const std::string& repo_id);
  bool is_private(const std::string& repo_id);
  bool has_blob(const std::string& sha256);

 private:
  struct Failure {
    std::string path_part;
    int status, count;
    std::string retry_after;
    int skip;
  };
  void add_upload_routes();
  bool injected_failure(const httplib::Request& req, httplib::Response& res);  // locks mu_
  bool write_refused(const httplib::Request& req, httplib::Response& res);     // mu_ held
  std::vector<Failure> failures_;
  std::map<std::string, bool> private_;                       // repo -> private
  std::map<std::string, std::vector<std::string>> branches_;  // repo -> branches
  std::map<std::string, std::string> upload_ids_;             // oid -> open multipart upload
  int uploads_started_ = 0;                                   // names new upload ids
  std::map<std::string, std::map<int, std::string>> parts_;   // upload id -> part -> bytes
  std::vector<FakeCommit> commits_;

  struct Repo {
    std::string sha;
    std::map<std::string, std::string> files;
  };
  void record(const httplib::Request& req);
  httplib::Server srv_, cdn_srv_;
  std::thread thread_, cdn_thread_;
  int port_ = 0, cdn_port_ = 0;
  std::mutex mu_;
  std::map<std::string, Repo> repos_;
  std::map<std::string, std::string> blobs_;  // sha256 -> bytes
  std::vector<FakeRequest> requests_;
};

}  // namespace bp::test

#include "hub/fake_hub_impl.h"         // IWYU pragma: keep
#include "hub/fake_hub_upload_impl.h"  // IWYU pragma: keep
