// Ollama's local store (see ollama_source.h).
#include "hub/ollama_source.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/error.h"
#include "core/file_read.h"
#include "hub/hf_names.h"
#include "io/atomic_file.h"
#include "io/sha256.h"

namespace bp::hub {

namespace fs = std::filesystem;

namespace {
constexpr const char* kModelType = "application/vnd.ollama.image.model";

const FileReader kReader{"ollama", ErrorCode::DEP_MODEL_LOAD_FAILED};

// The manifest folder of NAME ("model", "namespace/model" or "host/namespace/model"); "" when NAME
// is not a name.
std::string manifest_folder(const std::string& name) {
  static const std::regex part("^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$");
  std::vector<std::string> parts;
  for (size_t start = 0; start <= name.size();) {
    const size_t end = std::min(name.find('/', start), name.size());
    parts.push_back(name.substr(start, end - start));
    if (!std::regex_match(parts.back(), part)) return "";
    start = end + 1;
  }
  if (parts.size() == 1) return "registry.ollama.ai/library/" + name;
  if (parts.size() == 2) return "registry.ollama.ai/" + name;
  return parts.size() == 3 ? name : "";
}

// Stamp of a blob already verified: its size and modification time.
std::string blob_stamp(const fs::path& blob) {
  std::error_code ec;
  const auto size = fs::file_size(blob, ec);
  const auto mtime = fs::last_write_time(blob, ec).time_since_epoch().count();
  return ec ? "" : fmt::format("{} {}", size, mtime);
}

// DEP_MODEL_LOAD_FAILED unless `blob` has the layer's size and sha256.
void verify_blob(const fs::path& blob, const OllamaLayer& layer, const std::string& model, const std::string& pull,
                 const std::string& verified_dir) {
  auto refuse = [&](const std::string& what) {
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                fmt::format("[ollama] {}: the blob {} ({}) {}; it is damaged or was changed after `ollama pull`", model,
                            blob.string(), layer.media_type, what),
                {{"blob", blob.string()}, {"digest", "sha256:" + layer.digest_hex}})
        .with_suggestion(fmt::format("Pull the model again (`{}`): Ollama replaces a blob that does not match.", pull));
  };
  std::error_code ec;
  const uint64_t size = fs::file_size(blob, ec);
  if (layer.has_size && size != layer.size)
    refuse(fmt::format("has {} bytes but the manifest says {}", size, layer.size));
  const fs::path stamp = verified_dir.empty() ? fs::path() : fs::path(verified_dir) / ("sha256-" + layer.digest_hex);
  const std::string now = blob_stamp(blob);
  if (!stamp.empty() && !now.empty() && fs::is_regular_file(stamp, ec)) {
    try {
      if (read_file(stamp.string()) == now) return;
    } catch (const Error&) {  // an unreadable stamp: hash again
    }
  }
  const std::string sha = sha256_file_hex(blob.string());
  if (sha != layer.digest_hex)
    refuse(fmt::format("has sha256 {}, not the {} its name and manifest promise", sha, layer.digest_hex));
  if (stamp.empty() || now.empty()) return;
  try {
    fs::create_directories(stamp.parent_path(), ec);
    write_file_atomic(stamp.string(), now);
  } catch (const Error&) {  // a read-only cache only costs the next run a hash
  }
}
}  // namespace

std::vector<OllamaLayer> parse_ollama_manifest(std::string_view text, const std::string& path) {
  const nlohmann::json j = parse_json_bounded(text, path, "ollama");
  auto refuse = [&](const std::string& what) {
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, fmt::format("[ollama] {} is not an Ollama manifest: {}", path, what),
                {{"manifest", path}})
        .with_suggestion("Pull the model again with `ollama pull`; the manifest is damaged.");
  };
  if (j.is_discarded()) refuse("it is not JSON");
  if (!j.is_object() || !j.contains("layers") || !j["layers"].is_array()) refuse("no \"layers\" array");
  static const std::regex digest_re("^sha256:[0-9a-f]{64}$");
  std::vector<OllamaLayer> layers;
  for (const auto& l : j["layers"]) {
    const size_t i = layers.size();
    if (!l.is_object()) refuse(fmt::format("layer {} is not an object", i));
    if (!l.contains("mediaType") || !l["mediaType"].is_string())
      refuse(fmt::format("layer {} has no mediaType string", i));
    if (!l.contains("digest") || !l["digest"].is_string()) refuse(fmt::format("layer {} has no digest string", i));
    OllamaLayer layer;
    layer.media_type = l["mediaType"].get<std::string>();
    const std::string digest = l["digest"].get<std::string>();
    if (!std::regex_match(digest, digest_re))
      refuse(fmt::format("layer {} has the digest '{}', not sha256:<64 hex digits>", i, sanitize_server_text(digest)));
    layer.digest_hex = digest.substr(7);
    if (l.contains("size")) {
      if (!l["size"].is_number_unsigned()) refuse(fmt::format("layer {} has a size that is not a byte count", i));
      layer.size = l["size"].get<uint64_t>();
      layer.has_size = true;
    }
    layers.push_back(std::move(layer));
  }
  return layers;
}

