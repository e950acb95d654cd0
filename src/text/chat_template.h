// Chat templates and loss masks (issues 5 and 15, DESIGN.md "text & data").
//
// ChatTemplate renders a conversation with the model's own Jinja chat template through the
// Jinja-subset interpreter (jinja_*.h). Where the template comes from is chat_template_source.h
// (chat_template.jinja, tokenizer_config.json, --chat-template, or the ChatML default). A template
// the interpreter cannot run is never silently replaced: the constructor throws
// INPUT_CHAT_TEMPLATE_UNSUPPORTED naming the construct and line, and the user chooses with
// --chat-template FILE|chatml. Only a model with no template at all gets ChatML, with a warning.
// Each render gets what transformers' apply_chat_template gives it: messages (every key of each
// message, ChatMessage), tools (the conversation's, or None), documents (None),
// add_generation_prompt, bos_token and eos_token, then the template variables (--template-kwargs,
// and a row's own chat_template_kwargs over them).
// Every render runs under a step and size budget (jinja::RenderLimits, settings
// data.template_max_steps / data.template_max_bytes): past it, INPUT_CHAT_TEMPLATE_BUDGET.
//
// Loss masks come from rendering, never from searching the text for marker strings. A template
// with {% generation %} blocks marks the trained text itself (as transformers'
// return_assistant_tokens_mask): the tokens inside those blocks are trained. Otherwise, for every
// assistant message k the template renders messages[:k] with the generation prompt (prompt A) and
// messages[:k+1] without it (B); the conversation's own tokens F are the full render. The tokens
// that message k adds are F[lcp(A,F) : lcp(B,F)], where lcp is the longest common token prefix
// (so the assistant header is not trained, while the content, its tool calls and reasoning as the
// template writes them, and the end-of-turn token are; tool results, role tool, are not). A
// trailing block the template appends to every render (e.g. the original Llama-3 template always
// ends with an assistant header) is found by rendering the empty conversation and is not counted.
// Where the renders do not nest (A or B is no prefix of the full render: Qwen3 drops the reasoning
// of earlier turns, Mistral writes the tools before the last user message, Hermes ends a tool result
// differently when it is last), message k is located by rendering the conversation once more with
// message k perturbed (its content, reasoning and tool-call arguments replaced, nothing else): its
// own text is where the two renders differ. The start is then where A's end lines up with the full
// render just before that text, the end that text plus what B writes after it (end of turn).
//
// Cost (issue 13): the full conversation is rendered once (linear in its size) and only the first
// keep_tokens tokens are tokenized (encode_prefix); prefix renders stop at the first assistant
// message that starts past what training keeps.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template_source.h"
#include "text/jinja_value.h"
#include "text/tokenizer.h"

namespace bp {

// One message as the chat template sees it (transformers' apply_chat_template passes each message's
// dict as it is): role, content, and the message's other keys in `extra` (tool_calls, tool_call_id,
// name, reasoning_content, thinking, ...). Rows are read into this form by text/dataset_formats.cpp
// (docs/architecture.md "Tool calls and reasoning").
struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant" | "tool" (or "ipython")
  std::string content;
  // The other keys of the message, in the row's order: an object, or null for none. A tool call's
  // arguments are already in the form data.tool_arguments asks for.
  nlohmann::ordered_json extra = nullptr;
  // content_kind Null: the template sees content None (OpenAI's form of an assistant message that only
  // calls tools); Absent: the message has no content key at all (content is "" then).
  enum class ContentKind : uint8_t { Text, Null, Absent };
  ContentKind content_kind = ContentKind::Text;

  bool has_tool_calls() const;
};

// The messages of one conversation plus what transformers passes beside them: `tools` (a JSON list of
// tool definitions, or null: the template sees None) and the row's own template variables (TRL's
// chat_template_kwargs column; an object or null), which win over ChatTemplate's.
struct Conversation : std::vector<ChatMessage> {
  using std::vector<ChatMessage>::vector;
  nlohmann::ordered_json tools = nullptr;
  nlohmann::ordered_json template_kwargs = nullptr;
  // The first n messages, with the same tools and variables (what a prefix render needs).
  Conversation head(size_t n) const;
};

