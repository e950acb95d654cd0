// Chat templates and loss masks (issues 5 and 15, DESIGN.md "text & data").
//
// ChatTemplate renders a conversation with the model's own Jinja chat template through the
// Jinja-subset interpreter (jinja_*.h). Where the template comes from is chat_template_source.h
// (chat_template.jinja, tokenizer_config.json, --chat-template, or the ChatML default). A template
// the interpreter cannot run is never silently replaced: the constructor throws
// INPUT_CHAT_TEMPLATE_UNSUPPORTED naming the construct and line, and the user chooses with
// --chat-template FILE|chatml. Only a model with no template at all gets ChatML, with a warning.
// Every render runs under a step and size budget (jinja::RenderLimits, settings
// data.template_max_steps / data.template_max_bytes): past it, INPUT_CHAT_TEMPLATE_BUDGET.
//
// Loss masks come from rendering, never from searching the text for marker strings. A template
// with {% generation %} blocks marks the trained text itself (as transformers'
// return_assistant_tokens_mask): the tokens inside those blocks are trained. Otherwise, for every
// assistant message k the template renders messages[:k] with the generation prompt (prompt A) and
// messages[:k+1] without it (B); the conversation's own tokens F are the full render. The tokens
// that message k adds are F[lcp(A,F) : lcp(B,F)], where lcp is the longest common token prefix
// (so the assistant header is not trained, while the content and the end-of-turn token are). A
// trailing block the template appends to every render (e.g. the original Llama-3 template always
// ends with an assistant header) is found by rendering the empty conversation and is not counted.
//
// Cost (issue 13): the full conversation is rendered once (linear in its size) and only the first
// keep_tokens tokens are tokenized (encode_prefix); prefix renders stop at the first assistant
// message that starts past what training keeps.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/chat_template_source.h"
#include "text/jinja_value.h"
#include "text/tokenizer.h"

namespace bp {

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant" (tool roles are passed through)
  std::string content;
};
using Conversation = std::vector<ChatMessage>;

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
};

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
