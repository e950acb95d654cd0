// Upload to the Hugging Face hub in one commit (see hf_upload.h).
#include "hub/hf_upload.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/file_read.h"
#include "hub/hf_http.h"
#include "hub/hf_names.h"
#include "io/atomic_file.h"
#include "io/sha256.h"

namespace bp::hub {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr size_t kSampleBytes = 512;  // what preupload looks at to tell text from binary

struct Context {
  const UploadRequest& rq;
  const HubOptions& o;
  HubHttp http;
  UploadResult result;
};

struct LocalFile {
  UploadFile f;
  uint64_t size = 0;
  std::string sha256;
  bool lfs = false;
};

std::string repo_page(const Context& c) {
  return c.o.endpoint + "/" + c.rq.repo_id;
}

void event(const Context& c, const std::string& line) {
  if (c.rq.on_event) c.rq.on_event(line);
}

json details(const Context& c, const HttpReply& r) {
  return {{"repo", c.rq.repo_id},
          {"revision", c.rq.revision},
          {"endpoint", c.o.endpoint},
          {"status", r.status},
          {"url", sanitize_server_text(r.url, 1000)},
          {"x_error_code", sanitize_server_text(r.header("x-error-code"), 100)}};
}

// The hub's own words for a refusal: X-Error-Message, else an {"error": "..."} body.
std::string hub_said(const HttpReply& r) {
  std::string msg = r.header("x-error-message");
  if (msg.empty() && !r.body.empty()) {
    const json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("error") && j["error"].is_string()) msg = j["error"].get<std::string>();
  }
  return msg.empty() ? "" : fmt::format(" ('{}')", sanitize_server_text(msg));
}

[[noreturn]] void upload_failed(const Context& c, const std::string& what, json d = json::object()) {
  if (d.empty()) d = {{"repo", c.rq.repo_id}, {"revision", c.rq.revision}, {"endpoint", c.o.endpoint}};
  throw Error(ErrorCode::DEP_HUB_UPLOAD_FAILED, "[hub] " + what, d)
      .with_suggestion(fmt::format(
          "Run the push again: files the hub already has are skipped and a large file resumes from its last "
          "uploaded part. Check the connection and HF_ENDPOINT (now {}); --push-retries (now {}) retries "
          "rate-limited and failed requests longer.",
          c.o.endpoint, c.rq.max_retries));
}

// 401/403/404 and other refusals, in the words of the hub's own documentation.
[[noreturn]] void refuse(const Context& c, const HttpReply& r, const std::string& what) {
  const std::string url = sanitize_server_text(r.url, 1000);
  const std::string said = hub_said(r);
  if (!r.error.empty())
    upload_failed(c, fmt::format("{} failed after {} retries: {} ({})", what, c.rq.max_retries, r.error, url));
  const std::string token_note =
      c.o.token.empty() ? "no token was sent (HF_TOKEN is unset and there is no token file)" : "a token was sent";
  if (r.status == 401)
    throw Error(ErrorCode::DEP_HUB_AUTH_FAILED,
                fmt::format("[hub] {}: {} answered 401{}: the hub did not accept the credentials; {}", what, url, said,
                            token_note),
                details(c, r))
        .with_suggestion(fmt::format(
            "Log in with `huggingface-cli login` or set HF_TOKEN to a token with write access (made at {}/settings/"
            "tokens); HF_TOKEN_PATH names another token file.",
            c.o.endpoint));
  if (r.status == 403)
    throw Error(ErrorCode::DEP_HUB_AUTH_FAILED,
                fmt::format("[hub] {}: {} answered 403{}: the token may not write to '{}'; {}", what, url, said,
                            c.rq.repo_id, token_note),
                details(c, r))
        .with_suggestion(fmt::format(
            "Use a token with write access (a read token cannot push; a fine-grained token needs write rights on "
            "the namespace '{}'), or push to your own namespace: --repo <your-user>/{}.",
            c.rq.repo_id.substr(0, c.rq.repo_id.find('/')), c.rq.repo_id.substr(c.rq.repo_id.find('/') + 1)));
  if (r.status == 404) {
    const std::string code = r.header("x-error-code");
    const std::string which = code == "RevisionNotFound" ? fmt::format("revision '{}'", c.rq.revision)
                                                         : fmt::format("repository '{}'", c.rq.repo_id);
    throw Error(ErrorCode::DEP_HUB_NOT_FOUND,
                fmt::format("[hub] {}: {} not found on {} (404){}", what, which, c.o.endpoint, said), details(c, r))
        .with_suggestion(fmt::format(
            "Check --repo (org/name, case matters: the namespace must be your user or an organization you belong "
            "to) and --revision (now '{}'; a pull-request ref must exist already), and HF_ENDPOINT (now {}).",
            c.rq.revision, c.o.endpoint));
  }
  upload_failed(c, fmt::format("{}: {} answered HTTP {}{}", what, url, r.status, said), details(c, r));
}

