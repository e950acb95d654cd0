// Preference data (issue 38, docs/preference.md "Datasets"): the pair and KTO row forms with their
// checks, which training methods a format fits (DataShape), unpairing for KTO, and tokenization of
// a preference row through the SFT chat-template path with the mask kept on the final turn.
#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "text/dataset_internal.h"

namespace bp {

namespace data {

namespace {

using json = nlohmann::ordered_json;

bool blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

// TRL's prompt: a string (one user message) or a message list.
std::optional<RowIssue> prompt_field(const json& obj, const DatasetRow& row, Conversation& out) {
  if (!obj.contains("prompt") || obj["prompt"].is_null())
    return issue(row, RowProblem::MissingField, "missing field 'prompt'");
  const json& v = obj["prompt"];
  if (v.is_array()) return parse_turns(v, row, {.what = "'prompt' "}, out);
  if (!v.is_string())
    return issue(row, RowProblem::WrongType,
                 fmt::format("'prompt' must be a string or a list of messages, found {}", v.type_name()));
  if (blank(v.get_ref<const std::string&>())) return issue(row, RowProblem::EmptyTurn, "'prompt' is empty");
  out.push_back({"user", v.get<std::string>()});
  return std::nullopt;
}

// A completion next to a prompt: a string (the assistant's reply) or a list of one assistant message.
std::optional<RowIssue> completion_field(const json& obj, const DatasetRow& row, const char* key, std::string& out) {
  if (!obj.contains(key) || obj[key].is_null())
    return issue(row, RowProblem::MissingField, fmt::format("missing field '{}'", key));
  const json& v = obj[key];
  if (v.is_string()) {
    if (blank(v.get_ref<const std::string&>()))
      return issue(row, RowProblem::EmptyCompletion, fmt::format("'{}' is empty", key));
    out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array())
    return issue(row, RowProblem::WrongType,
                 fmt::format("'{}' must be a string or a list of messages, found {}", key, v.type_name()));
  if (v.empty()) return issue(row, RowProblem::EmptyCompletion, fmt::format("'{}' has no message", key));
  Conversation c;
  if (auto bad = parse_turns(v, row, {.what = fmt::format("'{}' ", key), .completion_from = 0}, c)) return bad;
  if (c.size() != 1 || c[0].role != "assistant")
    return issue(row, RowProblem::WrongRoleOrder,
                 fmt::format("'{}' must be one assistant message next to 'prompt', found {} message{} (first: '{}')",
                             key, c.size(), c.size() == 1 ? "" : "s", c[0].role));
  out = std::move(c[0].content);
  return std::nullopt;
}

// TRL's implicit prompt: chosen and rejected are whole conversations that share all but their final
// (assistant) message.
std::optional<RowIssue> implicit_pair(const json& obj, DatasetRow& row, std::string& chosen, std::string& rejected) {
  Conversation conv[2];
  const char* keys[2] = {"chosen", "rejected"};
  for (int k = 0; k < 2; ++k) {
    if (!obj.contains(keys[k]) || obj[keys[k]].is_null())
      return issue(row, RowProblem::MissingField, fmt::format("missing field '{}'", keys[k]));
    const json& v = obj[keys[k]];
    if (!v.is_array())
      return issue(row, RowProblem::WrongType,
                   fmt::format("'{}' must be a list of messages (or a string next to 'prompt'), found {}", keys[k],
                               v.type_name()));
    if (v.empty()) return issue(row, RowProblem::EmptyCompletion, fmt::format("'{}' has no message", keys[k]));
    const TurnKeys tk{.what = fmt::format("'{}' ", keys[k]), .completion_from = v.size() - 1};
    if (auto bad = parse_turns(v, row, tk, conv[k])) return bad;
    if (conv[k].back().role != "assistant")
      return issue(row, RowProblem::WrongRoleOrder,
                   fmt::format("'{}' must end with an assistant message, found '{}'", keys[k], conv[k].back().role));
  }
  const Conversation& c = conv[0];
  const Conversation& r = conv[1];
  for (size_t k = 0; k + 1 < std::max(c.size(), r.size()); ++k)
    if (k + 1 >= c.size() || k + 1 >= r.size() || c[k].role != r[k].role || c[k].content != r[k].content)
      return issue(row, RowProblem::PromptMismatch,
                   fmt::format("'chosen' ({} messages) and 'rejected' ({} messages) differ at message {}: a pair "
                               "shares its prompt, all messages but the final one",
                               c.size(), r.size(), k + 1));
  row.conv.assign(c.begin(), c.end() - 1);
  chosen = c.back().content;
  rejected = r.back().content;
  return std::nullopt;
}

}  // namespace

std::optional<RowIssue> convert_pair_row(const json& obj, DatasetRow& row) {
  std::string chosen, rejected;
  if (obj.contains("prompt")) {
    if (auto bad = prompt_field(obj, row, row.conv)) return bad;
    if (auto bad = completion_field(obj, row, "chosen", chosen)) return bad;
    if (auto bad = completion_field(obj, row, "rejected", rejected)) return bad;
  } else if (auto bad = implicit_pair(obj, row, chosen, rejected)) {
    return bad;
  }
  if (chosen == rejected)
    return issue(
        row, RowProblem::IdenticalPair,
        fmt::format("'chosen' and 'rejected' are the same text ({} bytes): the pair prefers nothing", chosen.size()));
  row.rejected_conv = row.conv;
  row.conv.push_back({"assistant", std::move(chosen)});
  row.rejected_conv.push_back({"assistant", std::move(rejected)});
  return check_order(row, row.conv);
}

std::optional<RowIssue> convert_unpaired_row(const json& obj, DatasetRow& row) {
  std::string completion;
  if (auto bad = prompt_field(obj, row, row.conv)) return bad;
  if (auto bad = completion_field(obj, row, "completion", completion)) return bad;
  if (!obj.contains("label") || obj["label"].is_null())
    return issue(row, RowProblem::MissingField, "missing field 'label'");
  if (!obj["label"].is_boolean())
    return issue(row, RowProblem::WrongType,
                 fmt::format("'label' must be true (desirable) or false (undesirable), found {} {}",
                             obj["label"].type_name(), obj["label"].dump()));
  row.label = obj["label"].get<bool>() ? 1 : 0;
  row.conv.push_back({"assistant", std::move(completion)});
  return check_order(row, row.conv);
}

std::optional<RowIssue> tokenize_preference_row(const DatasetRow& row, const Tokenizer& tok, const ChatTemplate& tmpl,
                                                int64_t max_seq_length, Sample& s, TokenizedDataset& counts) {
  const auto keep = static_cast<size_t>(max_seq_length);
  TokenizedPreference seq[2];
  const int n = row.is_pair() ? 2 : 1;
  for (int k = 0; k < n; ++k) seq[k] = tokenize_preference_conv(tmpl, tok, k ? row.rejected_conv : row.conv, keep);
  // Both are prefixes of the same prompt render up to their prompt_len, so the shorter is shared.
  if (n == 2) seq[0].prompt_len = seq[1].prompt_len = std::min(seq[0].prompt_len, seq[1].prompt_len);
  bool truncated = false;
  int64_t dropped = 0, uncounted = 0;  // counted only for a row that is kept
  for (int k = 0; k < n; ++k) {
    TokenizedConversation& t = seq[k].seq;
    const bool cut_here = t.ids.size() > keep;
    if (cut_here) {
      truncated = true;
      if (t.cut)
        ++uncounted;
      else
        dropped += static_cast<int64_t>(t.ids.size() - keep);
      t.ids.resize(keep);
      t.loss_mask.resize(keep);
    }
    // A target at position 0 has no context to predict it from, so at least one later one is needed.
    if (std::count(t.loss_mask.begin() + (t.loss_mask.empty() ? 0 : 1), t.loss_mask.end(), 1) == 0) {
      const char* which = n == 1 ? "completion" : k ? "rejected completion" : "chosen completion";
      if (cut_here)
        return issue(row, RowProblem::TooLong,
                     fmt::format("no token of the {} fits in max_seq_length {}: the prompt takes {}{} tokens", which,
                                 max_seq_length, seq[k].prompt_len >= keep ? "at least " : "",
                                 std::min(seq[k].prompt_len, keep)));
      return issue(row, RowProblem::RejectedByTemplate,
                   fmt::format("the chat template marks no token of the {} as trained", which));
    }
  }
  counts.truncated += truncated ? 1 : 0;
  counts.tokens_dropped += dropped;
  counts.truncated_uncounted += uncounted;
  s.ids = std::move(seq[0].seq.ids);
  s.loss_mask = std::move(seq[0].seq.loss_mask);
  s.prompt_len = static_cast<int64_t>(seq[0].prompt_len);
  if (n == 2) {
    s.rejected_ids = std::move(seq[1].seq.ids);
    s.rejected_loss_mask = std::move(seq[1].seq.loss_mask);
    s.rejected_prompt_len = static_cast<int64_t>(seq[1].prompt_len);
  }
  s.label = row.label;
  return std::nullopt;
}

}  // namespace data

TokenizedPreference tokenize_preference_conv(const ChatTemplate& tmpl, const Tokenizer& tok, const Conversation& conv,
                                             size_t keep) {
  BP_CHECK(conv.size() >= 2 && conv.back().role == "assistant",
           "[dataset] a preference conversation ends with its assistant completion ({} messages)", conv.size());
  const Conversation prompt = conv.head(conv.size() - 1);
  const std::string asked = tmpl.render(prompt, true);
  // The prompt must render the same whether the completion follows or the model is asked to write
  // one: compared as text, so a token merging across the boundary does not matter.
  if (tmpl.render(conv, false).compare(0, asked.size(), asked) != 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                "[dataset] the chat template renders the prompt differently once the completion follows (the "
                "render with the generation prompt is no prefix of the whole conversation's), so the prompt's "
                "tokens are not the same in both sequences of a pair");
  TokenizedPreference out;
  out.seq = tokenize_conversation(tmpl, tok, conv, false, keep);
  bool cut = false;
  const std::vector<int32_t> head = encode_prefix(tok, asked, false, keep, &cut);
  while (out.prompt_len < head.size() && out.prompt_len < out.seq.ids.size() &&
         head[out.prompt_len] == out.seq.ids[out.prompt_len])
    ++out.prompt_len;
  // Earlier assistant turns belong to the prompt: only the final turn is trained.
  std::fill(out.seq.loss_mask.begin(), out.seq.loss_mask.begin() + static_cast<std::ptrdiff_t>(out.prompt_len), 0);
  return out;
}

DataShape dataset_format_shape(DatasetFormat f) {
  if (f == DatasetFormat::Preference) return DataShape::Pair;
  if (f == DatasetFormat::Unpaired) return DataShape::Labelled;
  return DataShape::Single;
}

const char* data_shape_name(DataShape s) {
  switch (s) {
    case DataShape::Single: return "single";
    case DataShape::Pair: return "pair";
    case DataShape::Labelled: return "labelled";
  }
  return "?";
}

std::string data_shape_problem(DatasetFormat f, DataShape want) {
  const DataShape have = dataset_format_shape(f);
  if (f == DatasetFormat::Auto) return "";  // no row parsed: check_dataset says what is wrong
  if (have == want || (have == DataShape::Pair && want == DataShape::Labelled)) return "";
  const std::string what =
      have == DataShape::Pair       ? fmt::format("{} data (chosen/rejected pairs)", dataset_format_name(f))
      : have == DataShape::Labelled ? fmt::format("{} data (completions labelled true/false)", dataset_format_name(f))
                                    : fmt::format("{} data (one conversation per row)", dataset_format_name(f));
  switch (want) {
    case DataShape::Single:
      return fmt::format("the file is {}, but training.method sft trains on single conversations: use --method {}",
                         what, have == DataShape::Pair ? "dpo, orpo, simpo or kto" : "kto");
    case DataShape::Pair:
      return fmt::format(
          "the file is {}, but the method trains on pairs: give rows {{\"prompt\", \"chosen\", "
          "\"rejected\"}} (or chosen/rejected conversations), or use --method {}",
          what, have == DataShape::Labelled ? "kto" : "sft");
    case DataShape::Labelled:
      return fmt::format(
          "the file is {}, but kto trains on labelled completions: give rows {{\"prompt\", "
          "\"completion\", \"label\"}} or preference pairs, or use --method sft",
          what);
  }
  return "";
}

void check_data_shape(DatasetFormat f, DataShape want, const std::string& path) {
  const std::string problem = data_shape_problem(f, want);
  if (!problem.empty())
    throw Error(ErrorCode::INPUT_DATASET_WRONG_SHAPE, fmt::format("[dataset] {}: {}", path, problem),
                {{"path", path}, {"format", dataset_format_name(f)}, {"shape", data_shape_name(want)}});
}

void unpair_preference(LoadedDataset& ds) {
  if (ds.format != DatasetFormat::Preference) return;
  std::vector<DatasetRow> rows;
  rows.reserve(ds.rows.size() * 2);
  for (DatasetRow& r : ds.rows) {
    DatasetRow rejected;
    rejected.line = r.line;
    rejected.index = r.index;
    rejected.conv = std::move(r.rejected_conv);
    rejected.label = 0;
    r.rejected_conv.clear();
    r.label = 1;
    rows.push_back(std::move(r));
    rows.push_back(std::move(rejected));
  }
  ds.rows = std::move(rows);
  ds.format = DatasetFormat::Unpaired;
}

}  // namespace bp
