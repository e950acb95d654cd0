// The one reader of a model folder's chat template (see chat_template_source.h).
#include "text/chat_template_source.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_read.h"
#include "io/atomic_file.h"
#include "text/chat_template.h"

namespace bp {

namespace {

namespace fs = std::filesystem;
constexpr uintmax_t kMaxTemplateBytes = 4u << 20;  // real templates are < 100 KB

// Reads a template file; nullopt-like "" plus ok=false when it does not exist.
bool read_template_file(const fs::path& path, ErrorCode code, std::string& out) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return false;
  if (!fs::is_regular_file(path, ec))
    throw Error(code, fmt::format("[chat_template] {} is not a regular file", path.string()));
  const uintmax_t size = fs::file_size(path, ec);
  if (ec || size > kMaxTemplateBytes)
    throw Error(code, fmt::format("[chat_template] {} is {} bytes; a chat template may have at most {} bytes",
                                  path.string(), ec ? 0 : size, kMaxTemplateBytes));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(code, fmt::format("[chat_template] cannot open {}", path.string()));
  std::stringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}

std::string template_from_config(const nlohmann::json& c) {
  if (!c.is_object()) return {};
  const auto it = c.find("chat_template");
  if (it == c.end()) return {};
  if (it->is_string()) return it->get<std::string>();
  std::string chosen;
  if (it->is_array()) {  // [{name, template}]: "default" wins, else the first
    for (const auto& t : *it) {
      if (!t.is_object() || !t.contains("template") || !t["template"].is_string()) continue;
      const auto name = t.find("name");
      const bool is_default = name != t.end() && name->is_string() && name->get<std::string>() == "default";
      if (chosen.empty() || is_default) chosen = t["template"].get<std::string>();
      if (is_default) break;
    }
  }
  return chosen;
}

}  // namespace

const char* ChatTemplateSource::kind_name() const {
  switch (kind) {
    case Kind::ModelFile: return "file";
    case Kind::ModelConfigKey: return "json_key";
    case Kind::Explicit: return "--chat-template";
    case Kind::ChatMLDefault: return "chatml_default";
  }
  return "chatml_default";
}

std::string ChatTemplateSource::describe() const {
  switch (kind) {
    case Kind::ModelFile: return fmt::format("the model's chat_template.jinja ({})", origin);
    case Kind::ModelConfigKey: return fmt::format("the model's tokenizer_config.json \"chat_template\" ({})", origin);
    case Kind::Explicit: return fmt::format("--chat-template {}", origin);
    case Kind::ChatMLDefault: return "the ChatML default (the model has no chat template)";
  }
  return {};
}

ChatTemplateSource read_model_chat_template(const std::string& model_dir, const nlohmann::json& tokenizer_config) {
  ChatTemplateSource s;
  const fs::path jinja = fs::path(model_dir) / "chat_template.jinja";
  if (read_template_file(jinja, ErrorCode::DEP_MODEL_LOAD_FAILED, s.text) && !s.text.empty()) {
    s.kind = ChatTemplateSource::Kind::ModelFile;
    s.origin = jinja.string();
    return s;
  }
  s.text = template_from_config(tokenizer_config);
  if (!s.text.empty()) {
    s.kind = ChatTemplateSource::Kind::ModelConfigKey;
    s.origin = (fs::path(model_dir) / "tokenizer_config.json").string();
    return s;
  }
  return ChatTemplateSource{};
}

ChatTemplateSource read_model_chat_template(const std::string& model_dir) {
  const fs::path config = fs::path(model_dir) / "tokenizer_config.json";
  nlohmann::json c;
  std::string text;
  if (read_template_file(config, ErrorCode::DEP_MODEL_LOAD_FAILED, text)) {
    c = parse_json_bounded(text, config.string(), "tokenizer");
    if (c.is_discarded())
      throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, fmt::format("[tokenizer] {}: not valid JSON", config.string()));
  }
  return read_model_chat_template(model_dir, c);
}

ChatTemplateSource choose_chat_template(const ChatTemplateSource& model_own, const std::string& choice) {
  if (choice.empty()) return model_own;
  ChatTemplateSource s;
  s.kind = ChatTemplateSource::Kind::Explicit;
  s.origin = choice;
  if (choice == "chatml") return s;  // text "" = ChatML, chosen explicitly
  if (!read_template_file(choice, ErrorCode::INPUT_VALIDATION_FAILED, s.text))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[chat_template] --chat-template {}: no such file (give a Jinja template file or 'chatml')",
                            choice));
  if (s.text.empty())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[chat_template] --chat-template {} is empty", choice));
  return s;
}

std::string chat_template_text(const ChatTemplateSource& source) {
  return source.text.empty() ? std::string(kChatMLTemplate) : source.text;
}

std::optional<ChatTemplateSource> read_recorded_chat_template(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_regular_file(fs::path(dir) / "chat_template.jinja", ec)) return std::nullopt;
  ChatTemplateSource s = read_model_chat_template(dir, nlohmann::json::object());
  if (s.kind != ChatTemplateSource::Kind::ModelFile) return std::nullopt;
  return s;
}

void save_chat_template(const std::string& dir, const std::string& text) {
  write_file_atomic((fs::path(dir) / "chat_template.jinja").string(), text);
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::exists(config, ec)) return;
  nlohmann::ordered_json c = nlohmann::ordered_json::parse(read_file(config.string()), nullptr, false);
  if (c.is_discarded() || !c.is_object())
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED, fmt::format("[tokenizer] {}: not valid JSON", config.string()));
  if (!c.contains("chat_template")) return;
  c["chat_template"] = text;
  write_file_atomic(config.string(), c.dump(2) + "\n");
}

}  // namespace bp