bool retryable(const HttpReply& r) {
  return !r.error.empty() || r.status == 429 || r.status >= 500;
}

// The wait before retry number `attempt` (1-based): Retry-After of a 429 when it is a number of
// seconds, else retry_wait_s doubled per attempt.
double retry_wait(const Context& c, const HttpReply& r, int attempt) {
  if (r.status == 429) {
    const std::optional<uint64_t> after = parse_size_header(r.header("retry-after"));
    if (after) return std::min<double>(static_cast<double>(*after), 60.0);
  }
  return std::min(30.0, c.rq.retry_wait_s * std::pow(2.0, attempt - 1));
}

// Runs `call` until it gets an answer that is not a broken connection, 429 or 5xx, or the
// retries are spent; returns the last answer.
template <class Call>
HttpReply with_retries(Context& c, const std::string& what, Call&& call) {
  HttpReply r = call();
  for (int attempt = 1; attempt <= c.rq.max_retries && retryable(r); ++attempt) {
    const double wait_s = retry_wait(c, r, attempt);
    event(c,
          fmt::format("{}: {}; retry {} of {} in {:.1f} s", what,
                      r.error.empty() ? fmt::format("HTTP {}", r.status) : r.error, attempt, c.rq.max_retries, wait_s));
    std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
    ++c.result.retries;
    r = call();
  }
  return r;
}

bool ok(const HttpReply& r) {
  return r.error.empty() && r.status >= 200 && r.status < 300;
}

json parse_answer(const Context& c, const HttpReply& r, const std::string& what) {
  const json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    upload_failed(c, fmt::format("{}: {} answered {} bytes that are not a JSON object; is HF_ENDPOINT a Hugging Face "
                                 "hub?",
                                 what, sanitize_server_text(r.url, 1000), r.body.size()));
  return j;
}

std::string api(const Context& c, const std::string& what) {
  return fmt::format("{}/api/models/{}/{}/{}", c.o.endpoint, c.rq.repo_id, what, url_quote(c.rq.revision, false));
}

void create_repo(Context& c) {
  const auto slash = c.rq.repo_id.find('/');
  const json body = {{"name", c.rq.repo_id.substr(slash + 1)},
                     {"organization", c.rq.repo_id.substr(0, slash)},
                     {"private", c.rq.private_repo}};
  const std::string what = "creating " + c.rq.repo_id;
  HttpReply r = with_retries(c, what, [&] {
    return c.http.send("POST", c.o.endpoint + "/api/repos/create", body.dump(), "application/json");
  });
  if (ok(r)) {
    c.result.created_repo = true;
    event(c, fmt::format("created {} ({})", repo_page(c), c.rq.private_repo ? "private" : "public"));
    return;
  }
  if (r.status == 409) return;  // it exists: push into it
  if (r.status == 403) {        // no right to create in the namespace; writing may still be allowed
    const HttpReply info = with_retries(c, "looking up " + c.rq.repo_id, [&] {
      return c.http.request("GET", c.o.endpoint + "/api/models/" + c.rq.repo_id, /*follow_absolute=*/true);
    });
    if (ok(info)) return;
  }
  refuse(c, r, what);
}

