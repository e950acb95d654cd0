#include "train/checkpoint.h"

#include <algorithm>
#include <filesystem>

#include "io/atomic_file.h"
#include "io/sha256.h"

namespace bp {

namespace fs = std::filesystem;

static constexpr const char* kPrefix = "checkpoint-";
static constexpr const char* kPartial = ".partial";

CheckpointStore::CheckpointStore(std::string root) : root_(std::move(root)) {}

static std::optional<int64_t> step_of(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  std::string rest = name.substr(std::string(kPrefix).size());
  if (rest.empty() || !std::all_of(rest.begin(), rest.end(), ::isdigit)) return std::nullopt;
  return std::stoll(rest);
}

std::vector<std::string> CheckpointStore::remove_stale_partials() const {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return removed;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    std::string n = e.path().filename().string();
    if (n.size() > std::string(kPartial).size() && n.ends_with(kPartial)) {
      fs::remove_all(e.path(), ec);
      removed.push_back(e.path().string());
    }
  }
  return removed;
}

std::string CheckpointStore::write(int64_t step, const std::vector<CheckpointFile>& files,
                                   const nlohmann::json& trainer_state) const {
  fs::create_directories(root_);
  std::string final_dir = (fs::path(root_) / fmt::format("{}{}", kPrefix, step)).string();
  std::string partial = final_dir + kPartial;
  std::error_code ec;
  fs::remove_all(partial, ec);
  fs::create_directories(partial);
  try {
    nlohmann::json manifest = {
        {"format", "backprop-checkpoint-v1"}, {"step", step}, {"files", nlohmann::json::object()}};
    auto record = [&](const std::string& name) {
      std::string p = (fs::path(partial) / name).string();
      manifest["files"][name] = {{"bytes", fs::file_size(p)}, {"sha256", sha256_file_hex(p)}};
    };
    for (const auto& f : files) {
      f.write((fs::path(partial) / f.name).string());
      record(f.name);
      crash_point("checkpoint:after_" + f.name);
    }
    write_file_atomic((fs::path(partial) / "trainer_state.json").string(), trainer_state.dump(2));
    record("trainer_state.json");
    crash_point("checkpoint:before_manifest");
    write_file_atomic((fs::path(partial) / "manifest.json").string(), manifest.dump(2));
    fsync_dir(partial);
    crash_point("checkpoint:before_rename");
    fs::remove_all(final_dir, ec);  // a re-written step (resume after a crash past the rename)
    fs::rename(partial, final_dir);
    fsync_dir(root_);
  } catch (...) {
    fs::remove_all(partial, ec);
    throw;
  }
  return final_dir;
}

std::vector<CheckpointInfo> CheckpointStore::list() const {
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return out;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    if (!e.is_directory()) continue;
    if (auto s = step_of(e.path().filename().string())) out.push_back({e.path().string(), *s, {}});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

std::optional<CheckpointInfo> CheckpointStore::latest_valid(
    const std::function<void(const std::string&, const Error&)>& on_invalid) const {
  auto all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      it->trainer_state = verify(it->path);
      return *it;
    } catch (const Error& e) {
      if (on_invalid) on_invalid(it->path, e);
    }
  }
  return std::nullopt;
}

std::vector<std::string> CheckpointStore::prune(int keep_last, const std::string& keep_also) const {
  auto all = list();
  std::vector<std::string> removed;
  int n = static_cast<int>(all.size());
  for (int i = 0; i < n - std::max(keep_last, 0); ++i) {
    const auto& p = all[static_cast<size_t>(i)].path;
    if (!keep_also.empty() && fs::equivalent(p, keep_also)) continue;
    std::error_code ec;
    fs::remove_all(p, ec);
    removed.push_back(p);
  }
  return removed;
}

nlohmann::json CheckpointStore::verify(const std::string& dir) {
  auto invalid = [&](const std::string& why) {
    return Error(ErrorCode::STATE_CHECKPOINT_INVALID, fmt::format("[checkpoint] {} is invalid: {}", dir, why),
                 {{"path", dir}});
  };
  nlohmann::json manifest;
  try {
    manifest = nlohmann::json::parse(read_file((fs::path(dir) / "manifest.json").string()));
  } catch (const std::exception& e) {
    throw invalid(fmt::format("manifest.json missing or unreadable ({})", e.what()));
  }
  if (!manifest.contains("files") || !manifest["files"].is_object()) throw invalid("manifest.json has no file list");
  for (const auto& [name, meta] : manifest["files"].items()) {
    std::string p = (fs::path(dir) / name).string();
    std::error_code ec;
    auto size = fs::file_size(p, ec);
    if (ec) throw invalid(fmt::format("{} is missing", name));
    if (!meta.contains("bytes") || !meta.contains("sha256"))
      throw invalid(fmt::format("manifest entry {} is incomplete", name));
    if (size != meta["bytes"].get<uint64_t>())
      throw invalid(
          fmt::format("{} has {} bytes, the manifest says {} (truncated?)", name, size, meta["bytes"].get<uint64_t>()));
    if (sha256_file_hex(p) != meta["sha256"].get<std::string>())
      throw invalid(fmt::format("{} fails its SHA-256 checksum (corrupted)", name));
  }
  if (!manifest["files"].contains("trainer_state.json")) throw invalid("trainer_state.json is not in the manifest");
  try {
    return nlohmann::json::parse(read_file((fs::path(dir) / "trainer_state.json").string()));
  } catch (const std::exception& e) {
    throw invalid(fmt::format("trainer_state.json does not parse ({})", e.what()));
  }
}

}  // namespace bp
