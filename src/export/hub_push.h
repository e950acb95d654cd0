// `backprop push RUN --repo org/name` and `backprop export ... --push-to-hub org/name`: the export
// (exporter.h, any format) and then one commit to a Hugging Face hub repository (hub/hf_upload.h)
// holding the export's files and a generated model card (model_card.h).
//
// Where it writes: the export goes where `backprop export` puts it (<run>/export/...); beside it,
// <export folder's parent>/hub-push/ holds the card (README.md), for a LoRA adapter the
// adapter_config.json pushed (its base_model_name_or_path made the base's hub id when the run's
// base has one, so PEFT finds the base anywhere), a GGUF's Modelfile naming the file as ./NAME
// instead of the local path, and upload-state/ (multipart part records: a
// push run again resumes a large file; hf_upload.h). Nothing there holds the token.
//
// Errors: the export's (exporter.h); a repository name or revision the hub cannot take ->
// INPUT_VALIDATION_FAILED, and no token at all -> DEP_HUB_AUTH_FAILED, both before the export;
// the upload's (hf_upload.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "export/exporter.h"
#include "hub/hf_cache.h"
#include "hub/hf_upload.h"

namespace bp {

struct PushRequest {
  ExportRequest export_request;  // what to export and how (format, output, base model)
  hub::UploadRequest upload;     // repo_id, revision, private_repo, commit_message, retries, callbacks
  hub::HubOptions hub;           // endpoint, token, timeout
};

struct PushReport {
  ExportReport exported;
  hub::UploadResult uploaded;
  nlohmann::json result;  // what `push --json` prints (the export's result under "export")
  std::string card_path;  // the README.md pushed
};

// Checks what can be checked before any work: the repository name, the revision, a token.
void check_push_request(const PushRequest& request);

PushReport run_push(const PushRequest& request);

}  // namespace bp