void create_branch(Context& c) {
  if (c.rq.revision == "main" || c.rq.revision.rfind("refs/", 0) == 0 || is_commit_sha(c.rq.revision)) return;
  const std::string what = "creating branch " + c.rq.revision;
  const std::string url =
      fmt::format("{}/api/models/{}/branch/{}", c.o.endpoint, c.rq.repo_id, url_quote(c.rq.revision, false));
  HttpReply r = with_retries(c, what, [&] { return c.http.send("POST", url, "{}", "application/json"); });
  if (ok(r)) {
    c.result.created_branch = true;
    event(c, fmt::format("created branch {}", c.rq.revision));
    return;
  }
  if (r.status == 409) return;
  refuse(c, r, what);
}

std::string sample_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string s(kSampleBytes, '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<size_t>(in.gcount()));
  return s;
}

// Asks the hub which files go through LFS (uploadMode) and which to leave out (shouldIgnore).
void preupload(Context& c, std::vector<LocalFile>& files) {
  json body = {{"files", json::array()}};
  for (const auto& f : files)
    body["files"].push_back(
        {{"path", f.f.path_in_repo}, {"sample", base64_encode(sample_of(f.f.local_path))}, {"size", f.size}});
  const std::string what = "asking the hub how to upload the files";
  const HttpReply r =
      with_retries(c, what, [&] { return c.http.send("POST", api(c, "preupload"), body.dump(), "application/json"); });
  if (!ok(r)) refuse(c, r, what);
  const json j = parse_answer(c, r, what);
  std::map<std::string, const json*> answer;
  if (j.contains("files") && j["files"].is_array())
    for (const auto& e : j["files"])
      if (e.is_object() && e.contains("path") && e["path"].is_string()) answer[e["path"].get<std::string>()] = &e;
  std::vector<LocalFile> kept;
  for (auto& f : files) {
    const auto it = answer.find(f.f.path_in_repo);
    if (it == answer.end())
      upload_failed(c, fmt::format("{}: the hub's answer does not mention {}", what, f.f.path_in_repo));
    const json& e = *it->second;
    if (e.value("shouldIgnore", false)) {
      c.result.ignored.push_back(f.f.path_in_repo);
      continue;
    }
    f.lfs = e.value("uploadMode", std::string("regular")) == "lfs";
    kept.push_back(f);
  }
  files = kept;
}

std::map<std::string, std::string> header_map(const json& action) {
  std::map<std::string, std::string> h;
  if (action.contains("header") && action["header"].is_object())
    for (const auto& [k, v] : action["header"].items())
      if (v.is_string()) h[k] = v.get<std::string>();
  return h;
}

std::string state_path(const Context& c, const std::string& oid) {
  return (fs::path(c.rq.state_dir) / (oid + ".json")).string();
}

// The parts of a multipart upload acknowledged earlier (partNumber -> ETag), when the record is of
// this upload (the same completion URL) and this file.
std::map<int, std::string> read_part_state(const Context& c, const LocalFile& f, const std::string& completion_sha) {
  std::map<int, std::string> parts;
  if (c.rq.state_dir.empty()) return parts;
  std::error_code ec;
  if (!fs::is_regular_file(state_path(c, f.sha256), ec)) return parts;
  json j;
  try {
    j = parse_json_bounded(read_file(state_path(c, f.sha256)), state_path(c, f.sha256), "hub");
  } catch (const Error&) {
    return parts;  // a damaged record: upload every part again
  }
  if (!j.is_object() || j.value("completion_sha256", "") != completion_sha || j.value("size", uint64_t{0}) != f.size ||
      !j.contains("parts") || !j["parts"].is_object())
    return parts;
  for (const auto& [k, v] : j["parts"].items())
    if (v.is_string() && !k.empty() && k.size() < 7 && k.find_first_not_of("0123456789") == std::string::npos)
      parts[std::stoi(k)] = v.get<std::string>();
  return parts;
}

