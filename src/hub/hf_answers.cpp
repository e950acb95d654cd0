// Parsing the hub's JSON answers (see hf_answers.h).
#include "hub/hf_answers.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_read.h"
#include "hub/hf_cache.h"
#include "hub/hf_names.h"

namespace bp::hub {

HubModelInfo parse_model_info(std::string_view body, const std::string& url, const std::string& repo_id) {
  const nlohmann::json j = parse_json_bounded(body, url, "hub");
  const bool has_sha = j.is_object() && j.contains("sha") && j["sha"].is_string();
  if (!has_sha || !is_commit_sha(j["sha"].get<std::string>()))
    throw Error(ErrorCode::DEP_MODEL_DOWNLOAD_FAILED,
                fmt::format("[hub] {} did not answer with the model's commit (no 40-hex 'sha' in the JSON of {} "
                            "bytes)",
                            sanitize_server_text(url), body.size()),
                {{"repo", repo_id}, {"url", sanitize_server_text(url)}})
        .with_suggestion("Check HF_ENDPOINT: it must be a Hugging Face hub (or a mirror of one).");
  HubModelInfo info;
  info.sha = j["sha"].get<std::string>();
  if (j.contains("siblings") && j["siblings"].is_array())
    for (const auto& s : j["siblings"]) {
      if (!s.is_object() || !s.contains("rfilename") || !s["rfilename"].is_string()) continue;
      const std::string name = s["rfilename"].get<std::string>();
      check_remote_file_name(name, url, repo_id);
      info.files.insert(name);
    }
  return info;
}

std::vector<std::string> parse_index_shards(std::string_view text, const std::string& path,
                                            const std::string& repo_id) {
  const nlohmann::json j = parse_json_bounded(text, path, "hub");
  auto refuse = [&](const std::string& what) {
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, fmt::format("[hub] {} of {}: {}", path, repo_id, what),
                {{"repo", repo_id}, {"path", path}})
        .with_suggestion(
            "The repository's model.safetensors.index.json is damaged; use another revision or "
            "repository, or a local folder.");
  };
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    refuse("not a safetensors index (no \"weight_map\" object)");
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : j["weight_map"].items()) {
    if (!shard.is_string())
      refuse(fmt::format("the weight_map entry of '{}' is not a file name", sanitize_server_text(tensor)));
    const std::string name = shard.get<std::string>();
    check_remote_file_name(name, path, repo_id);
    shards.insert(name);
  }
  return {shards.begin(), shards.end()};
}

}  // namespace bp::hub
