// Chat-template rendering, refusal of templates we cannot run, and loss masks (see header).
#include "text/chat_template.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/error.h"
#include "text/jinja_eval.h"

namespace bp {

const char* const kChatMLTemplate =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

namespace {

jinja::Value message_value(const ChatMessage& m) {
  jinja::Object o;
  o.reserve(2 + (m.extra.is_object() ? m.extra.size() : 0));
  o.emplace_back("role", jinja::Value::string(m.role));
  switch (m.content_kind) {
    case ChatMessage::ContentKind::Text: o.emplace_back("content", jinja::Value::string(m.content)); break;
    case ChatMessage::ContentKind::Null: o.emplace_back("content", jinja::Value::none()); break;
    case ChatMessage::ContentKind::Absent: break;
  }
  if (m.extra.is_object())
    for (auto it = m.extra.begin(); it != m.extra.end(); ++it) o.emplace_back(it.key(), jinja::Value::from_json(*it));
  return jinja::Value::object(std::move(o));
}

// transformers: compiled_template.render(messages=chat, tools=tool_schemas, documents=documents,
// add_generation_prompt=..., **{**special_tokens_map, **kwargs}).
jinja::Value make_context(const Conversation& conv, bool add_generation_prompt, const std::string& bos,
                          const std::string& eos, const nlohmann::ordered_json& kwargs = nlohmann::ordered_json()) {
  jinja::Array msgs;
  msgs.reserve(conv.size());
  for (const auto& m : conv) msgs.push_back(message_value(m));
  jinja::Value ctx = jinja::Value::object(
      {{"messages", jinja::Value::array(std::move(msgs))},
       {"tools", conv.tools.is_array() ? jinja::Value::from_json(conv.tools) : jinja::Value::none()},
       {"documents", jinja::Value::none()},
       {"add_generation_prompt", jinja::Value::boolean(add_generation_prompt)},
       {"bos_token", jinja::Value::string(bos)},
       {"eos_token", jinja::Value::string(eos)}});
  for (const nlohmann::ordered_json* vars : {&kwargs, &conv.template_kwargs})
    if (vars->is_object())
      for (auto it = vars->begin(); it != vars->end(); ++it) ctx.set(it.key(), jinja::Value::from_json(*it));
  return ctx;
}

bool has_null_content(const Conversation& conv) {
  return std::any_of(conv.begin(), conv.end(),
                     [](const ChatMessage& m) { return m.content_kind != ChatMessage::ContentKind::Text; });
}

const jinja::Template& tmpl_of(const std::shared_ptr<const void>& p) {
  return *static_cast<const jinja::Template*>(p.get());
}

Error budget_error(const ChatTemplateSource& source, const jinja::JinjaError& e) {
  return Error(ErrorCode::INPUT_CHAT_TEMPLATE_BUDGET,
               fmt::format("[chat_template] {} stopped: {}", source.describe(), e.what()));
}

// A render that failed. Only raise_exception is the conversation's fault (the template rejects
// it); anything else is the template's own: past its budget, a construct we do not run reached
// only by this conversation, or an error inside it (Python's Jinja2 fails there too).
Error render_error(const ChatTemplateSource& source, const jinja::JinjaError& e, bool null_content = false) {
  using K = jinja::JinjaError::Kind;
  switch (e.kind()) {
    case K::Budget: return budget_error(source, e);
    case K::Raised:
      return Error(ErrorCode::INPUT_VALIDATION_FAILED,
                   fmt::format("[chat_template] the chat template rejected the conversation: {}", e.what()));
    case K::Syntax:
    case K::Unsupported:
      return Error(ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED,
                   fmt::format("[chat_template] {} cannot be run: {}", source.describe(), e.what()),
                   {{"template_source", source.kind_name()}, {"template_origin", source.origin}});
    case K::Runtime: break;
  }
  return Error(ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED,
               null_content
                   ? fmt::format("[chat_template] {} failed while rendering a conversation (Python's Jinja2 fails "
                                 "there too): {}. The conversation has a message whose content is null or missing "
                                 "(OpenAI's form of a message that only calls tools), which this template cannot "
                                 "take: write \"content\": \"\" there",
                                 source.describe(), e.what())
                   : fmt::format("[chat_template] {} failed while rendering a conversation (Python's Jinja2 fails "
                                 "there too; the template, not the data, needs fixing): {}",
                                 source.describe(), e.what()),
               {{"template_source", source.kind_name()}, {"template_origin", source.origin}});
}

// Renders sample conversations so constructs that only fail at run time (an unknown filter in a
// branch taken for ordinary chats) are found up front. raise_exception is fine (the template
// rejects our probe, e.g. a system message), anything Unsupported/Syntax/Budget is not.
void probe(const jinja::Template& t, const std::string& bos, const std::string& eos, const jinja::RenderLimits& lim) {
  const Conversation convs[] = {
      {{"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}, {"assistant", "B"}},
      {{"user", "U"}, {"assistant", "A"}},
  };
  for (const auto& c : convs)
    for (bool gen : {false, true}) {
      try {
        t.render(make_context(c, gen, bos, eos), 0, lim);
      } catch (const jinja::JinjaError& e) {
        if (e.kind() != jinja::JinjaError::Kind::Raised && e.kind() != jinja::JinjaError::Kind::Runtime) throw;
      }
    }
}

}  // namespace

ChatTemplate::ChatTemplate(const ChatTemplateSource& source, std::string bos_token, std::string eos_token,
                           const jinja::RenderLimits& limits)
    : bos_(std::move(bos_token)), eos_(std::move(eos_token)), source_(source), limits_(limits) {
  if (source_.text.empty()) {  // the ChatML default, or --chat-template chatml
    impl_ = std::make_shared<jinja::Template>(kChatMLTemplate);
    if (is_fallback()) {
      warning_ =
          "[chat_template] the model has no chat template (no chat_template.jinja and no \"chat_template\" in "
          "tokenizer_config.json); using the ChatML default (choose one with --chat-template FILE)";
      spdlog::warn("{}", warning_);
    }
    return;
  }
  try {
    auto t = std::make_shared<jinja::Template>(source_.text);
    probe(*t, bos_, eos_, limits_);
    generation_blocks_ = t->has_generation_blocks();
    impl_ = t;
  } catch (const jinja::JinjaError& e) {
    if (e.kind() == jinja::JinjaError::Kind::Budget) throw budget_error(source_, e);
    throw Error(ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED,
                fmt::format("[chat_template] {} cannot be run: {}", source_.describe(), e.what()),
                {{"template_source", source_.kind_name()}, {"template_origin", source_.origin}});
  }
}

ChatTemplate::ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token)
    : ChatTemplate(source.empty()
                       ? ChatTemplateSource{}
                       : ChatTemplateSource{ChatTemplateSource::Kind::ModelConfigKey, source, "(template text)"},
                   std::move(bos_token), std::move(eos_token)) {}

ChatTemplate ChatTemplate::from_tokenizer(const Tokenizer& tok, const std::string& choice,
                                          const jinja::RenderLimits& limits) {
  std::string bos = tok.bos_id() >= 0 ? tok.id_to_token(tok.bos_id()) : "";
  std::string eos = tok.eos_ids().empty() ? "" : tok.id_to_token(tok.eos_ids().front());
  return ChatTemplate(choose_chat_template(tok.chat_template_source(), choice), bos, eos, limits);
}

std::string ChatTemplate::render(const Conversation& conv, bool add_generation_prompt) const {
  try {
    return tmpl_of(impl_).render(make_context(conv, add_generation_prompt, bos_, eos_, kwargs_), now_epoch_s_, limits_);
  } catch (const jinja::JinjaError& e) {
    throw render_error(source_, e, has_null_content(conv));
  }
}

std::string ChatTemplate::render_spans(const Conversation& conv, std::vector<std::pair<size_t, size_t>>& spans) const {
  try {
    jinja::RenderedText r =
        tmpl_of(impl_).render_with_spans(make_context(conv, false, bos_, eos_, kwargs_), now_epoch_s_, limits_);
    spans = std::move(r.generation_spans);
    return std::move(r.text);
  } catch (const jinja::JinjaError& e) {
    throw render_error(source_, e, has_null_content(conv));
  }
}

void ChatTemplate::set_template_kwargs(const nlohmann::ordered_json& kwargs) {
  if (kwargs.is_null()) {
    kwargs_ = nlohmann::ordered_json::object();
    return;
  }
  check_template_variables(kwargs, "--template-kwargs");
  kwargs_ = kwargs;
}

void check_template_variables(const nlohmann::ordered_json& kwargs, std::string_view what) {
  if (!kwargs.is_object())
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[chat_template] {} must be a JSON object of template variables such as "
                            "{{\"enable_thinking\": false}}, got {}",
                            what, kwargs.dump()));
  for (auto it = kwargs.begin(); it != kwargs.end(); ++it)
    if (is_reserved_template_variable(it.key()))
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  fmt::format("[chat_template] {} may not set '{}': every render passes it already (messages and "
                              "tools come from the data, tools also from --tools)",
                              what, it.key()));
}

bool is_reserved_template_variable(std::string_view key) {
  return key == "messages" || key == "tools" || key == "documents" || key == "add_generation_prompt";
}

bool ChatMessage::has_tool_calls() const {
  if (!extra.is_object()) return false;
  auto it = extra.find("tool_calls");
  return it != extra.end() && it->is_array() && !it->empty();
}

Conversation Conversation::head(size_t n) const {
  Conversation c(begin(), begin() + static_cast<std::ptrdiff_t>(std::min(n, size())));
  c.tools = tools;
  c.template_kwargs = template_kwargs;
  return c;
}

}  // namespace bp