void write_part_state(const Context& c, const LocalFile& f, const std::string& completion_sha,
                      const std::map<int, std::string>& parts) {
  if (c.rq.state_dir.empty()) return;
  json j = {{"oid", f.sha256}, {"size", f.size}, {"path", f.f.path_in_repo}, {"completion_sha256", completion_sha}};
  j["parts"] = json::object();
  for (const auto& [n, etag] : parts) j["parts"][std::to_string(n)] = etag;
  fs::create_directories(c.rq.state_dir);
  write_file_atomic(state_path(c, f.sha256), j.dump(2));
}

void report(const Context& c, const LocalFile& f, uint64_t done) {
  if (c.rq.progress) c.rq.progress({f.f.path_in_repo, done, f.size});
}

void put_checked(Context& c, const LocalFile& f, const std::string& url, uint64_t offset, uint64_t length,
                 const std::map<std::string, std::string>& headers, const std::string& what, HttpReply* out) {
  HttpReply r =
      with_retries(c, what, [&] { return c.http.put_file_range(url, f.f.local_path, offset, length, headers); });
  if (!ok(r)) refuse(c, r, what);
  c.result.bytes_sent += length;
  *out = r;
}

void upload_multipart(Context& c, const LocalFile& f, const json& upload) {
  auto headers = header_map(upload);
  const std::optional<uint64_t> chunk = parse_size_header(headers["chunk_size"]);
  std::vector<std::pair<int, std::string>> urls;
  for (const auto& [k, v] : headers)
    if (!k.empty() && k.size() < 7 && k.find_first_not_of("0123456789") == std::string::npos)
      urls.emplace_back(std::stoi(k), v);
  std::sort(urls.begin(), urls.end());
  const uint64_t expected = chunk && *chunk > 0 ? (f.size + *chunk - 1) / *chunk : 0;
  if (!chunk || *chunk == 0 || urls.size() != expected)
    upload_failed(c,
                  fmt::format("the hub's multipart answer for {} is not usable: chunk_size '{}' and {} part URLs for "
                              "{} bytes",
                              f.f.path_in_repo, sanitize_server_text(headers["chunk_size"]), urls.size(), f.size));
  const std::string completion = upload.value("href", "");
  const std::string completion_sha = sha256_hex(completion);
  std::map<int, std::string> done = read_part_state(c, f, completion_sha);
  for (size_t i = 0; i < urls.size(); ++i) {
    const int n = urls[i].first;
    const uint64_t offset = static_cast<uint64_t>(i) * *chunk, length = std::min(*chunk, f.size - offset);
    if (done.count(n)) {
      ++c.result.parts_resumed;
      report(c, f, offset + length);
      continue;
    }
    HttpReply r;
    put_checked(c, f, urls[i].second, offset, length, {},
                fmt::format("uploading part {} of {} of {}", n, urls.size(), f.f.path_in_repo), &r);
    std::string etag = r.header("etag");
    if (etag.empty())
      upload_failed(c, fmt::format("part {} of {} was stored without an ETag; is HF_ENDPOINT a Hugging Face hub?", n,
                                   f.f.path_in_repo));
    done[n] = etag;
    ++c.result.parts_sent;
    write_part_state(c, f, completion_sha, done);
    report(c, f, offset + length);
  }
  json parts = json::array();
  for (const auto& [n, etag] : done) parts.push_back({{"partNumber", n}, {"etag", etag}});
  const json body = {{"oid", f.sha256}, {"parts", parts}};
  const std::string what = "completing the upload of " + f.f.path_in_repo;
  const HttpReply r = with_retries(c, what, [&] {
    return c.http.send("POST", completion, body.dump(), "application/vnd.git-lfs+json",
                       {{"Accept", "application/vnd.git-lfs+json"}});
  });
  if (!ok(r)) refuse(c, r, what);
  if (!c.rq.state_dir.empty()) fs::remove(state_path(c, f.sha256));
}

