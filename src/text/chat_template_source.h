// Where a model's chat template comes from (issue 15): the ONE reader of a model folder's template,
// used by training, validation, generation and export alike, so a run trains on exactly the text
// the exported model is served with.
//
// As in transformers, <dir>/chat_template.jinja wins over the "chat_template" key of
// tokenizer_config.json (a string, or a list of {name, template} where "default" wins, else the
// first). `--chat-template FILE|chatml` (setting data.chat_template) overrides both. A model with
// neither gets the ChatML default, and the caller warns. The chosen source is named in the run's
// log and saved settings (describe()).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace bp {

struct ChatTemplateSource {
  enum class Kind { ModelFile, ModelConfigKey, Explicit, ChatMLDefault };
  Kind kind = Kind::ChatMLDefault;
  std::string text;    // the Jinja source; "" for ChatMLDefault
  std::string origin;  // a path, "<path> \"chat_template\"", or "chatml"
  // "file", "json_key", "--chat-template" or "chatml_default".
  const char* kind_name() const;
  // "chat_template.jinja file /m/chat_template.jinja", "ChatML default (the model has no chat template)", ...
  std::string describe() const;
};

// The model's own template: <dir>/chat_template.jinja, else tokenizer_config.json's key, else the
// ChatML default. Errors: DEP_MODEL_LOAD_FAILED when a file exists but cannot be read or parsed.
ChatTemplateSource read_model_chat_template(const std::string& model_dir);
// The same with tokenizer_config.json already parsed (Tokenizer::from_dir reads it once).
ChatTemplateSource read_model_chat_template(const std::string& model_dir, const nlohmann::json& tokenizer_config);

// The Jinja text a run trained with: the source's text, or the ChatML template for ChatML.
std::string chat_template_text(const ChatTemplateSource& source);

// The template save_chat_template recorded in `dir` (its chat_template.jinja), or nullopt when the
// folder holds none.
std::optional<ChatTemplateSource> read_recorded_chat_template(const std::string& dir);

// Records the template a run trained with in a model or adapter folder, so export ships exactly it:
// writes <dir>/chat_template.jinja and, where <dir>/tokenizer_config.json has a "chat_template"
// key, sets that key to the same text (readers that ignore the .jinja file agree). Errors:
// RUNTIME_EXPORT_FAILED / IO errors from write_file_atomic; DEP_MODEL_LOAD_FAILED for a bad JSON.
void save_chat_template(const std::string& dir, const std::string& text);

// choice: "" = model_own; "chatml" = ChatML chosen explicitly; anything else is a template file
// (INPUT_VALIDATION_FAILED when it cannot be read or is empty).
ChatTemplateSource choose_chat_template(const ChatTemplateSource& model_own, const std::string& choice);

}  // namespace bp
