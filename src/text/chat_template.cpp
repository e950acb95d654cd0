// Chat-template rendering with ChatML fallback, and loss masks from rendered prefixes.
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

jinja::Value make_context(const Conversation& conv, bool add_generation_prompt, const std::string& bos,
                          const std::string& eos) {
  jinja::Array msgs;
  for (const auto& m : conv)
    msgs.push_back(
        jinja::Value::object({{"role", jinja::Value::string(m.role)}, {"content", jinja::Value::string(m.content)}}));
  return jinja::Value::object({{"messages", jinja::Value::array(std::move(msgs))},
                               {"add_generation_prompt", jinja::Value::boolean(add_generation_prompt)},
                               {"bos_token", jinja::Value::string(bos)},
                               {"eos_token", jinja::Value::string(eos)}});
}

const jinja::Template& tmpl_of(const std::shared_ptr<const void>& p) {
  return *static_cast<const jinja::Template*>(p.get());
}

// Renders sample conversations so constructs that only fail at run time (an unknown filter in a
// branch taken for ordinary chats) are found up front. raise_exception is fine (the template
// rejects our probe, e.g. a system message), anything Unsupported/Syntax is not.
void probe(const jinja::Template& t, const std::string& bos, const std::string& eos) {
  const Conversation convs[] = {
      {{"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}, {"assistant", "B"}},
      {{"user", "U"}, {"assistant", "A"}},
  };
  for (const auto& c : convs)
    for (bool gen : {false, true}) {
      try {
        t.render(make_context(c, gen, bos, eos), 0);
      } catch (const jinja::JinjaError& e) {
        if (e.kind() == jinja::JinjaError::Kind::Unsupported || e.kind() == jinja::JinjaError::Kind::Syntax) throw;
      }
    }
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token)
    : bos_(std::move(bos_token)), eos_(std::move(eos_token)) {
  if (!source.empty()) {
    try {
      auto t = std::make_shared<jinja::Template>(source);
      probe(*t, bos_, eos_);
      impl_ = t;
      return;
    } catch (const jinja::JinjaError& e) {
      fallback_ = true;
      warning_ = fmt::format("[chat_template] the model's chat template cannot be rendered ({}); using ChatML instead",
                             e.what());
      spdlog::warn("{}", warning_);
    }
  }
  impl_ = std::make_shared<jinja::Template>(kChatMLTemplate);
}

ChatTemplate ChatTemplate::from_tokenizer(const Tokenizer& tok) {
  std::string bos = tok.bos_id() >= 0 ? tok.id_to_token(tok.bos_id()) : "";
  std::string eos = tok.eos_ids().empty() ? "" : tok.id_to_token(tok.eos_ids().front());
  return ChatTemplate(tok.chat_template(), bos, eos);
}

std::string ChatTemplate::render(const Conversation& conv, bool add_generation_prompt) const {
  try {
    return tmpl_of(impl_).render(make_context(conv, add_generation_prompt, bos_, eos_));
  } catch (const jinja::JinjaError& e) {
    const char* what = e.kind() == jinja::JinjaError::Kind::Raised ? "the chat template rejected the conversation"
                                                                   : "the chat template failed on the conversation";
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[chat_template] {}: {}", what, e.what()));
  }
}

static size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

static size_t common_suffix(const std::vector<int32_t>& a, const std::vector<int32_t>& b, size_t limit) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && n < limit && a[a.size() - 1 - n] == b[b.size() - 1 - n]) ++n;
  return n;
}

TokenizedConversation tokenize_conversation(const ChatTemplate& tmpl, const Tokenizer& tok, const Conversation& conv,
                                            bool train_on_all) {
  TokenizedConversation out;
  out.ids = tok.encode(tmpl.render(conv, false), false);
  out.loss_mask.assign(out.ids.size(), train_on_all ? 1 : 0);
  if (train_on_all) return out;
  auto encode = [&](const Conversation& c, bool gen) { return tok.encode(tmpl.render(c, gen), false); };
  // What the template appends to every render (see header); empty when it fails on no messages.
  std::vector<int32_t> tail;
  try {
    tail = encode({}, false);
  } catch (const Error&) {
  }
  for (size_t k = 0; k < conv.size(); ++k) {
    if (conv[k].role != "assistant") continue;
    const auto at = [&](size_t n) { return conv.begin() + static_cast<std::ptrdiff_t>(n); };
    const Conversation before(conv.begin(), at(k));
    const Conversation upto(conv.begin(), at(k + 1));
    const size_t start = common_prefix(encode(before, true), out.ids);
    std::vector<int32_t> with = encode(upto, false);
    // The always-appended tail at the end of this partial render is no part of message k.
    if (!tail.empty() && with.size() >= tail.size() &&
        std::equal(tail.begin(), tail.end(), with.end() - static_cast<std::ptrdiff_t>(tail.size())))
      with.resize(with.size() - tail.size());
    size_t end = common_prefix(with, out.ids);
    if (end < with.size()) {
      // The template renders message k differently once later messages follow (Qwen3 drops the
      // reasoning of earlier turns), so the partial render is no prefix of the full one. Then the
      // content is located by rendering the full conversation with message k emptied, and the
      // end-of-turn tokens are those `with` has after its content.
      Conversation emptied = conv;
      emptied[k].content.clear();
      const std::vector<int32_t> full_empty = encode(emptied, false);
      const size_t content_end = out.ids.size() - common_suffix(out.ids, full_empty, out.ids.size() - start);
      Conversation upto_empty = upto;
      upto_empty.back().content.clear();
      const size_t eot = common_suffix(with, encode(upto_empty, false), with.size());
      end = std::min(out.ids.size(), content_end + eot);
    }
    for (size_t t = start; t < end; ++t) out.loss_mask[t] = 1;
  }
  return out;
}

}  // namespace bp
