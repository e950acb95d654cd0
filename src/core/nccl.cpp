// NCCL loaded with dlopen (nccl.h).
#include "core/nccl.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace bp {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> nccl_candidates(const std::string& library) {
  if (!library.empty()) return {library};
  std::vector<std::string> out = {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2",
                                  "/usr/local/cuda/lib/libnccl.so.2"};
#if defined(__aarch64__)
  out.push_back("/usr/local/cuda/targets/sbsa-linux/lib/libnccl.so.2");
#else
  out.push_back("/usr/local/cuda/targets/x86_64-linux/lib/libnccl.so.2");
#endif
  return out;
}

template <class F>
bool resolve(void* h, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(h, name));
  if (!fn) missing += (missing.empty() ? "" : ", ") + std::string(name);
  return fn != nullptr;
}

// One attempt: the library at `path` with every symbol, or why not.
std::unique_ptr<NcclApi> try_load(const std::string& path, std::string& why) {
  const bool is_path = path.find('/') != std::string::npos;
  std::error_code ec;
  if (is_path && !fs::exists(path, ec)) {
    why = path + ": not found";
    return nullptr;
  }
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    why = e ? std::string(e) : path + ": cannot be loaded";
    return nullptr;
  }
  auto api = std::make_unique<NcclApi>();
  std::string missing;
  resolve(h, "ncclGetVersion", api->get_version, missing);
  resolve(h, "ncclGetErrorString", api->get_error_string, missing);
  resolve(h, "ncclGetUniqueId", api->get_unique_id, missing);
  resolve(h, "ncclCommInitRank", api->comm_init_rank, missing);
  resolve(h, "ncclCommDestroy", api->comm_destroy, missing);
  resolve(h, "ncclCommAbort", api->comm_abort, missing);
  resolve(h, "ncclCommGetAsyncError", api->comm_get_async_error, missing);
  resolve(h, "ncclGroupStart", api->group_start, missing);
  resolve(h, "ncclGroupEnd", api->group_end, missing);
  resolve(h, "ncclSend", api->send, missing);
  resolve(h, "ncclRecv", api->recv, missing);
  resolve(h, "ncclBroadcast", api->broadcast, missing);
  if (!missing.empty()) {
    why = fmt::format("{}: not an NCCL of version 2.7 or later (no {})", path, missing);
    dlclose(h);
    return nullptr;
  }
  api->path = is_path ? fs::weakly_canonical(path, ec).string() : path;
  if (api->get_version(&api->version) != 0) api->version = 0;
  return api;  // the handle stays open for the process's life
}

}  // namespace

std::string nccl_version_text(int v) {
  if (v <= 0) return "unknown";
  if (v >= 20900) return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
  return fmt::format("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100);
}

const NcclApi* load_nccl(const std::string& library, std::string* why) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<NcclApi>> loaded;  // by the asked-for name
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = loaded.find(library); it != loaded.end()) return it->second.get();
  std::string all;
  for (const std::string& path : nccl_candidates(library)) {
    std::string w;
    if (auto api = try_load(path, w)) return (loaded[library] = std::move(api)).get();
    all += (all.empty() ? "" : "; ") + w;
  }
  if (why) *why = all;
  return nullptr;
}

NcclAvailability nccl_availability(const std::string& library) {
  NcclAvailability a;
  if (const NcclApi* api = load_nccl(library, &a.why)) {
    a.available = true;
    a.path = api->path;
    a.version = nccl_version_text(api->version);
  }
  return a;
}

}  // namespace bp
