// Hub download into the local cache (see hf_download.h).
#include "hub/hf_download.h"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/file_read.h"
#include "hub/hf_answers.h"
#include "hub/hf_http.h"
#include "hub/hf_names.h"
#include "io/atomic_file.h"
#include "io/sha256.h"

namespace bp::hub {

namespace fs = std::filesystem;

namespace {

// Files a model folder needs besides its weights (transformers' names).
const std::set<std::string> kSmallFiles = {"config.json",
                                           "generation_config.json",
                                           "tokenizer.json",
                                           "tokenizer_config.json",
                                           "special_tokens_map.json",
                                           "tokenizer.model",
                                           "vocab.json",
                                           "merges.txt",
                                           "added_tokens.json",
                                           "chat_template.jinja"};

struct Context {
  const HubRepoRef& ref;
  const HubOptions& o;
  HubHttp http;
  std::string repo_dir, commit;
  size_t file_index = 0, file_count = 0;
};

bool is_dataset(const Context& c) {
  return c.ref.type == HubRepoType::Dataset;
}

std::string repo_url(const Context& c) {
  return c.o.endpoint + (is_dataset(c) ? "/datasets/" : "/") + c.ref.repo_id;
}

[[noreturn]] void fail_download(const Context& c, const std::string& what) {
  throw Error(ErrorCode::DEP_MODEL_DOWNLOAD_FAILED, "[hub] " + what,
              {{"repo", c.ref.repo_id}, {"revision", c.ref.revision}, {"endpoint", c.o.endpoint}})
      .with_suggestion(fmt::format(
          "Run the command again: the download resumes where it stopped. Check the connection and HF_ENDPOINT "
          "(now {}); with a complete copy in the cache, --offline skips the network.",
          c.o.endpoint));
}

// 401/403/404 and other failures of an answer, in the words of the hub's troubleshooting page.
void check_reply(const Context& c, const HttpReply& r, const std::string& what) {
  // The server's words (headers, a Location that became the URL) are escaped and cut before they
  // reach a message: no terminal escape sequence from a hub reaches the user's terminal.
  const std::string url = sanitize_server_text(r.url, 1000);
  if (!r.error.empty()) fail_download(c, fmt::format("{} failed: {} ({})", what, r.error, url));
  if (r.status >= 200 && r.status < 400) return;
  const std::string hub_code = sanitize_server_text(r.header("x-error-code"), 100);
  const std::string hub_msg = sanitize_server_text(r.header("x-error-message"));
  const std::string said = hub_msg.empty() ? "" : fmt::format(" ('{}')", hub_msg);
  const nlohmann::json details = {{"repo", c.ref.repo_id},
                                  {"revision", c.ref.revision},
                                  {"status", r.status},
                                  {"url", url},
                                  {"x_error_code", hub_code}};
  // A dataset that cannot be had is the user's --data: INPUT_DATASET_NOT_FOUND, in the same words.
  const ErrorCode unavailable = is_dataset(c) ? ErrorCode::INPUT_DATASET_NOT_FOUND : ErrorCode::DEP_MODEL_LOAD_FAILED;
  const char* kind = is_dataset(c) ? "dataset" : "model";
  if (r.status == 401 || r.status == 403) {
    const std::string token_note = c.o.token.empty()
                                       ? "no token was sent (HF_TOKEN is unset and there is no token file)"
                                       : "a token was sent but it has no access to this repository";
    throw Error(unavailable,
                fmt::format("[hub] {} answered {} for '{}'{}: the repository is gated or private, or the name is "
                            "wrong; {}",
                            url, r.status, c.ref.repo_id, said, token_note),
                details)
        .with_suggestion(fmt::format(
            "Open {} and accept the licence if the {} is gated; log in with `huggingface-cli login` (or set "
            "HF_TOKEN to a token with read access); copy the exact name from the {} page (org/name, case "
            "matters).",
            repo_url(c), kind, kind));
  }
  if (r.status == 404) {
    const std::string which = hub_code == "RevisionNotFound" ? fmt::format("revision '{}'", c.ref.revision)
                              : hub_code == "EntryNotFound"  ? "file"
                                                             : fmt::format("repository '{}'", c.ref.repo_id);
    throw Error(unavailable, fmt::format("[hub] {}: {} not found on {} (404){}", what, which, c.o.endpoint, said),
                details)
        .with_suggestion(fmt::format(
            "Copy the exact name from the {} page (org/name, case matters), check the @revision (now '{}'), "
            "and HF_ENDPOINT (now {}).",
            kind, c.ref.revision, c.o.endpoint));
  }
  fail_download(c, fmt::format("{}: {} answered HTTP {}{}", what, url, r.status, said));
}

std::string normalize_etag(std::string e) {
  if (e.rfind("W/", 0) == 0) e = e.substr(2);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return e;
}

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

uint64_t file_size_or_zero(const fs::path& p) {
  std::error_code ec;
  const auto n = fs::file_size(p, ec);
  return ec ? 0 : static_cast<uint64_t>(n);
}

uint64_t cache_free_bytes(const std::string& dir) {
  const auto& hook = hub_free_disk_bytes_for_tests();
  return hook ? hook(dir) : free_disk_bytes(dir);
}

// STATE_DISK_FULL for a download that does not fit (`during`: the disk filled up mid-file).
[[noreturn]] void disk_full(const Context& c, const std::string& file, const fs::path& part, uint64_t size,
                            bool during) {
  const std::string dir = part.parent_path().string();
  const uint64_t free_b = cache_free_bytes(dir);
  const uint64_t have = file_size_or_zero(part), need = size - std::min(size, have);
  const std::string what =
      during ? fmt::format(
                   "the disk filled up (no space left on the device) while downloading {} of {}: {} of {} "
                   "bytes are in {}, kept for the next run; {} bytes are free ({}) in {}",
                   file, c.ref.repo_id, have, size, part.string(), free_b, format_bytes(free_b), dir)
             : fmt::format("downloading {} of {} needs {} bytes ({}) but {} bytes are free ({}) in {}", file,
                           c.ref.repo_id, need, format_bytes(need), free_b, format_bytes(free_b), dir);
  throw Error(ErrorCode::STATE_DISK_FULL, "[hub] " + what,
              {{"repo", c.ref.repo_id}, {"file", file}, {"bytes_needed", need}, {"bytes_free", free_b}, {"path", dir}})
      .with_suggestion(fmt::format(
          "Free {} or more in {} (or point HF_HUB_CACHE or HF_HOME at a disk with room) and run the command again: "
          "the download resumes where it stopped.",
          format_bytes(need), c.o.cache_dir));
}

// Fetches blobs/<etag> (resuming its .incomplete), then verifies its size and LFS sha256. The free
// space is compared with what is left to fetch first, and a write that fails with ENOSPC is a
// full disk (STATE_DISK_FULL), not a broken connection.
void fetch_blob(Context& c, const std::string& file, const std::string& url, const fs::path& blob,
                const std::string& etag, bool lfs, uint64_t size) {
  const fs::path part = blob.string() + ".incomplete";
  auto report = [&](uint64_t done) {
    if (c.o.progress) c.o.progress({file, done, size, c.file_index, c.file_count});
  };
  std::string last_error;
  for (int attempt = 1; attempt <= std::max(1, c.o.max_attempts); ++attempt) {
    uint64_t have = file_size_or_zero(part);
    if (have > size) {  // a stale partial of a different length: start over
      fs::remove(part);
      have = 0;
    }
    if (fs::exists(part) && have == size) break;
    const std::string dir = part.parent_path().string();
    const uint64_t free_b = cache_free_bytes(dir);
    if (free_b < size - have) disk_full(c, file, part, size, false);
    report(have);
    HttpReply r = c.http.download(url, part.string(), have, report);
    if (r.write_errno == ENOSPC || r.write_errno == EDQUOT) disk_full(c, file, part, size, true);
    if (r.write_errno != 0)
      throw Error(ErrorCode::DEP_MODEL_DOWNLOAD_FAILED, "[hub] " + r.error, {{"repo", c.ref.repo_id}, {"file", file}})
          .with_suggestion(
              fmt::format("Check that the cache folder {} is writable (HF_HUB_CACHE, HF_HOME).", c.o.cache_dir));
    if (r.status == 416 && file_size_or_zero(part) == size) break;
    if (r.status != 0 && r.status != 200 && r.status != 206) check_reply(c, r, "downloading " + file);
    if (r.error.empty() && file_size_or_zero(part) == size) break;
    last_error =
        r.error.empty() ? fmt::format("the answer ended at {} of {} bytes", file_size_or_zero(part), size) : r.error;
  }
  const uint64_t got = file_size_or_zero(part);
  if (got != size)
    fail_download(
        c, fmt::format("downloading {} of {} stopped at {} of {} bytes after {} attempts ({}); {} is kept "
                       "and the next run resumes from it",
                       file, c.ref.repo_id, got, size, std::max(1, c.o.max_attempts), last_error, part.string()));
  if (lfs) {
    const std::string sha = sha256_file_hex(part.string());
    if (sha != etag) {
      fs::remove(part);
      fail_download(c, fmt::format("{} of {}: sha256 {} does not match the hub's {} ({} bytes); the damaged "
                                   "download was deleted",
                                   file, c.ref.repo_id, sha, etag, size));
    }
  }
  fs::rename(part, blob);
}

// One file of the snapshot: HEAD for its etag, the blob if missing, the snapshot symlink.
void fetch_file(Context& c, const std::string& file) {
  ++c.file_index;
  check_remote_file_name(file, repo_url(c), c.ref.repo_id);  // checked when parsed; no path is made without it
  const fs::path link = fs::path(c.repo_dir) / "snapshots" / c.commit / file;
  std::error_code ec;
  if (fs::is_regular_file(link, ec)) return;
  const std::string url = repo_url(c) + "/resolve/" + c.commit + "/" + url_quote(file, true);
  HttpReply head = c.http.request("HEAD", url, /*follow_absolute=*/false);
  check_reply(c, head, "looking up " + file);
  // The blob's name and size, strictly: an ETag names a file (blobs/<etag>), a size is digits.
  const std::string linked = normalize_etag(head.header("x-linked-etag"));
  const char* etag_header = linked.empty() ? "ETag" : "X-Linked-Etag";
  const std::string etag = linked.empty() ? normalize_etag(head.header("etag")) : linked;
  const bool linked_size = !head.header("x-linked-size").empty();
  const char* size_header = linked_size ? "X-Linked-Size" : "Content-Length";
  const std::string size_text = head.header(linked_size ? "x-linked-size" : "content-length");
  if (etag.empty() || size_text.empty())
    fail_download(
        c, fmt::format("{} gave no {} for {}; is HF_ENDPOINT a Hugging Face hub?", sanitize_server_text(head.url),
                       etag.empty() ? "ETag"
                                    : "size (X-Linked-Size or "
                                      "Content-Length)",
                       file));
  if (!is_safe_blob_name(etag))
    fail_download(c, fmt::format("{} answered {} '{}' for {}: not a blob name (hex digits or a token of letters, "
                                 "digits, '-' and '_'); is HF_ENDPOINT a Hugging Face hub?",
                                 sanitize_server_text(head.url), etag_header, sanitize_server_text(etag), file));
  const std::optional<uint64_t> parsed_size = parse_size_header(size_text);
  if (!parsed_size)
    fail_download(c, fmt::format("{} answered {} '{}' for {}: not a byte count; is HF_ENDPOINT a Hugging Face hub?",
                                 sanitize_server_text(head.url), size_header, sanitize_server_text(size_text), file));
  const uint64_t size = *parsed_size;
  const bool cdn = head.status >= 300 && head.status < 400;
  const std::string download_url = cdn ? head.header("location") : head.url;
  const fs::path blob = fs::path(c.repo_dir) / "blobs" / etag;
  fs::create_directories(blob.parent_path());
  if (!fs::is_regular_file(blob, ec)) fetch_blob(c, file, download_url, blob, etag, is_sha256_hex(linked), size);
  fs::create_directories(link.parent_path());
  fs::path target = fs::path("..") / "..";  // from snapshots/<commit>/ to the repository folder
  const fs::path inside(file);              // a file in a sub-folder needs one more ".." per level
  for (auto it = inside.begin(); std::next(it) != inside.end(); ++it) target /= "..";
  fs::remove(link, ec);
  fs::create_symlink(target / "blobs" / etag, link);
}

std::vector<std::string> shards_of_index(const Context& c, const fs::path& index) {
  const std::string text =
      read_file_capped(index.string(), FileKind::Config, {"hub", ErrorCode::DEP_MODEL_LOAD_FAILED});
  return parse_index_shards(text, index.string(), c.ref.repo_id);
}

// Writes refs/<revision> = the commit (a branch or tag name; a commit needs none).
void write_ref(const Context& c) {
  if (is_commit_sha(c.ref.revision)) return;
  const fs::path refs = fs::path(c.repo_dir) / "refs" / c.ref.revision;
  fs::create_directories(refs.parent_path());
  std::ofstream(refs, std::ios::trunc) << c.commit;
}

// The revision's commit and listing: GET {endpoint}/api/{models|datasets}/{repo}/revision/{rev}.
HubModelInfo revision_info(Context& c) {
  const std::string api = c.o.endpoint + (is_dataset(c) ? "/api/datasets/" : "/api/models/") + c.ref.repo_id +
                          "/revision/" + url_quote(c.ref.revision, false);
  HttpReply info = c.http.request("GET", api, /*follow_absolute=*/true);
  check_reply(c, info, "asking the hub about " + c.ref.repo_id + "@" + c.ref.revision);
  return parse_model_info(info.body, info.url, c.ref.repo_id);  // checks every listed name
}

}  // namespace

std::function<uint64_t(const std::string&)>& hub_free_disk_bytes_for_tests() {
  static std::function<uint64_t(const std::string&)> hook;
  return hook;
}

std::string download_repo_file(const HubRepoRef& ref, const std::string& file, const HubOptions& o) {
  check_revision(ref.repo_id, ref.revision);
  check_remote_file_name(file, "the reference", ref.repo_id);
  Context c{ref, o, HubHttp(o.endpoint, o.token, o.timeout_s), repo_cache_dir(o, ref.repo_id, ref.type), "", 0, 1};
  const HubModelInfo listing = revision_info(c);
  c.commit = listing.sha;
  if (!listing.files.count(file))
    throw Error(ErrorCode::INPUT_DATASET_NOT_FOUND,
                fmt::format("[hub] {}@{} has no file '{}' ({} files listed)", ref.repo_id, ref.revision,
                            sanitize_server_text(file), listing.files.size()),
                {{"repo", ref.repo_id}, {"revision", ref.revision}, {"file", sanitize_server_text(file)}})
        .with_suggestion(fmt::format("Open {}/tree/{} for the file names (the path inside the repository, case "
                                     "matters): hf://datasets/{}/<path>[@revision].",
                                     repo_url(c), url_quote(ref.revision, false), ref.repo_id));
  fetch_file(c, file);
  write_ref(c);
  return (fs::path(c.repo_dir) / "snapshots" / c.commit / file).string();
}

std::string download_snapshot(const HubRepoRef& ref, const HubOptions& o) {
  check_revision(ref.repo_id, ref.revision);
  Context c{ref, o, HubHttp(o.endpoint, o.token, o.timeout_s), repo_cache_dir(o, ref.repo_id, ref.type), "", 0, 0};
  const HubModelInfo model = revision_info(c);
  c.commit = model.sha;
  const std::set<std::string>& listed = model.files;

  std::vector<std::string> files;
  for (const auto& f : listed)
    if (kSmallFiles.count(f) && (o.need != ModelFiles::Config || f == "config.json" || f == "generation_config.json"))
      files.push_back(f);
  const bool sharded = listed.count("model.safetensors.index.json") > 0;
  const bool weights = o.need == ModelFiles::All;
  if (weights && sharded)
    files.push_back("model.safetensors.index.json");
  else if (weights && listed.count("model.safetensors"))
    files.push_back("model.safetensors");
  if (!listed.count("config.json") || (weights && !sharded && !listed.count("model.safetensors")))
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                fmt::format("[hub] {}@{} has no {} (it lists {} files); backprop reads Hugging Face models with "
                            "config.json and safetensors weights",
                            ref.repo_id, ref.revision,
                            listed.count("config.json") ? "safetensors weights" : "config.json", listed.size()))
        .with_suggestion(
            "Pick a repository with model.safetensors (most have one; pytorch_model.bin-only repos are "
            "not read), or pass a GGUF file or a local folder.");
  c.file_count = files.size();
  for (const auto& f : files) fetch_file(c, f);
  if (weights && sharded) {
    const auto shards =
        shards_of_index(c, fs::path(c.repo_dir) / "snapshots" / c.commit / "model.safetensors.index.json");
    c.file_count += shards.size();
    for (const auto& s : shards) fetch_file(c, s);
  }
  write_ref(c);
  return (fs::path(c.repo_dir) / "snapshots" / c.commit).string();
}

}  // namespace bp::hub
