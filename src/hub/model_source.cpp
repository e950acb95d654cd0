// Resolving --model references (see model_source.h).
#include "hub/model_source.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "hub/gguf_source.h"
#include "hub/hf_download.h"
#include "hub/hf_names.h"
#include "hub/ollama_source.h"
#include "io/atomic_file.h"

namespace bp::hub {

namespace fs = std::filesystem;

ModelSource resolve_model_source(const std::string& reference, const HubOptions& o) {
  ModelSource s;
  s.reference = reference;
  s.path = reference;
  std::error_code ec;
  const auto ref = parse_hub_ref(reference);
  if (is_ollama_reference(reference)) {
    const std::string verified = o.derived_dir.empty() ? "" : (fs::path(o.derived_dir) / "ollama-verified").string();
    const OllamaModel m = find_ollama_model(reference, o.ollama_dir, verified);
    s.path = gguf_model_folder(m.gguf_path, o.derived_dir);
    s.from_ollama = true;
    s.ollama_template = m.template_text;
    s.ollama_system = m.system_prompt;
    // Kept beside the config for export (FROM/ADAPTER Modelfiles keep the model's own template).
    const nlohmann::json kept = {{"name", m.name},
                                 {"tag", m.tag},
                                 {"manifest", m.manifest_path},
                                 {"gguf", m.gguf_path},
                                 {"template", m.template_text},
                                 {"system", m.system_prompt},
                                 {"params", m.params_json},
                                 {"adapter", m.adapter_path}};
    write_file_atomic((fs::path(s.path) / "ollama.json").string(), kept.dump(2));
    return s;
  }
  if (is_gguf_file(reference)) {
    s.path = gguf_model_folder(reference, o.derived_dir);
    s.from_gguf = true;
    return s;
  }
  if (fs::is_regular_file(reference, ec)) check_non_gguf_model_file(reference);  // a file is no folder
  if (reference.empty() || fs::exists(reference, ec) || !ref) return s;
  s.from_hub = true;
  check_revision(ref->repo_id, ref->revision);  // before refs/<revision> names a path
  if (auto cached = find_cached_snapshot(o, *ref)) {
    s.path = *cached;
    s.commit = fs::path(*cached).filename().string();
    return s;
  }
  if (o.offline)
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                fmt::format("[hub] {}@{} is not in the Hugging Face cache ({}), and offline mode (--offline or "
                            "HF_HUB_OFFLINE=1) forbids downloading it",
                            ref->repo_id, ref->revision, repo_cache_dir(o, ref->repo_id)),
                {{"repo", ref->repo_id}, {"revision", ref->revision}, {"cache", o.cache_dir}})
        .with_suggestion(
            "Run once without --offline (and with HF_HUB_OFFLINE unset) to download it, point "
            "HF_HUB_CACHE / HF_HOME at the cache that holds it, or pass a local folder.");
  s.path = download_snapshot(*ref, o);
  s.commit = fs::path(s.path).filename().string();
  s.downloaded = true;
  return s;
}

}  // namespace bp::hub
