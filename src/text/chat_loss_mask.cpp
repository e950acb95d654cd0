// tokenize_conversation: a conversation's tokens and its assistant-only loss mask, from
// {% generation %} spans or from rendered prefixes (see chat_template.h), doing no work past the
// tokens training keeps.
#include <algorithm>

#include "core/error.h"
#include "text/chat_template.h"

namespace bp {

namespace {

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

size_t common_suffix(const std::vector<int32_t>& a, const std::vector<int32_t>& b, size_t limit) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && n < limit && a[a.size() - 1 - n] == b[b.size() - 1 - n]) ++n;
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
  auto encode = [&](const Conversation& c, bool gen) {
    return encode_prefix(tok, tmpl.render(c, gen), false, keep, &cut);
  };
  // What the template appends to every render (see header); empty when it fails on no messages.
  std::vector<int32_t> tail;
  try {
    tail = encode({}, false);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::INPUT_CHAT_TEMPLATE_BUDGET) throw;
  }
  for (size_t k = 0; k < conv.size(); ++k) {
    if (conv[k].role != "assistant") continue;
    const auto at = [&](size_t n) { return conv.begin() + static_cast<std::ptrdiff_t>(n); };
    const Conversation before(conv.begin(), at(k));
    const size_t start = common_prefix(encode(before, true), out.ids);
    if (keep > 0 && start >= keep) break;  // this and later messages lie past what training keeps
    const Conversation upto(conv.begin(), at(k + 1));
    std::vector<int32_t> with = encode(upto, false);
    const bool with_cut = cut;
    // The always-appended tail at the end of a partial render is no part of message k.
    const auto strip_tail = [&](std::vector<int32_t>& ids) {
      if (!tail.empty() && ids.size() >= tail.size() &&
          std::equal(tail.begin(), tail.end(), ids.end() - static_cast<std::ptrdiff_t>(tail.size())))
        ids.resize(ids.size() - tail.size());
    };
    if (!with_cut) strip_tail(with);
    size_t end = common_prefix(with, out.ids);
    if (end < with.size() && end < out.ids.size()) {
      // The template renders message k differently once later messages follow (Qwen3 drops the
      // reasoning of earlier turns), so the partial render is no prefix of the full one. Then the
      // content is located by rendering the full conversation with message k emptied, and the
      // end-of-turn tokens are those `with` has after its content. (Whole renders: this path is
      // linear per assistant message, not per conversation.)
      const std::vector<int32_t> ids_full = out.cut ? tok.encode(full, false) : out.ids;
      Conversation emptied = conv;
      emptied[k].content.clear();
      const std::vector<int32_t> full_empty = tok.encode(tmpl.render(emptied, false), false);
      const size_t content_end = ids_full.size() - common_suffix(ids_full, full_empty, ids_full.size() - start);
      Conversation upto_empty = upto;
      upto_empty.back().content.clear();
      std::vector<int32_t> with_whole = with;
      if (with_cut) {
        with_whole = tok.encode(tmpl.render(upto, false), false);
        strip_tail(with_whole);
      }
      const size_t eot =
          common_suffix(with_whole, tok.encode(tmpl.render(upto_empty, false), false), with_whole.size());
      end = std::min(out.ids.size(), content_end + eot);
    }
    for (size_t t = start; t < end && t < out.ids.size(); ++t) out.loss_mask[t] = 1;
  }
  return out;
}

}  // namespace bp
