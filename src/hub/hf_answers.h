// The hub's JSON answers the downloader reads (hf_download.h), parsed apart from the network so
// the fuzz target tests/fuzz/hub_json_fuzz.cpp reaches them:
//
//   model info   GET /api/models/{repo}/revision/{rev}: {"sha": 40-hex commit, "siblings":
//                [{"rfilename": name}, ...]}
//   index        model.safetensors.index.json: {"weight_map": {tensor: shard file name}}
//
// Every file name is checked with check_remote_file_name (hf_names.h) here, before the
// downloader makes a path of it.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace bp::hub {

struct HubModelInfo {
  std::string sha;              // the commit the revision stands for
  std::set<std::string> files;  // the listing (siblings' rfilename)
};

// DEP_MODEL_DOWNLOAD_FAILED when the answer is not JSON or has no 40-hex "sha";
// DEP_MODEL_LOAD_FAILED for a listed name that would leave the snapshot; INPUT_JSON_TOO_DEEP.
HubModelInfo parse_model_info(std::string_view body, const std::string& url, const std::string& repo_id);

// The shard file names of an index's weight_map (sorted, each once). DEP_MODEL_LOAD_FAILED when the
// index is not JSON, has no weight_map object, a shard is not a string, or a name would leave the
// snapshot; INPUT_JSON_TOO_DEEP.
std::vector<std::string> parse_index_shards(std::string_view text, const std::string& path, const std::string& repo_id);

}  // namespace bp::hub