bool is_ollama_reference(const std::string& reference) {
  return reference.rfind("ollama:", 0) == 0;
}

OllamaModel find_ollama_model(const std::string& reference, const std::string& models_dir,
                              const std::string& verified_dir) {
  OllamaModel m;
  const std::string spec = reference.substr(7);  // after "ollama:"
  const auto colon = spec.rfind(':');
  const bool tagged = colon != std::string::npos && spec.find('/', colon) == std::string::npos;
  m.name = tagged ? spec.substr(0, colon) : spec;
  m.tag = tagged ? spec.substr(colon + 1) : "latest";
  static const std::regex tag_re("^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$");
  const std::string folder = manifest_folder(m.name);
  if (folder.empty() || !std::regex_match(m.tag, tag_re))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[ollama] '{}' is not a model name: write ollama:NAME or ollama:NAME:TAG, where NAME is "
                            "model, namespace/model or host/namespace/model (letters, digits, '.', '_', '-'), not a "
                            "path",
                            sanitize_server_text(reference)))
        .with_suggestion(
            "Copy the name from `ollama list` (for example ollama:llama3.2:1b); for a GGUF file, pass "
            "its path without ollama:.");
  const fs::path manifest = fs::path(models_dir) / "manifests" / folder / m.tag;
  m.manifest_path = manifest.string();
  const std::string pull = fmt::format("ollama pull {}:{}", m.name, m.tag);
  std::error_code ec;
  if (!fs::is_regular_file(manifest, ec))
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                fmt::format("[ollama] {}:{} is not in Ollama's store: {} does not exist (store: {}, from OLLAMA_MODELS "
                            "or ~/.ollama/models)",
                            m.name, m.tag, manifest.string(), models_dir))
        .with_suggestion(fmt::format("Run `{}` (or `ollama list` to see the exact names), or set OLLAMA_MODELS to the "
                                     "store that holds it.",
                                     pull));
  std::vector<OllamaLayer> layers;
  try {
    layers = parse_ollama_manifest(read_file_capped(manifest.string(), FileKind::Config, kReader), manifest.string());
  } catch (Error& e) {
    if (e.code() == ErrorCode::DEP_MODEL_LOAD_FAILED)
      e.with_suggestion(fmt::format("Pull the model again: `{}`.", pull));
    throw;
  }
  const std::string model = fmt::format("{}:{}", m.name, m.tag);
  for (const auto& layer : layers) {
    const std::string& type = layer.media_type;
    const bool wanted = type == kModelType || type == "application/vnd.ollama.image.template" ||
                        type == "application/vnd.ollama.image.system" ||
                        type == "application/vnd.ollama.image.params" || type == "application/vnd.ollama.image.adapter";
    if (!wanted) continue;
    const fs::path blob = fs::path(models_dir) / "blobs" / ("sha256-" + layer.digest_hex);
    if (!fs::is_regular_file(blob, ec))
      throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, fmt::format("[ollama] {}: the blob {} ({}) named by {} is missing",
                                                                model, blob.string(), type, manifest.string()))
          .with_suggestion(fmt::format("Pull the model again: `{}`.", pull));
    verify_blob(blob, layer, model, pull, verified_dir);
    auto text = [&] { return read_file_capped(blob.string(), FileKind::Config, kReader); };
    if (type == kModelType) m.gguf_path = blob.string();
    if (type == "application/vnd.ollama.image.template") m.template_text = text();
    if (type == "application/vnd.ollama.image.system") m.system_prompt = text();
    if (type == "application/vnd.ollama.image.params") m.params_json = text();
    if (type == "application/vnd.ollama.image.adapter") m.adapter_path = blob.string();
  }
  if (m.gguf_path.empty())
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                fmt::format("[ollama] {} has no model layer ({})", manifest.string(), kModelType))
        .with_suggestion(fmt::format("Pull the model again: `{}`.", pull));
  return m;
}

}  // namespace bp::hub
