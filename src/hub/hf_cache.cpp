// The Hugging Face cache layout and the environment that locates it (see hf_cache.h).
#include "hub/hf_cache.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/file_read.h"
#include "hub/hf_names.h"

namespace bp::hub {

namespace fs = std::filesystem;

namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

bool truthy(std::string v) {
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "1" || v == "on" || v == "yes" || v == "true";
}

std::string hf_home() {
  if (std::string h = env("HF_HOME"); !h.empty()) return h;
  if (std::string x = env("XDG_CACHE_HOME"); !x.empty()) return (fs::path(x) / "huggingface").string();
  return (fs::path(env("HOME")) / ".cache" / "huggingface").string();
}
}  // namespace

std::optional<HubRepoRef> parse_hub_ref(const std::string& s) {
  static const std::regex re(R"(^([A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*)(@([^@\s]+))?$)");
  std::smatch m;
  if (!std::regex_match(s, m, re)) return std::nullopt;
  HubRepoRef r;
  r.repo_id = m[1].str();
  if (m[3].matched) r.revision = m[3].str();
  return r;
}

bool is_commit_sha(const std::string& s) {
  static const std::regex re("^[0-9a-f]{40}$");
  return std::regex_match(s, re);
}

HubOptions HubOptions::from_environment(bool offline_flag) {
  HubOptions o;
  if (std::string e = env("HF_ENDPOINT"); !e.empty()) {
    while (!e.empty() && e.back() == '/') e.pop_back();
    o.endpoint = e;
  }
  const std::string home = hf_home();
  o.cache_dir = env("HF_HUB_CACHE");
  if (o.cache_dir.empty()) o.cache_dir = env("HUGGINGFACE_HUB_CACHE");
  if (o.cache_dir.empty()) o.cache_dir = (fs::path(home) / "hub").string();
  o.token = trim(env("HF_TOKEN"));
  if (o.token.empty()) o.token = trim(env("HUGGING_FACE_HUB_TOKEN"));
  if (o.token.empty()) {
    std::string token_path = env("HF_TOKEN_PATH");
    if (token_path.empty()) token_path = (fs::path(home) / "token").string();
    std::ifstream in(token_path);
    std::string line;
    if (in && std::getline(in, line)) o.token = trim(line);
  }
  std::string xdg = env("XDG_CACHE_HOME");
  if (xdg.empty()) xdg = (fs::path(env("HOME")) / ".cache").string();
  o.derived_dir = (fs::path(xdg) / "backprop" / "gguf").string();
  if (const char* m = std::getenv("OLLAMA_MODELS"); m && *m)
    o.ollama_dir = m;
  else
    o.ollama_dir = (fs::path(env("HOME")) / ".ollama" / "models").string();
  o.offline = offline_flag || truthy(env("HF_HUB_OFFLINE")) || truthy(env("TRANSFORMERS_OFFLINE"));
  return o;
}

std::string repo_cache_dir(const HubOptions& o, const std::string& repo_id, HubRepoType type) {
  std::string folder = (type == HubRepoType::Dataset ? "datasets--" : "models--") + repo_id;
  for (size_t p = folder.find('/'); p != std::string::npos; p = folder.find('/', p + 2)) folder.replace(p, 1, "--");
  return (fs::path(o.cache_dir) / folder).string();
}

std::optional<std::string> cached_commit(const std::string& repo_dir, const std::string& revision) {
  if (is_commit_sha(revision)) return revision;
  if (!revision_problem(revision).empty()) return std::nullopt;  // never a path outside refs/
  std::ifstream in(fs::path(repo_dir) / "refs" / revision);
  std::string sha;
  if (!in || !std::getline(in, sha)) return std::nullopt;
  sha = trim(sha);
  if (!is_commit_sha(sha)) return std::nullopt;
  return sha;
}

bool snapshot_complete(const std::string& snapshot_dir, ModelFiles need) {
  const fs::path d(snapshot_dir);
  std::error_code ec;
  if (!fs::is_regular_file(d / "config.json", ec)) return false;  // follows the blob symlink
  if (need == ModelFiles::Config) return true;
  const bool tokenizer =
      fs::is_regular_file(d / "tokenizer.json", ec) || fs::is_regular_file(d / "tokenizer_config.json", ec);
  if (need == ModelFiles::Tokenizer) return tokenizer;
  if (fs::is_regular_file(d / "model.safetensors", ec)) return true;
  std::ifstream in(d / "model.safetensors.index.json");
  if (!in) return false;
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  const nlohmann::json j = parse_json_bounded(text, (d / "model.safetensors.index.json").string(), "hub");
  if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object()) return false;
  for (const auto& [name, shard] : j["weight_map"].items())
    if (!shard.is_string() || !remote_file_problem(shard.get<std::string>()).empty() ||
        !fs::is_regular_file(d / shard.get<std::string>(), ec))
      return false;
  return true;
}

std::optional<std::string> find_cached_snapshot(const HubOptions& o, const HubRepoRef& ref) {
  const std::string repo_dir = repo_cache_dir(o, ref.repo_id);
  const auto sha = cached_commit(repo_dir, ref.revision);
  if (!sha) return std::nullopt;
  const std::string snap = (fs::path(repo_dir) / "snapshots" / *sha).string();
  if (!snapshot_complete(snap, o.need)) return std::nullopt;
  return snap;
}

}  // namespace bp::hub
