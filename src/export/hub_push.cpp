// Export, model card, one hub commit (see hub_push.h).
#include "export/hub_push.h"

#include <fmt/format.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_read.h"
#include "export/model_card.h"
#include "hub/hf_http.h"
#include "hub/hf_names.h"
#include "io/atomic_file.h"

namespace bp {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The base as the run (or the adapter) named it: settings.json's model.path, else the adapter's
// base_model_name_or_path, else the folder the export used.
std::string base_reference(const ExportReport& ex) {
  const std::string run_dir = ex.result.value("run_dir", "");
  if (!run_dir.empty())
    if (const auto s = read_json_object_file((fs::path(run_dir) / "settings.json").string());
        s && s->contains("model") && (*s)["model"].is_object() && (*s)["model"].value("path", "") != "")
      return (*s)["model"]["path"].get<std::string>();
  const std::string out = ex.result.value("output", "");
  if (const auto a = read_json_object_file((fs::path(out) / "adapter_config.json").string()))
    if (const std::string b = a->value("base_model_name_or_path", ""); !b.empty()) return b;
  return ex.result.value("base_model", "");
}

// The base's licence: its card's YAML (a local folder's README.md), else the hub's cardData for a
// hub base (one request, best effort: a push does not fail for want of a licence).
std::string base_license(const std::string& base_dir, const std::string& base_id, const hub::HubOptions& o) {
  std::error_code ec;
  if (!base_dir.empty() && fs::is_regular_file(fs::path(base_dir) / "README.md", ec)) {
    try {
      const std::string l =
          license_from_card(read_file_capped((fs::path(base_dir) / "README.md").string(), FileKind::Config, {"push"}));
      if (!l.empty()) return l;
    } catch (const Error&) {
    }
  }
  if (base_id.empty()) return "";
  const hub::HttpReply r = hub::HubHttp(o.endpoint, o.token, o.timeout_s)
                               .request("GET", o.endpoint + "/api/models/" + base_id, /*follow_absolute=*/true);
  if (r.status != 200) return "";
  const json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("cardData") || !j["cardData"].is_object()) return "";
  const json& l = j["cardData"].value("license", json());
  const std::string id = l.is_string() ? l.get<std::string>() : "";
  // Only a licence id (apache-2.0, llama3.1, other) goes into the YAML.
  return !id.empty() && id.size() < 64 &&
                 id.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789.-_") == std::string::npos
             ? id
             : "";
}

}  // namespace

void check_push_request(const PushRequest& rq) {
  if (const std::string problem = hub::hub_repo_id_problem(rq.upload.repo_id); !problem.empty())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[push] cannot push to '{}': {}", hub::sanitize_server_text(rq.upload.repo_id), problem),
                {{"repo", hub::sanitize_server_text(rq.upload.repo_id)}})
        .with_suggestion(
            "Name the repository as org/name (your user name or an organization), e.g. --repo alice/my-adapter.");
  hub::check_revision(rq.upload.repo_id, rq.upload.revision);
  if (rq.hub.offline)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                "[push] a push needs the network, but HF_HUB_OFFLINE or --offline is set")
        .with_suggestion("Unset HF_HUB_OFFLINE (and drop --offline) to push; `backprop export` alone works offline.");
  if (rq.hub.token.empty())
    throw Error(ErrorCode::DEP_HUB_AUTH_FAILED,
                "[push] no Hugging Face token: HF_TOKEN is unset and there is no token file (HF_TOKEN_PATH, else "
                "$HF_HOME/token), and the hub accepts no upload without one",
                {{"repo", rq.upload.repo_id}, {"endpoint", rq.hub.endpoint}})
        .with_suggestion(
            fmt::format("Log in with `huggingface-cli login` or set HF_TOKEN to a token with write access (made at "
                        "{}/settings/tokens).",
                        rq.hub.endpoint));
}

