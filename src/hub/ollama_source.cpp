// Ollama's local store (see ollama_source.h).
#include "hub/ollama_source.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_read.h"

namespace bp::hub {

namespace fs = std::filesystem;

namespace {
std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

bool is_ollama_reference(const std::string& reference) {
  return reference.rfind("ollama:", 0) == 0;
}

OllamaModel find_ollama_model(const std::string& reference, const std::string& models_dir) {
  OllamaModel m;
  std::string spec = reference.substr(7);  // after "ollama:"
  const auto colon = spec.rfind(':');
  m.name = colon == std::string::npos ? spec : spec.substr(0, colon);
  m.tag = colon == std::string::npos ? "latest" : spec.substr(colon + 1);
  if (m.name.empty() || m.tag.empty() || m.name.find("..") != std::string::npos || m.tag.find('/') != std::string::npos)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[ollama] '{}' is not a model name; write ollama:NAME or ollama:NAME:TAG", reference));
  const std::string path_name = m.name.find('/') == std::string::npos ? "library/" + m.name : m.name;
  const fs::path manifest = fs::path(models_dir) / "manifests" / "registry.ollama.ai" / path_name / m.tag;
  m.manifest_path = manifest.string();
  const std::string pull = fmt::format("ollama pull {}:{}", m.name, m.tag);
  if (!fs::is_regular_file(manifest))
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                fmt::format("[ollama] {}:{} is not in Ollama's store: {} does not exist (store: {}, from OLLAMA_MODELS "
                            "or ~/.ollama/models)",
                            m.name, m.tag, manifest.string(), models_dir))
        .with_suggestion(fmt::format("Run `{}` (or `ollama list` to see the exact names), or set OLLAMA_MODELS to the "
                                     "store that holds it.",
                                     pull));
  const nlohmann::json j = parse_json_bounded(read_text(manifest), manifest.string(), "ollama");
  if (j.is_discarded() || !j.contains("layers") || !j["layers"].is_array())
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                fmt::format("[ollama] {} is not an Ollama manifest (no layers)", manifest.string()))
        .with_suggestion(fmt::format("Pull the model again: `{}`.", pull));
  for (const auto& layer : j["layers"]) {
    const std::string type = layer.value("mediaType", ""), digest = layer.value("digest", "");
    if (digest.rfind("sha256:", 0) != 0 || digest.find('/') != std::string::npos) continue;
    const fs::path blob = fs::path(models_dir) / "blobs" / ("sha256-" + digest.substr(7));
    const bool wanted = type == "application/vnd.ollama.image.model" ||
                        type == "application/vnd.ollama.image.template" ||
                        type == "application/vnd.ollama.image.system" ||
                        type == "application/vnd.ollama.image.params" || type == "application/vnd.ollama.image.adapter";
    if (!wanted) continue;
    if (!fs::is_regular_file(blob))
      throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                  fmt::format("[ollama] {}:{}: the blob {} ({}) named by {} is missing", m.name, m.tag, blob.string(),
                              type, manifest.string()))
          .with_suggestion(fmt::format("Pull the model again: `{}`.", pull));
    if (type == "application/vnd.ollama.image.model") m.gguf_path = blob.string();
    if (type == "application/vnd.ollama.image.template") m.template_text = read_text(blob);
    if (type == "application/vnd.ollama.image.system") m.system_prompt = read_text(blob);
    if (type == "application/vnd.ollama.image.params") m.params_json = read_text(blob);
    if (type == "application/vnd.ollama.image.adapter") m.adapter_path = blob.string();
  }
  if (m.gguf_path.empty())
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                fmt::format("[ollama] {} has no model layer (application/vnd.ollama.image.model)", manifest.string()))
        .with_suggestion(fmt::format("Pull the model again: `{}`.", pull));
  return m;
}

}  // namespace bp::hub
