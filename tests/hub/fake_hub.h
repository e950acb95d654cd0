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

 private:
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

#include "hub/fake_hub_impl.h"  // IWYU pragma: keep
