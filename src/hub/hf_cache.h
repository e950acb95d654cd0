// The local Hugging Face cache, laid out as huggingface_hub and transformers lay it out, so a model
// downloaded by either is found here and one downloaded here is found by them:
//
//   <cache>/models--<org>--<name>/refs/<revision>        text file holding the commit sha
//   <cache>/models--<org>--<name>/blobs/<etag>           file contents (etag = LFS sha256 or git sha1)
//   <cache>/models--<org>--<name>/snapshots/<sha>/<file> relative symlink to ../../blobs/<etag>
//
// <cache> is HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub. The token is HF_TOKEN, else the file `huggingface-cli login` writes
// ($HF_TOKEN_PATH, else $HF_HOME/token). HF_ENDPOINT replaces https://huggingface.co.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace bp::hub {

// Which kind of hub repository: a model (<cache>/models--org--name, {endpoint}/org/name) or a
// dataset (<cache>/datasets--org--name, {endpoint}/datasets/org/name, /api/datasets/...).
enum class HubRepoType { Model, Dataset };

// A hub model name: "org/name" or "org/name@revision" (a branch, tag or commit sha).
struct HubRepoRef {
  std::string repo_id;            // "Qwen/Qwen2.5-0.5B-Instruct"
  std::string revision = "main";  // "main", "v1.0", "refs/pr/3" or a 40-hex commit
  HubRepoType type = HubRepoType::Model;
};
// nullopt when `s` is not shaped like a hub name (a path with ./, /, ~, or more than one '/').
std::optional<HubRepoRef> parse_hub_ref(const std::string& s);
bool is_commit_sha(const std::string& s);  // 40 lower-case hex digits

struct DownloadProgress {
  std::string file;          // name inside the repository
  uint64_t bytes_done = 0;   // of this file, including bytes resumed from an earlier run
  uint64_t bytes_total = 0;  // of this file
  size_t file_index = 0;     // 1-based, among the files this resolve downloads
  size_t file_count = 0;
};

// What a command needs of a model: estimate-vram only its config, validate its tokenizer too.
enum class ModelFiles { Config, Tokenizer, All };

struct HubOptions {
  std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT
  std::string cache_dir;                            // see the file comment
  std::string token;                                // empty = anonymous
  std::string derived_dir;                          // folders standing for GGUF files (gguf_source.h)
  std::string ollama_dir;                           // Ollama's store (ollama_source.h)
  bool offline = false;                             // --offline, HF_HUB_OFFLINE=1: never use the network
  int max_attempts = 3;                             // per file; each attempt resumes where the last stopped
  int timeout_s = 30;                               // connect and read timeout
  ModelFiles need = ModelFiles::All;                // which files make a snapshot complete
  std::function<void(const DownloadProgress&)> progress;
  // Endpoint, cache folder, token and HF_HUB_OFFLINE from the environment; `offline_flag` forces offline.
  static HubOptions from_environment(bool offline_flag);
};

// <cache>/models--org--name (datasets--org--name for a dataset)
std::string repo_cache_dir(const HubOptions& o, const std::string& repo_id, HubRepoType type = HubRepoType::Model);
// The commit `revision` stands for in the cache (refs/<revision>, or the revision itself when it is
// a sha); nullopt when unknown.
std::optional<std::string> cached_commit(const std::string& repo_dir, const std::string& revision);
// A snapshot folder is complete when it has config.json, for Tokenizer also tokenizer.json or
// tokenizer_config.json, and for All its weights: model.safetensors, or the index and every shard
// it names.
bool snapshot_complete(const std::string& snapshot_dir, ModelFiles need);
// The complete cached snapshot of ref; nullopt when absent or incomplete.
std::optional<std::string> find_cached_snapshot(const HubOptions& o, const HubRepoRef& ref);

}  // namespace bp::hub
