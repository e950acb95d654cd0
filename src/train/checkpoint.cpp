#include "train/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>

#include "core/file_read.h"
#include "io/atomic_file.h"
#include "io/sha256.h"

namespace bp {

namespace fs = std::filesystem;

static constexpr const char* kPrefix = "checkpoint-";
static constexpr const char* kPartial = ".partial";

CheckpointStore::CheckpointStore(std::string root) : root_(std::move(root)) {}

static constexpr const char* kAside = ".old";  // the folder a re-write replaces (io/atomic_file.h promote_folder)

// "checkpoint-<digits>": the shape of a checkpoint folder name (the number may still not fit).
static bool has_step_shape(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return false;
  std::string_view rest = std::string_view(name).substr(std::string_view(kPrefix).size());
  return !rest.empty() && std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The step of a checkpoint folder name; nullopt when it is not one or its number overflows int64.
static std::optional<int64_t> step_of(const std::string& name) {
  if (!has_step_shape(name)) return std::nullopt;
  const char* b = name.data() + std::string_view(kPrefix).size();
  const char* e = name.data() + name.size();
  int64_t step = 0;
  auto [end, err] = std::from_chars(b, e, step);
  if (err != std::errc() || end != e) return std::nullopt;
  return step;
}

static Error invalid_checkpoint(const std::string& dir, const std::string& why) {
  return Error(ErrorCode::STATE_CHECKPOINT_INVALID, fmt::format("[checkpoint] {} is invalid: {}", dir, why),
               {{"path", dir}});
}

static bool verifies(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  try {
    CheckpointStore::verify(dir);
    return true;
  } catch (const Error&) {
    return false;
  }
}

std::vector<std::string> CheckpointStore::recover_interrupted_writes() const {
  std::vector<std::string> actions;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return actions;
  std::map<std::string, std::vector<std::string>> leftovers;  // final folder -> its leftovers
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    std::string n = e.path().filename().string();
    for (std::string_view suffix : {std::string_view(kPartial), std::string_view(kAside)})
      if (n.size() > suffix.size() && n.ends_with(suffix))
        leftovers[(fs::path(root_) / n.substr(0, n.size() - suffix.size())).string()].push_back(e.path().string());
  }
  for (auto& [final_dir, found] : leftovers) {
    // A .partial is newer than an .old of the same step: try it first.
    std::sort(found.begin(), found.end(), [](const std::string& a, const std::string& b) {
      return a.ends_with(kPartial) && !b.ends_with(kPartial);
    });
    bool named_step = step_of(fs::path(final_dir).filename().string()).has_value();
    if (named_step && !verifies(final_dir)) {
      for (auto it = found.begin(); it != found.end(); ++it) {
        if (!verifies(*it)) continue;
        fs::remove_all(final_dir, ec);
        fs::rename(*it, final_dir);
        fsync_dir(root_);
        actions.push_back(
            fmt::format("restored the complete checkpoint {} from {} left by an interrupted save", final_dir, *it));
        found.erase(it);
        break;
      }
    }
    for (const auto& p : found) {
      fs::remove_all(p, ec);
      actions.push_back(fmt::format("removed {} left by an interrupted save", p));
    }
  }
  return actions;
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
    // A re-written step (the final save after a periodic one, a resume after a crash past the
    // rename) never lacks a complete folder: see promote_folder and recover_interrupted_writes.
    promote_folder(partial, final_dir, "checkpoint");
  } catch (...) {
    fs::remove_all(partial, ec);
    try {
      throw;
    } catch (Error& e) {
      if (e.code() == ErrorCode::STATE_DISK_FULL) e.with_suggestion(disk_full_suggestion());
      throw;
    }
  }
  return final_dir;
}