// One LFS object the batch answer gave actions for.
void upload_lfs_object(Context& c, const LocalFile& f, const json& actions) {
  if (actions.contains("upload") && actions["upload"].is_object()) {
    const json& upload = actions["upload"];
    const auto headers = header_map(upload);
    if (headers.count("chunk_size")) {
      upload_multipart(c, f, upload);
    } else {
      HttpReply r;
      report(c, f, 0);
      put_checked(c, f, upload.value("href", ""), 0, f.size, headers, "uploading " + f.f.path_in_repo, &r);
      report(c, f, f.size);
    }
  }
  // The bytes sent must still be the bytes hashed: a file changed during the upload is refused.
  if (sha256_file_hex(f.f.local_path) != f.sha256)
    upload_failed(c, fmt::format("{} changed while it was uploaded (its sha256 is no longer {}); nothing was committed",
                                 f.f.local_path, f.sha256));
  if (actions.contains("verify") && actions["verify"].is_object()) {
    const json& verify = actions["verify"];
    const json body = {{"oid", f.sha256}, {"size", f.size}};
    const std::string what = "verifying the upload of " + f.f.path_in_repo;
    const HttpReply r = with_retries(c, what, [&] {
      auto h = header_map(verify);
      h.emplace("Accept", "application/vnd.git-lfs+json");
      return c.http.send("POST", verify.value("href", ""), body.dump(), "application/vnd.git-lfs+json", h);
    });
    if (!ok(r)) refuse(c, r, what);
  }
}

void upload_lfs(Context& c, const std::vector<LocalFile>& files) {
  std::vector<const LocalFile*> lfs;
  for (const auto& f : files)
    if (f.lfs) lfs.push_back(&f);
  if (lfs.empty()) return;
  json body = {{"operation", "upload"},
               {"transfers", {"basic", "multipart"}},
               {"hash_algo", "sha256"},
               {"ref", {{"name", c.rq.revision}}},
               {"objects", json::array()}};
  for (const auto* f : lfs) body["objects"].push_back({{"oid", f->sha256}, {"size", f->size}});
  const std::string what = "asking the hub's LFS server where to upload";
  const std::string url = fmt::format("{}/{}.git/info/lfs/objects/batch", c.o.endpoint, c.rq.repo_id);
  const HttpReply r = with_retries(c, what, [&] {
    return c.http.send("POST", url, body.dump(), "application/vnd.git-lfs+json",
                       {{"Accept", "application/vnd.git-lfs+json"}});
  });
  if (!ok(r)) refuse(c, r, what);
  const json j = parse_answer(c, r, what);
  std::map<std::string, json> by_oid;
  if (j.contains("objects") && j["objects"].is_array())
    for (const auto& o : j["objects"])
      if (o.is_object() && o.contains("oid") && o["oid"].is_string()) by_oid[o["oid"].get<std::string>()] = o;
  for (const auto* f : lfs) {
    const auto it = by_oid.find(f->sha256);
    if (it == by_oid.end())
      upload_failed(c,
                    fmt::format("{}: the answer does not mention {} (sha256 {})", what, f->f.path_in_repo, f->sha256));
    const json& o = it->second;
    if (o.contains("error") && o["error"].is_object())
      upload_failed(c, fmt::format("the hub's LFS server refused {}: {} (code {})", f->f.path_in_repo,
                                   sanitize_server_text(o["error"].value("message", "")),
                                   o["error"].contains("code") ? o["error"]["code"].dump() : "none"));
    if (!o.contains("actions") || !o["actions"].is_object() || o["actions"].empty()) {
      c.result.lfs_skipped.push_back(f->f.path_in_repo);  // the hub has these bytes already
      event(c, fmt::format("{}: the hub has it already (sha256 {})", f->f.path_in_repo, f->sha256.substr(0, 12)));
      report(c, *f, f->size);
      continue;
    }
    upload_lfs_object(c, *f, o["actions"]);
  }
}

