// The upload routes of the fake hub (see fake_hub.h), written from the hub's documented HTTP API
// (repos/create, branch, preupload, the Git LFS batch API with basic and multipart transfers,
// the NDJSON commit). Included by fake_hub.h, so every definition is inline.
#pragma once

#include <httplib.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "io/sha256.h"

namespace bp::test {

namespace fake_hub_detail {
inline std::string base64_decode(const std::string& in) {
  std::string out;
  uint32_t buf = 0;
  int bits = 0;
  for (char ch : in) {
    int v = ch >= 'A' && ch <= 'Z'   ? ch - 'A'
            : ch >= 'a' && ch <= 'z' ? ch - 'a' + 26
            : ch >= '0' && ch <= '9' ? ch - '0' + 52
            : ch == '+'              ? 62
            : ch == '/'              ? 63
                                     : -1;
    if (v < 0) continue;  // '=' padding
    buf = (buf << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buf >> bits) & 0xff);
    }
  }
  return out;
}

inline void hub_error(httplib::Response& res, int status, const std::string& code, const std::string& message) {
  res.status = status;
  if (!code.empty()) res.set_header("X-Error-Code", code);
  res.set_header("X-Error-Message", message);
  res.set_content(nlohmann::json{{"error", message}}.dump(), "application/json");
}
}  // namespace fake_hub_detail

inline void FakeHub::fail(const std::string& path_part, int status, int count, const std::string& retry_after,
                          int skip) {
  std::lock_guard<std::mutex> l(mu_);
  failures_.push_back({path_part, status, count, retry_after, skip});
}

inline std::vector<FakeCommit> FakeHub::commits() {
  std::lock_guard<std::mutex> l(mu_);
  return commits_;
}

inline void FakeHub::forget_uploads() {
  std::lock_guard<std::mutex> l(mu_);
  upload_ids_.clear();
  parts_.clear();
}

inline bool FakeHub::has_repo(const std::string& repo_id) {
  std::lock_guard<std::mutex> l(mu_);
  return repos_.count(repo_id) > 0;
}

inline bool FakeHub::is_private(const std::string& repo_id) {
  std::lock_guard<std::mutex> l(mu_);
  return private_.count(repo_id) && private_.at(repo_id);
}

inline bool FakeHub::has_blob(const std::string& sha256) {
  std::lock_guard<std::mutex> l(mu_);
  return blobs_.count(sha256) > 0;
}

inline bool FakeHub::injected_failure(const httplib::Request& req, httplib::Response& res) {
  record(req);
  std::lock_guard<std::mutex> l(mu_);
  for (auto& f : failures_)
    if (f.count > 0 && req.path.find(f.path_part) != std::string::npos) {
      if (f.skip > 0) {
        --f.skip;
        continue;
      }
      --f.count;
      fake_hub_detail::hub_error(res, f.status, "", "injected failure");
      if (!f.retry_after.empty()) res.set_header("Retry-After", f.retry_after);
      return true;
    }
  return false;
}

inline bool FakeHub::write_refused(const httplib::Request& req, httplib::Response& res) {
  if (write_token.empty()) return false;
  const std::string auth = req.get_header_value("Authorization");
  if (auth.empty()) {
    fake_hub_detail::hub_error(res, 401, "", "Invalid username or password.");
    return true;
  }
  if (auth != "Bearer " + write_token) {
    fake_hub_detail::hub_error(res, 403, "", "You don't have the rights to create a model under this namespace");
    return true;
  }
  return false;
}

