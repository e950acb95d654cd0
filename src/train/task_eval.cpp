// Exact-match task metric over held-out conversations (see task_eval.h).
#include "train/task_eval.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "model/generate.h"

namespace bp {

std::vector<TaskExample> task_examples_from_conversations(const std::vector<Conversation>& conversations) {
  std::vector<TaskExample> out;
  out.reserve(conversations.size());
  for (size_t i = 0; i < conversations.size(); ++i) {
    const Conversation& c = conversations[i];
    size_t last = c.size();
    for (size_t k = c.size(); k-- > 0;) {
      if (c[k].role == "assistant") {
        last = k;
        break;
      }
    }
    if (last == c.size())
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[task_eval] held-out conversation {} has no assistant message to compare with", i));
    if (last == 0)
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[task_eval] held-out conversation {} starts with the assistant: there is no prompt", i));
    TaskExample ex;
    ex.prompt = c.head(last);  // with the conversation's tools and template variables
    ex.reference = c[last].content;
    out.push_back(std::move(ex));
  }
  return out;
}

std::vector<TaskExample> load_task_examples(const std::string& path, DatasetFormat format, bool strict,
                                            const ChatDataOptions& chat) {
  DatasetLoadOptions lo;
  lo.format = format;
  chat.apply(lo);
  const LoadedDataset ds = load_dataset(path, lo);
  check_dataset(ds, strict);
  std::vector<Conversation> convs;
  convs.reserve(ds.rows.size());
  for (const DatasetRow& row : ds.rows) {
    if (row.is_text)
      throw Error(ErrorCode::INPUT_DATASET_INVALID,
                  fmt::format("[task_eval] {} line {}: a plain-text row has no answer to compare with; held-out "
                              "files for the task metric need conversations (ShareGPT, OpenAI or Alpaca rows)",
                              path, row.line));
    convs.push_back(row.conv);
  }
  return task_examples_from_conversations(convs);
}

std::string normalize_answer(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool pending_space = false;
  for (const char ch : s) {
    const bool space = ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
    if (space) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.push_back(ch >= 'A' && ch <= 'Z' ? static_cast<char>(ch - 'A' + 'a') : ch);
  }
  return out;
}

bool answers_match(std::string_view output, std::string_view reference) {
  return normalize_answer(output) == normalize_answer(reference);
}

namespace {

std::string last_user_message(const Conversation& conv) {
  for (size_t k = conv.size(); k-- > 0;)
    if (conv[k].role == "user") return conv[k].content;
  return conv.empty() ? std::string() : conv.back().content;
}

}  // namespace

TaskEvalResult evaluate_task(const Model& model, const Tokenizer& tok, const ChatTemplate& tmpl,
                             const std::vector<TaskExample>& examples, const TaskEvalOptions& opts) {
  if (opts.max_new_tokens <= 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[task_eval] max_new_tokens must be > 0, got {}", opts.max_new_tokens));
  GenerateOptions gen;
  gen.max_new_tokens = opts.max_new_tokens;
  gen.sampling.temperature = 0.0f;  // greedy: the metric must not depend on a seed
  gen.stop_ids = tok.eos_ids();
  if (gen.stop_ids.empty()) gen.stop_ids = model.config().eos_token_ids;

  const int64_t ctx = model.config().max_position_embeddings;
  size_t n = examples.size();
  if (opts.max_examples > 0) n = std::min(n, static_cast<size_t>(opts.max_examples));

  TaskEvalResult res;
  for (size_t i = 0; i < n; ++i) {
    const TaskExample& ex = examples[i];
    const std::vector<int32_t> prompt = tok.encode(tmpl.render(ex.prompt, /*add_generation_prompt=*/true), false);
    if (static_cast<int64_t>(prompt.size()) >= ctx)
      throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                  fmt::format("[task_eval] held-out example {} has {} prompt tokens; the model's context is {}", i,
                              prompt.size(), ctx));
    GenerateResult g = generate(model, prompt, gen);
    TaskAnswer a;
    a.new_tokens = static_cast<int64_t>(g.tokens.size());
    if (g.stopped && !g.tokens.empty()) g.tokens.pop_back();  // the eos token is not part of the answer
    a.output = tok.decode(g.tokens, /*skip_special=*/true);
    a.prompt = last_user_message(ex.prompt);
    a.reference = ex.reference;
    a.exact = answers_match(a.output, a.reference);
    res.num_exact += a.exact ? 1 : 0;
    res.answers.push_back(std::move(a));
  }
  res.num_examples = static_cast<int64_t>(res.answers.size());
  return res;
}

}  // namespace bp
