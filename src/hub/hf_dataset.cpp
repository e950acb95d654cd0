// Dataset files from the hub (see hf_dataset.h).
#include "hub/hf_dataset.h"

#include <filesystem>
#include <string_view>

#include "core/error.h"
#include "hub/hf_download.h"
#include "hub/hf_names.h"

namespace bp::hub {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kScheme = "hf://";
constexpr std::string_view kDatasets = "hf://datasets/";

[[noreturn]] void bad_reference(const std::string& s, const std::string& why) {
  throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
              fmt::format("[data] '{}' is not a dataset file on the hub: {}", sanitize_server_text(s), why))
      .with_suggestion(
          "Write hf://datasets/ORG/NAME/PATH/TO/FILE.jsonl, with @REVISION after NAME or at the end for a branch, "
          "tag or commit (e.g. hf://datasets/org/name/data/train.jsonl@v1.0).");
}

}  // namespace

bool is_hub_dataset_reference(const std::string& s) {
  return s.rfind(kScheme, 0) == 0;
}

HubDatasetRef parse_dataset_ref(const std::string& s) {
  if (s.rfind(kDatasets, 0) != 0)
    bad_reference(s, "only hf://datasets/... files are read as data (models go to --model as org/name)");
  std::string rest = s.substr(kDatasets.size());
  HubDatasetRef r;
  r.repo.type = HubRepoType::Dataset;
  // ORG / NAME[@REV] / PATH
  const size_t slash1 = rest.find('/');
  const size_t slash2 = slash1 == std::string::npos ? std::string::npos : rest.find('/', slash1 + 1);
  if (slash1 == 0 || slash2 == std::string::npos || slash2 == slash1 + 1 || slash2 + 1 >= rest.size())
    bad_reference(s, "it needs ORG/NAME and the file's path inside the repository");
  std::string name = rest.substr(slash1 + 1, slash2 - slash1 - 1);
  std::string file = rest.substr(slash2 + 1);
  std::string revision;
  if (const size_t at = name.find('@'); at != std::string::npos) {
    revision = name.substr(at + 1);
    name = name.substr(0, at);
  }
  // A revision at the end: after the last '@' of the path, when what follows names no folder.
  if (const size_t at = file.rfind('@'); at != std::string::npos && file.find('/', at) == std::string::npos) {
    if (!revision.empty()) bad_reference(s, "it gives a revision twice (after the name and at the end)");
    revision = file.substr(at + 1);
    file = file.substr(0, at);
  }
  const std::optional<HubRepoRef> repo = parse_hub_ref(rest.substr(0, slash1) + "/" + name);
  if (!repo) bad_reference(s, "ORG/NAME is not a hub repository name");
  r.repo.repo_id = repo->repo_id;
  if (!revision.empty()) r.repo.revision = revision;
  check_revision(r.repo.repo_id, r.repo.revision);
  if (const std::string why = remote_file_problem(file); !why.empty()) bad_reference(s, "the file path " + why);
  if (file.find_first_of("*?[") != std::string::npos)
    bad_reference(s, "one file is read, not a pattern (name each file: --data for training, --eval-data for eval)");
  r.file = file;
  return r;
}

std::string resolve_dataset_file(const std::string& reference, const HubOptions& o) {
  if (!is_hub_dataset_reference(reference)) return reference;
  const HubDatasetRef ref = parse_dataset_ref(reference);
  const std::string repo_dir = repo_cache_dir(o, ref.repo.repo_id, HubRepoType::Dataset);
  if (const std::optional<std::string> sha = cached_commit(repo_dir, ref.repo.revision)) {
    const fs::path cached = fs::path(repo_dir) / "snapshots" / *sha / ref.file;
    std::error_code ec;
    if (fs::is_regular_file(cached, ec)) return cached.string();  // follows the blob symlink
  }
  if (o.offline)
    throw Error(ErrorCode::INPUT_DATASET_NOT_FOUND,
                fmt::format("[data] {} is not in the local cache ({}) and the network is off (--offline or "
                            "HF_HUB_OFFLINE=1)",
                            reference, repo_dir),
                {{"repo", ref.repo.repo_id}, {"revision", ref.repo.revision}, {"file", ref.file}})
        .with_suggestion("Run the command once without --offline (and with HF_HUB_OFFLINE unset) to download it.");
  return download_repo_file(ref.repo, ref.file, o);
}

}  // namespace bp::hub
