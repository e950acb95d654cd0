// tokenize_conversation: a conversation's tokens and its assistant-only loss mask, from
// {% generation %} spans or from rendered prefixes (see chat_template.h), doing no work past the
// tokens training keeps. An assistant turn's tool calls and reasoning are part of its text; tool
// results (role tool) are not trained.
#include <algorithm>
#include <optional>
#include <string_view>

#include "core/error.h"
#include "text/chat_template.h"

namespace bp {

namespace {

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// Mask from {% generation %} spans: tokens of F[: span.begin] that F shares are context, those up to
// F[: span.end] are trained.
void mask_generation_spans(const std::string& text, const std::vector<std::pair<size_t, size_t>>& spans,
                           const Tokenizer& tok, size_t keep, TokenizedConversation& out) {
  bool cut = false;
  for (const auto& [b, e] : spans) {
    const size_t start =
        common_prefix(encode_prefix(tok, std::string_view(text).substr(0, b), false, keep, &cut), out.ids);
    if (keep > 0 && start >= keep) break;
    const size_t end =
        common_prefix(encode_prefix(tok, std::string_view(text).substr(0, e), false, keep, &cut), out.ids);
    for (size_t t = start; t < end; ++t) out.loss_mask[t] = 1;
  }
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

size_t common_prefix_text(std::string_view a, std::string_view b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

size_t common_suffix_text(std::string_view a, std::string_view b, size_t limit) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && n < limit && a[a.size() - 1 - n] == b[b.size() - 1 - n]) ++n;
  return n;
}

// The position q in [lo, hi] of `text` where text[:q] ends with the longest suffix of `prompt`
// (the latest q among equals; hi when none matches at all). Matches are compared up to 4096
// characters, so the search stays linear in hi - lo.
size_t align_end(std::string_view text, size_t lo, size_t hi, std::string_view prompt) {
  size_t best = hi, best_len = 0;
  for (size_t q = lo; q <= hi && q <= text.size(); ++q) {
    const size_t len = common_suffix_text(text.substr(0, q), prompt, 4096);
    if (len > 0 && len >= best_len) {
      best = q;
      best_len = len;
    }
  }
  return best;
}

// A text of the same length as s whose first and last characters differ from s's (ASCII letters:
// not whitespace a template would trim, no markup it would split on).
std::string unlike(const std::string& s) {
  if (s.empty()) return s;
  char c = 'x';
  for (char cand : {'x', 'y', 'z'})
    if (cand != s.front() && cand != s.back()) {
      c = cand;
      break;
    }
  return std::string(s.size(), c);
}

// Message m with every text the data gives it changed (content, reasoning, each tool call's
// arguments) and everything else kept: role, names, ids, which keys exist and which are empty.
ChatMessage perturbed(const ChatMessage& m) {
  ChatMessage p = m;
  if (p.content_kind == ChatMessage::ContentKind::Text) p.content = unlike(p.content);
  if (!p.extra.is_object()) return p;
  for (const char* key : {"reasoning_content", "thinking"})
    if (auto it = p.extra.find(key); it != p.extra.end() && it->is_string()) *it = unlike(it->get<std::string>());
  if (auto it = p.extra.find("tool_calls"); it != p.extra.end() && it->is_array())
    for (auto& call : *it) {
      if (!call.is_object()) continue;
      auto& fn = call.contains("function") && call["function"].is_object() ? call["function"] : call;
      if (!fn.contains("arguments")) continue;
      auto& a = fn["arguments"];
      if (a.is_string())
        a = a.get<std::string>() == "{\"~\": \"~\"}" ? "{\"~\": \"~~\"}" : "{\"~\": \"~\"}";
      else
        a = nlohmann::ordered_json{{"~", a.contains("~") && a["~"] == "~" ? "~~" : "~"}};
    }
  return p;
}

}  // namespace

TokenizedConversation tokenize_conversation(const ChatTemplate& tmpl, const Tokenizer& tok, const Conversation& conv,
                                            bool train_on_all, size_t keep) {
  TokenizedConversation out;
  std::vector<std::pair<size_t, size_t>> spans;
  const std::string full = tmpl.uses_generation_blocks() ? tmpl.render_spans(conv, spans) : tmpl.render(conv, false);
  out.ids = encode_prefix(tok, full, false, keep, &out.cut);
  out.loss_mask.assign(out.ids.size(), train_on_all ? 1 : 0);
  if (train_on_all) return out;
  if (tmpl.uses_generation_blocks()) {
    mask_generation_spans(full, spans, tok, keep, out);
    return out;
  }
  bool cut = false;
  // Tokens of full[: chars] that the full conversation's tokens share.
  const auto tokens_before = [&](size_t chars) {
    return common_prefix(encode_prefix(tok, std::string_view(full).substr(0, chars), false, keep, &cut), out.ids);
  };
  // What the template appends to every render (see header); empty when it fails on no messages.
  std::string tail;
  try {
    tail = tmpl.render(Conversation{}, false);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::INPUT_CHAT_TEMPLATE_BUDGET) throw;
  }
  // The always-appended tail at the end of a partial render is no part of its last message.
  const auto strip_tail = [&](std::string text) {
    if (!tail.empty() && text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0)
      text.resize(text.size() - tail.size());
    return text;
  };
  // A render that the template may refuse (a perturbed message, below): nullopt then.
  const auto try_render = [&](const Conversation& c) -> std::optional<std::string> {
    try {
      return strip_tail(tmpl.render(c, false));
    } catch (const Error& e) {
      if (e.code() == ErrorCode::INPUT_CHAT_TEMPLATE_BUDGET) throw;
      return std::nullopt;
    }
  };
  size_t prev_end = 0;  // where (in characters of full) the previous assistant message's trained text ends
  for (size_t k = 0; k < conv.size(); ++k) {
    if (conv[k].role != "assistant") continue;
    const Conversation before = conv.head(k);
    const std::string prompt = tmpl.render(before, true);  // A: messages[:k] + generation prompt
    size_t start = common_prefix(encode_prefix(tok, prompt, false, keep, &cut), out.ids);
    if (keep > 0 && start >= keep) break;  // this and later messages lie past what training keeps
    const Conversation upto = conv.head(k + 1);
    const std::string with = strip_tail(tmpl.render(upto, false));  // B: messages[:k+1]
    size_t end = common_prefix(encode_prefix(tok, with, false, keep, &cut), out.ids);
    size_t end_chars = with.size();
    // Renders nest when A (or, where the generation prompt differs from what the full render has,
    // messages[:k] alone) is a prefix of the full render, and B is.
    const bool start_nests = starts_with(full, prompt) || starts_with(full, strip_tail(tmpl.render(before, false)));
    const bool end_nests = starts_with(full, with);
    if (!start_nests || !end_nests) {
      // The template renders earlier messages differently once later ones follow (Mistral puts
      // the tools before the last user message, Hermes ends a tool result differently when it is
      // the last message, Qwen3 drops the reasoning of earlier turns). Message k is then located
      // in the full render by rendering it once more with message k perturbed (every text the
      // data gives it changed, nothing else): the renders differ exactly in its own text.
      Conversation alt = conv;
      alt[k] = perturbed(conv[k]);
      const std::optional<std::string> full_alt = try_render(alt);
      const size_t p = full_alt ? common_prefix_text(full, *full_alt) : full.size();
      if (p < full.size()) {
        const size_t own_end =
            full.size() - common_suffix_text(full, *full_alt, std::min(full.size(), full_alt->size()) - p);
        if (!start_nests) {
          // Its start: where the end of prompt A (the messages before it, the generation prompt)
          // lines up best with the full render, at or before its first own character.
          start = tokens_before(align_end(full, std::min(prev_end, p), p, prompt));
          if (keep > 0 && start >= keep) break;
        }
        if (!end_nests) {
          // Its end: its own text, then what the template writes after it (end of turn), read off
          // B against B with message k perturbed.
          Conversation upto_alt = upto;
          upto_alt.back() = alt[k];
          const std::optional<std::string> with_alt = try_render(upto_alt);
          size_t after = 0;
          if (with_alt) {
            const size_t same = common_prefix_text(with, *with_alt);
            after = common_suffix_text(with, *with_alt, std::min(with.size(), with_alt->size()) - same);
          }
          end_chars = own_end + common_prefix_text(std::string_view(full).substr(own_end),
                                                   std::string_view(with).substr(with.size() - after));
          end = tokens_before(end_chars);
        }
      }
    }
    prev_end = std::max(prev_end, end_chars);
    for (size_t t = start; t < end && t < out.ids.size(); ++t) out.loss_mask[t] = 1;
  }
  return out;
}

}  // namespace bp