void commit(Context& c, const std::vector<LocalFile>& files) {
  std::string body =
      json{{"key", "header"}, {"value", {{"summary", c.rq.commit_message}, {"description", c.rq.commit_description}}}}
          .dump() +
      "\n";
  for (const auto& f : files) {
    if (f.lfs) {
      body += json{{"key", "lfsFile"},
                   {"value", {{"path", f.f.path_in_repo}, {"algo", "sha256"}, {"oid", f.sha256}, {"size", f.size}}}}
                  .dump() +
              "\n";
      c.result.lfs_files.push_back(f.f.path_in_repo);
    } else {
      const std::string content = read_file(f.f.local_path);
      if (sha256_hex(content) != f.sha256)
        upload_failed(c, fmt::format("{} changed during the push; nothing was committed", f.f.local_path));
      body += json{{"key", "file"},
                   {"value", {{"path", f.f.path_in_repo}, {"content", base64_encode(content)}, {"encoding", "base64"}}}}
                  .dump() +
              "\n";
      c.result.regular_files.push_back(f.f.path_in_repo);
    }
  }
  const std::string what = "committing to " + c.rq.repo_id + "@" + c.rq.revision;
  const HttpReply r =
      with_retries(c, what, [&] { return c.http.send("POST", api(c, "commit"), body, "application/x-ndjson"); });
  if (!ok(r)) refuse(c, r, what);
  const json j = parse_answer(c, r, what);
  c.result.commit_url = sanitize_server_text(j.value("commitUrl", ""), 1000);
  c.result.commit_oid = sanitize_server_text(j.value("commitOid", ""), 100);
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  static const char* kChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v =
        (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) | uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kChars[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kChars[(v >> 18) & 63];
    out += kChars[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kChars[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string hub_repo_id_problem(const std::string& repo_id) {
  if (repo_id.empty()) return "it is empty";
  const std::optional<HubRepoRef> ref = parse_hub_ref(repo_id);
  if (!ref || ref->revision != "main" || repo_id.find('@') != std::string::npos)
    return "it is not org/name (letters, digits, '-', '_' and '.', one '/', no @revision: the branch is --revision)";
  if (repo_id.size() > 96 + 1 + 96) return "it is longer than the hub allows (96 characters per part)";
  for (const std::string& part : {repo_id.substr(0, repo_id.find('/')), repo_id.substr(repo_id.find('/') + 1)})
    if (part.size() > 96 || part.find("..") != std::string::npos || part.find("--") != std::string::npos ||
        part.back() == '.' || part.back() == '-')
      return fmt::format(
          "'{}' is not a name the hub allows (no '--' or '..', no '.' or '-' at the end, at most 96 characters)", part);
  return "";
}

UploadResult upload_to_hub(const UploadRequest& rq, const HubOptions& o) {
  if (const std::string problem = hub_repo_id_problem(rq.repo_id); !problem.empty())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[hub] cannot push to '{}': {}", sanitize_server_text(rq.repo_id), problem),
                {{"repo", rq.repo_id}})
        .with_suggestion(
            "Name the repository as org/name (your user name or an organization), e.g. --repo alice/my-adapter.");
  check_revision(rq.repo_id, rq.revision);
  if (rq.files.empty())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, "[hub] nothing to push: no files", {{"repo", rq.repo_id}});
  Context c{rq, o, HubHttp(o.endpoint, o.token, o.timeout_s), {}};
  c.result.repo_url = repo_page(c);
  std::vector<LocalFile> files;
  for (const auto& f : rq.files) {
    if (const std::string p = remote_file_problem(f.path_in_repo); !p.empty())
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[hub] cannot push {} as '{}': {}", f.local_path,
                                                                  sanitize_server_text(f.path_in_repo), p));
    std::error_code ec;
    if (!fs::is_regular_file(f.local_path, ec))
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[hub] {} is not a readable file", f.local_path));
    files.push_back({f, static_cast<uint64_t>(fs::file_size(f.local_path)), sha256_file_hex(f.local_path), false});
  }
  create_repo(c);
  create_branch(c);
  preupload(c, files);
  upload_lfs(c, files);
  commit(c, files);
  return c.result;
}

}  // namespace bp::hub