inline void FakeHub::add_upload_routes() {
  using fake_hub_detail::hub_error;
  using nlohmann::json;
  srv_.Post("/api/repos/create", [this](const httplib::Request& req, httplib::Response& res) {
    if (injected_failure(req, res)) return;
    std::lock_guard<std::mutex> l(mu_);
    if (write_refused(req, res)) return;
    const json j = json::parse(req.body, nullptr, false);
    if (!j.is_object() || !j.contains("name") || !j.contains("organization"))
      return hub_error(res, 400, "", "name and organization are required");
    const std::string repo = j["organization"].get<std::string>() + "/" + j["name"].get<std::string>();
    if (repos_.count(repo)) return hub_error(res, 409, "", "You already created this model repo");
    repos_[repo] = {std::string(40, '0'), {}};
    private_[repo] = j.value("private", false);
    branches_[repo] = {"main"};
    res.set_content(json{{"url", endpoint() + "/" + repo}}.dump(), "application/json");
  });
  srv_.Get(R"(/api/models/([^/]+)/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (injected_failure(req, res)) return;
    std::lock_guard<std::mutex> l(mu_);
    const std::string repo = std::string(req.matches[1]) + "/" + std::string(req.matches[2]);
    auto it = repos_.find(repo);
    if (it == repos_.end()) return hub_error(res, 404, "RepoNotFound", "Repository not found");
    json j = {{"id", repo}, {"sha", it->second.sha}, {"private", private_.count(repo) && private_[repo]}};
    if (licenses.count(repo)) j["cardData"] = {{"license", licenses[repo]}};
    res.set_content(j.dump(), "application/json");
  });
  // Every /api/models/{org}/{name}/{what}/{rev} write: the repository and (but for branch) the revision must exist.
  auto repo_and_rev = [this](const httplib::Request& req, httplib::Response& res, bool need_rev, std::string* repo,
                             std::string* rev) {
    *repo = std::string(req.matches[1]) + "/" + std::string(req.matches[2]);
    *rev = req.matches[3];
    if (write_refused(req, res)) return false;
    if (!repos_.count(*repo)) {
      hub_error(res, 404, "RepoNotFound", "Repository not found");
      return false;
    }
    auto& b = branches_[*repo];
    if (b.empty()) b.push_back("main");
    if (need_rev && std::find(b.begin(), b.end(), *rev) == b.end()) {
      hub_error(res, 404, "RevisionNotFound", "Invalid rev id: " + *rev);
      return false;
    }
    return true;
  };
  srv_.Post(R"(/api/models/([^/]+)/([^/]+)/branch/(.+))",
            [=, this](const httplib::Request& req, httplib::Response& res) {
              if (injected_failure(req, res)) return;
              std::lock_guard<std::mutex> l(mu_);
              std::string repo, rev;
              if (!repo_and_rev(req, res, false, &repo, &rev)) return;
              auto& b = branches_[repo];
              if (std::find(b.begin(), b.end(), rev) != b.end())
                return hub_error(res, 409, "", "Reference already exists");
              b.push_back(rev);
              res.set_content("{}", "application/json");
            });
  srv_.Post(R"(/api/models/([^/]+)/([^/]+)/preupload/(.+))", [=, this](const httplib::Request& req,
                                                                       httplib::Response& res) {
    if (injected_failure(req, res)) return;
    std::lock_guard<std::mutex> l(mu_);
    std::string repo, rev;
    if (!repo_and_rev(req, res, true, &repo, &rev)) return;
    const json j = json::parse(req.body, nullptr, false);
    if (!j.is_object() || !j.contains("files")) return hub_error(res, 400, "", "files is required");
    json out = {{"files", json::array()}};
    for (const auto& f : j["files"]) {
      const std::string path = f.at("path").get<std::string>();
      const bool lfs = fake_hub_detail::ends_with(path, ".safetensors") || fake_hub_detail::ends_with(path, ".gguf") ||
                       fake_hub_detail::ends_with(path, ".bin") || f.at("size").get<uint64_t>() > lfs_threshold;
      out["files"].push_back({{"path", path}, {"uploadMode", lfs ? "lfs" : "regular"}, {"shouldIgnore", false}});
    }
    res.set_content(out.dump(), "application/json");
  });
  srv_.Post(
      R"(/([^/]+)/([^/]+)\.git/info/lfs/objects/batch)", [this](const httplib::Request& req, httplib::Response& res) {
        if (injected_failure(req, res)) return;
        std::lock_guard<std::mutex> l(mu_);
        if (write_refused(req, res)) return;
        const std::string repo = std::string(req.matches[1]) + "/" + std::string(req.matches[2]);
        if (!repos_.count(repo)) return hub_error(res, 404, "RepoNotFound", "Repository not found");
        const json j = json::parse(req.body, nullptr, false);
        if (!j.is_object() || j.value("operation", "") != "upload")
          return hub_error(res, 422, "", "operation must be upload");
        json out = {{"transfer", "basic"}, {"objects", json::array()}};
        for (const auto& o : j.at("objects")) {
          const std::string oid = o.at("oid").get<std::string>();
          const uint64_t size = o.at("size").get<uint64_t>();
          json entry = {{"oid", oid}, {"size", size}};
          if (!blobs_.count(oid)) {
            const json verify = {{"href", endpoint() + "/lfs-verify/" + oid}, {"header", json::object()}};
            if (size > multipart_threshold) {
              out["transfer"] = "multipart";
              std::string& id = upload_ids_[oid];
              if (id.empty()) id = sha256_hex(oid + std::to_string(++uploads_started_)).substr(0, 16);
              json header = {{"chunk_size", std::to_string(chunk_size)}};
              for (uint64_t p = 1; (p - 1) * chunk_size < size; ++p)
                header[std::to_string(p)] = cdn_endpoint() + "/upload/" + oid + "/" + id + "/" + std::to_string(p);
              entry["actions"] = {
                  {"upload", {{"href", endpoint() + "/lfs-complete/" + oid + "/" + id}, {"header", header}}},
                  {"verify", verify}};
            } else {
              entry["actions"] = {{"upload", {{"href", cdn_endpoint() + "/upload/" + oid}, {"header", json::object()}}},
                                  {"verify", verify}};
            }
          }
          out["objects"].push_back(entry);
        }
        res.set_content(out.dump(), "application/vnd.git-lfs+json");
      });
  cdn_srv_.Put(R"(/upload/([0-9a-f]{64}))", [this](const httplib::Request& req, httplib::Response& res) {
    if (injected_failure(req, res)) return;
    std::lock_guard<std::mutex> l(mu_);
    const std::string oid = req.matches[1];
    if (sha256_hex(req.body) != oid) return hub_error(res, 400, "", "the bytes do not hash to the oid");
    blobs_[oid] = req.body;
  });
  cdn_srv_.Put(R"(/upload/([0-9a-f]{64})/([0-9a-f]+)/([0-9]+))",
               [this](const httplib::Request& req, httplib::Response& res) {
                 if (injected_failure(req, res)) return;
                 std::lock_guard<std::mutex> l(mu_);
                 parts_[req.matches[2]][std::stoi(req.matches[3])] = req.body;
                 res.set_header("ETag", "\"" + sha256_hex(req.body).substr(0, 32) + "\"");
               });
  srv_.Post(R"(/lfs-complete/([0-9a-f]{64})/([0-9a-f]+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (injected_failure(req, res)) return;
    std::lock_guard<std::mutex> l(mu_);
    const std::string oid = req.matches[1], id = req.matches[2];
    const json j = json::parse(req.body, nullptr, false);
    if (!j.is_object() || j.value("oid", "") != oid || !j.contains("parts"))
      return hub_error(res, 400, "", "bad payload");
    const auto& stored = parts_[id];
    std::string bytes;
    int expect = 1;
    for (const auto& p : j["parts"]) {
      const int n = p.at("partNumber").get<int>();
      if (n != expect++ || !stored.count(n) ||
          p.at("etag").get<std::string>() != "\"" + sha256_hex(stored.at(n)).substr(0, 32) + "\"")
        return hub_error(res, 400, "", "part " + std::to_string(n) + " is missing or its etag differs");
      bytes += stored.at(n);
    }
    if (sha256_hex(bytes) != oid) return hub_error(res, 400, "", "the parts do not hash to the oid");
    blobs_[oid] = bytes;
    parts_.erase(id);
    upload_ids_.erase(oid);
    res.set_content("{}", "application/json");
  });
  srv_.Post(R"(/lfs-verify/([0-9a-f]{64}))", [this](const httplib::Request& req, httplib::Response& res) {
    if (injected_failure(req, res)) return;
    std::lock_guard<std::mutex> l(mu_);
    if (!blobs_.count(req.matches[1])) return hub_error(res, 404, "", "object not found");
    res.set_content("{}", "application/json");
  });
  srv_.Post(
      R"(/api/models/([^/]+)/([^/]+)/commit/(.+))", [=, this](const httplib::Request& req, httplib::Response& res) {
        if (injected_failure(req, res)) return;
        std::lock_guard<std::mutex> l(mu_);
        std::string repo, rev;
        if (!repo_and_rev(req, res, true, &repo, &rev)) return;
        FakeCommit c{repo, rev, "", {}, {}};
        std::istringstream lines(req.body);
        std::string line;
        while (std::getline(lines, line)) {
          if (line.empty()) continue;
          const json j = json::parse(line, nullptr, false);
          if (!j.is_object() || !j.contains("key") || !j.contains("value"))
            return hub_error(res, 400, "", "bad NDJSON line");
          const std::string key = j["key"];
          const json& v = j["value"];
          if (key == "header") {
            c.summary = v.value("summary", "");
          } else if (key == "file") {
            c.files[v.at("path")] = v.value("encoding", "") == "base64"
                                        ? fake_hub_detail::base64_decode(v.at("content").get<std::string>())
                                        : v.at("content").get<std::string>();
          } else if (key == "lfsFile") {
            const std::string oid = v.at("oid");
            if (!blobs_.count(oid) || blobs_[oid].size() != v.at("size").get<uint64_t>())
              return hub_error(res, 422, "", "LFS file " + v.at("path").get<std::string>() + " was not uploaded");
            c.files[v.at("path")] = blobs_[oid];
            c.lfs_paths.push_back(v.at("path"));
          } else {
            return hub_error(res, 400, "", "unknown key " + key);
          }
        }
        if (c.summary.empty()) return hub_error(res, 400, "", "the commit has no summary");
        Repo& r = repos_[repo];
        const std::string oid = sha256_hex(r.sha + req.body).substr(0, 40);
        if (rev == "main") {
          r.sha = oid;
          for (const auto& [path, bytes] : c.files) r.files[path] = bytes;
        }
        commits_.push_back(c);
        res.set_content(json{{"commitUrl", endpoint() + "/" + repo + "/commit/" + oid}, {"commitOid", oid}}.dump(),
                        "application/json");
      });
}

}  // namespace bp::test