// The ChatML template (Qwen/SmolLM style), used when a model has none or --chat-template chatml.
extern const char* const kChatMLTemplate;

class ChatTemplate {
 public:
  // bos/eos are the token strings the template sees as bos_token/eos_token. The template is
  // parsed and probe-rendered once. Errors: INPUT_CHAT_TEMPLATE_UNSUPPORTED (syntax or a construct
  // outside the subset, naming it, its line and the source), INPUT_CHAT_TEMPLATE_BUDGET.
  ChatTemplate(const ChatTemplateSource& source, std::string bos_token, std::string eos_token,
               const jinja::RenderLimits& limits = {});
  // Source text "" = the ChatML default; anything else is treated as the model's own template.
  ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token);
  // The tokenizer's template (read_model_chat_template), or `choice` (--chat-template FILE|chatml).
  static ChatTemplate from_tokenizer(const Tokenizer& tok, const std::string& choice = "",
                                     const jinja::RenderLimits& limits = {});

  // Throws bp::Error: INPUT_VALIDATION_FAILED when the template rejects the conversation
  // (raise_exception, e.g. roles that do not alternate: the row's fault); the template's own faults
  // are INPUT_CHAT_TEMPLATE_UNSUPPORTED (a construct reached only now, or an error inside it such as
  // an undefined value used as a dict, which Python's Jinja2 raises too) and INPUT_CHAT_TEMPLATE_BUDGET.
  std::string render(const Conversation& conv, bool add_generation_prompt) const;
  // render() plus the [begin, end) byte ranges of {% generation %} blocks.
  std::string render_spans(const Conversation& conv, std::vector<std::pair<size_t, size_t>>& spans) const;

  // Variables every render passes to the template after the special tokens, as apply_chat_template's
  // **kwargs (--template-kwargs '{"enable_thinking": false}'): a JSON object. A conversation's own
  // template_kwargs win over these. Keys the template already receives from us (messages, tools,
  // documents, add_generation_prompt) are refused: CONFIG_INVALID_SETTING.
  void set_template_kwargs(const nlohmann::ordered_json& kwargs);
  const nlohmann::ordered_json& template_kwargs() const { return kwargs_; }
  // strftime_now's clock in every render: epoch seconds (tests compare with Python at one instant),
  // or -1 for the real clock (the default).
  void fix_clock(int64_t now_epoch_s) { now_epoch_s_ = now_epoch_s; }

  bool uses_generation_blocks() const { return generation_blocks_; }
  // True when the model has no template and ChatML is used by default (warning() says so).
  bool is_fallback() const { return source_.kind == ChatTemplateSource::Kind::ChatMLDefault; }
  const std::string& warning() const { return warning_; }
  const ChatTemplateSource& source() const { return source_; }

 private:
  std::shared_ptr<const void> impl_;  // the parsed jinja::Template
  std::string bos_, eos_;
  ChatTemplateSource source_;
  jinja::RenderLimits limits_;
  bool generation_blocks_ = false;
  std::string warning_;
  nlohmann::ordered_json kwargs_ = nlohmann::ordered_json::object();
  int64_t now_epoch_s_ = -1;
};

// The keys transformers' apply_chat_template itself passes to every render; template variables
// (ChatTemplate::set_template_kwargs, a row's chat_template_kwargs) may not use them.
bool is_reserved_template_variable(std::string_view key);
// Throws CONFIG_INVALID_SETTING naming `what` (the setting) unless kwargs is a JSON object free of
// reserved names.
void check_template_variables(const nlohmann::ordered_json& kwargs, std::string_view what);

struct TokenizedConversation {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss_mask;  // 1 where the token is a training target
  bool cut = false;                // ids stop after keep_tokens (+ a few): the render was longer
};

// Tokenizes the rendered conversation (add_generation_prompt=false) and marks assistant tokens.
// train_on_all: every token counts (mask all ones). keep_tokens > 0: only the first keep_tokens
// tokens are needed (training truncates there), so work past them is skipped and `cut` is set.
TokenizedConversation tokenize_conversation(const ChatTemplate& tmpl, const Tokenizer& tok, const Conversation& conv,
                                            bool train_on_all = false, size_t keep_tokens = 0);

}  // namespace bp
