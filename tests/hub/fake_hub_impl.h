// The fake Hugging Face hub of the hub tests (see fake_hub.h); included by fake_hub.h, so every
// definition is inline (the test folder compiles only *_test.cpp files).
#pragma once

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "io/sha256.h"

namespace bp::test {

namespace fake_hub_detail {
inline bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
// Weights are LFS files, and so are a dataset repository's data files (the hub's .gitattributes).
inline bool is_lfs(const std::string& repo, const std::string& file) {
  return ends_with(file, ".safetensors") || (repo.rfind("datasets/", 0) == 0 && ends_with(file, ".jsonl"));
}
}  // namespace fake_hub_detail

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

inline FakeHub::FakeHub() {
  // Datasets answer under /api/datasets/ and /datasets/{org}/{name}/resolve/, and are kept as
  // "datasets/org/name" (add_repo).
  srv_.Get(R"(/api/(models|datasets)/([^/]+)/([^/]+)/revision/(.+))",
           [this](const httplib::Request& req, httplib::Response& res) {
             record(req);
             const std::string prefix = req.matches[1] == "datasets" ? "datasets/" : "";
             const std::string org = req.matches[2], name = req.matches[3], rev = req.matches[4];
             if (org == "old-org") {  // a renamed repository: a relative redirect, as the hub answers
               res.status = 307;
               res.set_header("Location", "/api/models/org/" + name + "/revision/" + rev);
               return;
             }
             const std::string repo = prefix + org + "/" + name;
             std::lock_guard<std::mutex> l(mu_);
             if (std::find(gated.begin(), gated.end(), repo) != gated.end()) {
               res.status = req.has_header("Authorization") ? 403 : 401;
               res.set_header("X-Error-Code", "GatedRepo");
               res.set_header("X-Error-Message",
                              error_message.empty() ? "Access to model " + repo + " is restricted." : error_message);
               return;
             }
             auto it = repos_.find(repo);
             if (it == repos_.end() || (rev != "main" && rev != it->second.sha && !any_revision)) {
               res.status = 404;
               res.set_header("X-Error-Code", it == repos_.end() ? "RepoNotFound" : "RevisionNotFound");
               return;
             }
             nlohmann::json j = {{"id", repo}, {"sha", it->second.sha}, {"siblings", nlohmann::json::array()}};
             for (const auto& [f, bytes] : it->second.files)
               if (std::find(unlisted.begin(), unlisted.end(), f) == unlisted.end())
                 j["siblings"].push_back({{"rfilename", f}});
             j["siblings"].push_back({{"rfilename", "pytorch_model.bin"}});  // listed, never fetched
             for (const auto& f : extra_siblings) j["siblings"].push_back({{"rfilename", f}});
             res.set_content(j.dump(), "application/json");
           });
  srv_.Get(R"(/(datasets/)?([^/]+)/([^/]+)/resolve/([0-9a-f]+)/(.+))",
           [this](const httplib::Request& req, httplib::Response& res) {
             record(req);
             const std::string prefix = req.matches[1];
             const std::string org = req.matches[2], name = req.matches[3], sha = req.matches[4], file = req.matches[5];
             if (org == "old-org") {
               res.status = 307;
               res.set_header("Location", "/org/" + name + "/resolve/" + sha + "/" + file);
               return;
             }
             const std::string repo = prefix + org + "/" + name;
             std::lock_guard<std::mutex> l(mu_);
             auto it = repos_.find(repo);
             if (it == repos_.end() || it->second.sha != sha || !it->second.files.count(file)) {
               res.status = 404;
               res.set_header("X-Error-Code", "EntryNotFound");
               return;
             }
             const std::string& bytes = it->second.files.at(file);
             res.set_header("X-Repo-Commit", sha);
             const auto overrides =
                 header_overrides.count(file) ? header_overrides.at(file) : std::map<std::string, std::string>();
             auto header = [&](const std::string& k, const std::string& v) {
               res.set_header(k, overrides.count(k) ? overrides.at(k) : v);
             };
             if (fake_hub_detail::is_lfs(repo, file)) {
               const std::string digest = sha256_hex(bytes);
               const std::string advertised = repo == wrong_sha256_repo ? sha256_hex(bytes + "x") : digest;
               res.status = 302;
               res.set_header("Location", cdn_endpoint() + "/cdn/" + digest);
               header("X-Linked-Etag", "\"" + advertised + "\"");
               header("X-Linked-Size", std::to_string(bytes.size()));
               header("ETag", "\"" + sha256_hex("pointer" + file).substr(0, 40) + "\"");
               return;
             }
             header("ETag", "\"" + sha256_hex(bytes).substr(0, 40) + "\"");  // a git-sha1-shaped etag
             res.set_content(bytes, "application/octet-stream");
           });
  cdn_srv_.Get(R"(/cdn/([0-9a-f]{64}))", [this](const httplib::Request& req, httplib::Response& res) {
    record(req);
    std::lock_guard<std::mutex> l(mu_);
    auto it = blobs_.find(req.matches[1]);
    if (it == blobs_.end()) {
      res.status = 404;
      return;
    }
    if (cuts_left > 0) {  // a connection that breaks mid-file
      --cuts_left;
      const std::string bytes = it->second;
      const uint64_t cut = cut_after_bytes;
      res.set_content_provider(bytes.size(), "application/octet-stream",
                               [bytes, cut](size_t offset, size_t, httplib::DataSink& sink) {
                                 if (offset < cut) sink.write(bytes.data() + offset, cut - offset);
                                 return false;  // the server drops the connection here
                               });
      return;
    }
    res.set_content(it->second, "application/octet-stream");  // httplib answers Range with 206
  });
  add_upload_routes();
  port_ = srv_.bind_to_any_port("127.0.0.1");
  cdn_port_ = cdn_srv_.bind_to_any_port("127.0.0.1");
  thread_ = std::thread([this] { srv_.listen_after_bind(); });
  cdn_thread_ = std::thread([this] { cdn_srv_.listen_after_bind(); });
  while (!srv_.is_running() || !cdn_srv_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

inline FakeHub::~FakeHub() {
  srv_.stop();
  cdn_srv_.stop();
  thread_.join();
  cdn_thread_.join();
}

inline void FakeHub::add_repo(const std::string& repo_id, const std::string& sha,
                              const std::map<std::string, std::string>& files) {
  std::lock_guard<std::mutex> l(mu_);
  repos_[repo_id] = {sha, files};
  for (const auto& [f, bytes] : files)
    if (fake_hub_detail::is_lfs(repo_id, f)) blobs_[sha256_hex(bytes)] = bytes;
}

inline void FakeHub::record(const httplib::Request& req) {
  std::lock_guard<std::mutex> l(mu_);
  requests_.push_back(
      {req.method, req.path, req.get_header_value("Range"), req.get_header_value("Authorization"), req.body});
}

inline std::vector<FakeRequest> FakeHub::requests() {
  std::lock_guard<std::mutex> l(mu_);
  return requests_;
}

inline void FakeHub::clear_requests() {
  std::lock_guard<std::mutex> l(mu_);
  requests_.clear();
}

inline size_t FakeHub::count_requests(const std::string& path_part) {
  std::lock_guard<std::mutex> l(mu_);
  size_t n = 0;
  for (const auto& r : requests_) n += r.path.find(path_part) != std::string::npos;
  return n;
}

}  // namespace bp::test