std::string CheckpointStore::disk_full_suggestion() const {
  auto all = list();
  if (all.empty())
    return "Free disk space (or point --output elsewhere). No checkpoint of this run was saved yet, so there is "
           "nothing to resume: start the run again.";
  return fmt::format(
      "Free disk space (or point --output elsewhere). The newest checkpoint, {} (step {}), is untouched: continue "
      "with --resume latest.",
      all.back().path, all.back().step);
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
    const std::function<void(const std::string&, const Error&)>& on_invalid,
    const std::function<void(const CheckpointInfo&)>& check) const {
  std::error_code ec;
  if (on_invalid && fs::is_directory(root_, ec))  // checkpoint-99999999999999999999999: no step fits
    for (const auto& e : fs::directory_iterator(root_, ec)) {
      std::string n = e.path().filename().string();
      if (e.is_directory() && has_step_shape(n) && !step_of(n))
        on_invalid(e.path().string(),
                   invalid_checkpoint(e.path().string(), "its step number does not fit a 64-bit integer"));
    }
  auto all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      it->trainer_state = verify(it->path);
      if (check) check(*it);
      return *it;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::STATE_CHECKPOINT_INVALID) throw;
      if (on_invalid) on_invalid(it->path, e);
    }
  }
  return std::nullopt;
}

std::vector<std::string> CheckpointStore::prune(int keep_last, const std::string& keep_also) const {
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;  // 0 = keep all
  auto all = list();
  int n = static_cast<int>(all.size());
  for (int i = 0; i < n - keep_last; ++i) {
    const auto& p = all[static_cast<size_t>(i)].path;
    if (!keep_also.empty() && fs::equivalent(p, keep_also)) continue;
    std::error_code ec;
    fs::remove_all(p, ec);
    removed.push_back(p);
  }
  return removed;
}

// verify() without the catch-all: wrong JSON types throw nlohmann's exceptions here.
static nlohmann::json verify_files(const std::string& dir) {
  auto invalid = [&](const std::string& why) { return invalid_checkpoint(dir, why); };
  nlohmann::json manifest;
  try {
    const std::string path = (fs::path(dir) / "manifest.json").string();
    manifest = parse_json_bounded(read_file(path), path, "checkpoint");  // depth-bounded: a hostile file
    if (manifest.is_discarded()) throw std::runtime_error("not valid JSON");
  } catch (const std::exception& e) {
    throw invalid(fmt::format("manifest.json missing or unreadable ({})", e.what()));
  }
  if (!manifest.is_object() || !manifest.contains("files") || !manifest["files"].is_object())
    throw invalid("manifest.json has no file list");
  for (const auto& [name, meta] : manifest["files"].items()) {
    std::string p = (fs::path(dir) / name).string();
    std::error_code ec;
    auto size = fs::file_size(p, ec);
    if (ec) throw invalid(fmt::format("{} is missing", name));
    if (!meta.is_object() || !meta.contains("bytes") || !meta.contains("sha256") ||
        !meta["bytes"].is_number_unsigned() || !meta["sha256"].is_string())
      throw invalid(fmt::format("manifest entry {} is incomplete or has wrong types: {}", name, meta.dump()));
    if (size != meta["bytes"].get<uint64_t>())
      throw invalid(
          fmt::format("{} has {} bytes, the manifest says {} (truncated?)", name, size, meta["bytes"].get<uint64_t>()));
    if (sha256_file_hex(p) != meta["sha256"].get<std::string>())
      throw invalid(fmt::format("{} fails its SHA-256 checksum (corrupted)", name));
  }
  if (!manifest["files"].contains("trainer_state.json")) throw invalid("trainer_state.json is not in the manifest");
  nlohmann::json state;
  try {
    const std::string path = (fs::path(dir) / "trainer_state.json").string();
    state = parse_json_bounded(read_file(path), path, "checkpoint");
    if (state.is_discarded()) throw std::runtime_error("not valid JSON");
  } catch (const std::exception& e) {
    throw invalid(fmt::format("trainer_state.json does not parse ({})", e.what()));
  }
  if (!state.is_object())
    throw invalid(fmt::format("trainer_state.json is a JSON {}, not an object", state.type_name()));
  if (state.contains("step") && !state["step"].is_number_integer())
    throw invalid(fmt::format("trainer_state.json: step is {}, not an integer", state["step"].dump()));
  return state;
}

nlohmann::json CheckpointStore::verify(const std::string& dir) {
  try {
    return verify_files(dir);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // filesystem or JSON type errors: still just a bad checkpoint
    throw invalid_checkpoint(dir, fmt::format("malformed ({})", e.what()));
  }
}

}  // namespace bp