PushReport run_push(const PushRequest& rq) {
  check_push_request(rq);
  PushReport rep;
  rep.exported = run_export(rq.export_request);
  const json& ex = rep.exported.result;
  const std::string format = ex.value("format", rq.export_request.format);
  const fs::path output = ex.value("output", "");
  const bool folder = fs::is_directory(output);
  const fs::path from = folder ? output : output.parent_path();
  const fs::path staging = output.parent_path() / "hub-push";
  fs::create_directories(staging);

  const std::string base_ref = base_reference(rep.exported);
  std::string base_id = hub_id_of_model_ref(base_ref);
  if (base_id.empty()) base_id = hub_id_of_model_ref(ex.value("base_model", ""));

  hub::UploadRequest up = rq.upload;
  up.files.clear();
  std::vector<std::string> names;
  for (const auto& f : ex.value("files", json::array())) {
    if (!f.is_string()) continue;
    const std::string name = f.get<std::string>();
    if (name == "README.md") continue;  // the card below replaces a copied one
    std::string local = (from / name).string();
    if (name == "adapter_config.json" && !base_id.empty()) {  // portable: the base by its hub id
      if (auto cfg = read_json_object_file((from / name).string())) {
        (*cfg)["base_model_name_or_path"] = base_id;
        local = (staging / name).string();
        write_file_atomic(local, cfg->dump(2) + "\n");
      }
    }
    up.files.push_back({name, local});
    names.push_back(name);
  }
  // A Modelfile names its GGUF by the local path written: the pushed one names it beside itself.
  for (auto& f : up.files) {
    if (fs::path(f.path_in_repo).extension() != ".Modelfile") continue;
    std::string text = read_file(f.local_path);
    bool changed = false;
    for (const auto& other : up.files) {
      const std::string local = (from / other.path_in_repo).string();
      if (fs::path(other.path_in_repo).extension() != ".gguf") continue;
      for (size_t at = text.find(local); at != std::string::npos; at = text.find(local, at)) {
        text.replace(at, local.size(), "./" + other.path_in_repo);
        changed = true;
      }
    }
    if (!changed) continue;
    f.local_path = (staging / f.path_in_repo).string();
    write_file_atomic(f.local_path, text);
  }

  ModelCardInput card;
  card.repo_id = up.repo_id;
  card.format = format;
  card.run_dir = ex.value("run_dir", "");
  card.base_model = base_ref;
  card.base_model_id = base_id;
  card.license = base_license(ex.value("base_model", ""), base_id, rq.hub);
  card.files = names;
  card.export_result = ex;
  rep.card_path = (staging / "README.md").string();
  write_file_atomic(rep.card_path, model_card_markdown(card));
  up.files.push_back({"README.md", rep.card_path});

  if (up.commit_message.empty())
    up.commit_message = card.run_dir.empty() ? fmt::format("Upload {} with backprop", format)
                                             : fmt::format("Upload {} from backprop run {}", format,
                                                           fs::path(card.run_dir).filename().string());
  up.state_dir = (staging / "upload-state").string();
  rep.uploaded = hub::upload_to_hub(up, rq.hub);

  const hub::UploadResult& u = rep.uploaded;
  rep.result = {{"repo", up.repo_id},
                {"revision", up.revision},
                {"format", format},
                {"repo_url", u.repo_url},
                {"commit_url", u.commit_url},
                {"commit_oid", u.commit_oid},
                {"created_repo", u.created_repo},
                {"created_branch", u.created_branch},
                {"private", up.private_repo},
                {"files", names},
                {"lfs_files", u.lfs_files},
                {"lfs_skipped", u.lfs_skipped},
                {"ignored", u.ignored},
                {"bytes_sent", u.bytes_sent},
                {"parts_sent", u.parts_sent},
                {"parts_resumed", u.parts_resumed},
                {"retries", u.retries},
                {"base_model", base_id.empty() ? json(nullptr) : json(base_id)},
                {"license", card.license.empty() ? json(nullptr) : json(card.license)},
                {"model_card", rep.card_path},
                {"export", ex}};
  return rep;
}

}  // namespace bp
