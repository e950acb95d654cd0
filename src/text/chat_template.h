// Chat templates and loss masks (issue 5, DESIGN.md "text & data").
//
// ChatTemplate renders a conversation with the model's own Jinja chat template
// (tokenizer_config.json "chat_template") through the Jinja-subset interpreter (jinja_*.h). A
// template the interpreter cannot handle (a statement, filter, test or method outside the subset)
// falls back to ChatML, and warning() names the construct; it is also logged once.
//
// Loss masks come from rendering, never from searching the text for marker strings:
// for every assistant message k the template renders messages[:k] with the generation prompt
// (prompt A) and messages[:k+1] without it (B); the conversation's own tokens F are the full
// render. The tokens that message k adds are F[lcp(A,F) : lcp(B,F)], where lcp is the longest
// common token prefix (so the assistant header is not trained, while the content and the
// end-of-turn token are). A trailing block the template appends to every render (e.g. the
// original Llama-3 template always ends with an assistant header) is found by rendering the empty
// conversation and is not counted.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace bp {

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant" (tool roles are passed through)
  std::string content;
};
using Conversation = std::vector<ChatMessage>;

// The ChatML template (Qwen/SmolLM style), used when a tokenizer has none or ours cannot run it.
extern const char* const kChatMLTemplate;

class ChatTemplate {
 public:
  // source "" means ChatML. bos/eos are the token strings the template sees as bos_token/eos_token.
  // The template is parsed and probe-rendered once; Syntax/Unsupported failures switch to ChatML.
  ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token);
  static ChatTemplate from_tokenizer(const Tokenizer& tok);

  // Throws bp::Error(INPUT_VALIDATION_FAILED) when the template rejects the conversation
  // (raise_exception, e.g. roles that do not alternate) or fails on it.
  std::string render(const Conversation& conv, bool add_generation_prompt) const;

  bool is_fallback() const { return fallback_; }
  const std::string& warning() const { return warning_; }  // "" unless fallback

 private:
  std::shared_ptr<const void> impl_;  // the parsed jinja::Template
  std::string bos_, eos_;
  bool fallback_ = false;
  std::string warning_;
};

struct TokenizedConversation {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss_mask;  // 1 where the token is a training target
};

// Tokenizes the rendered conversation (add_generation_prompt=false) and marks assistant tokens.
// train_on_all: every token counts (mask all ones).
TokenizedConversation tokenize_conversation(const ChatTemplate& tmpl, const Tokenizer& tok, const Conversation& conv,
                                            bool train_on_all = false);

}  // namespace bp
