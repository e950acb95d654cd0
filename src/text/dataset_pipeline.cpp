// prepare_training_data: dataset file -> tokenized samples, splits and cursors (see header).
#include "text/dataset_pipeline.h"

#include <fmt/format.h>

#include <unordered_map>

#include "core/error.h"

namespace bp {

DataCursor TrainingData::make_cursor(CursorState state) const {
  return DataCursor(static_cast<int64_t>(train.size()), seed, shuffle, state);
}

std::vector<const Sample*> TrainingData::next_train_samples(DataCursor& cursor, int64_t n) const {
  BP_CHECK(cursor.num_samples() == static_cast<int64_t>(train.size()),
           "[dataset] cursor over {} samples used with a training split of {}", cursor.num_samples(), train.size());
  std::vector<const Sample*> out;
  for (int64_t k : cursor.next(n))
    out.push_back(&tokenized.samples[static_cast<size_t>(train[static_cast<size_t>(k)])]);
  return out;
}

std::vector<const Sample*> TrainingData::eval_samples() const {
  std::vector<const Sample*> out;
  for (int64_t id : eval) out.push_back(&tokenized.samples[static_cast<size_t>(id)]);
  for (const Sample& s : eval_file.samples) out.push_back(&s);
  return out;
}

ChatTemplate data_chat_template(const DataSettings& s, const Tokenizer& tok) {
  ChatTemplate tmpl = ChatTemplate::from_tokenizer(tok, s.chat_template, s.template_limits);
  s.chat.apply(tmpl);
  return tmpl;
}

DatasetLoadOptions data_load_options(const DataSettings& s) {
  DatasetLoadOptions lo;
  lo.format = s.format;
  s.chat.apply(lo);
  return lo;
}

namespace {
// The conversations of the samples `ids` of td (all of them when ids is null), found by their rows' lines.
std::vector<Conversation> sample_conversations(const LoadedDataset& ds, const TokenizedDataset& td,
                                               const std::vector<int64_t>* ids) {
  std::unordered_map<int64_t, const DatasetRow*> by_line;
  for (const DatasetRow& r : ds.rows) by_line.emplace(r.line, &r);
  std::vector<Conversation> out;
  auto add = [&](const Sample& s) {
    const auto it = by_line.find(s.source_line);
    out.push_back(it != by_line.end() ? it->second->conv : Conversation{});
  };
  if (ids) {
    for (int64_t id : *ids) add(td.samples[static_cast<size_t>(id)]);
  } else {
    for (const Sample& s : td.samples) add(s);
  }
  return out;
}
}  // namespace

TrainingData prepare_training_data(const DataSettings& s, const Tokenizer& tok) {
  if (!(s.holdout >= 0.0 && s.holdout < 1.0))
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[dataset] --holdout must be in [0, 1), got {}", s.holdout));
  TrainingData data;
  const ChatTemplate tmpl = data_chat_template(s, tok);
  data.chat_template = tmpl.source();
  data.template_is_fallback = tmpl.is_fallback();
  data.template_warning = tmpl.warning();
  const DatasetLoadOptions lo = data_load_options(s);
  LoadedDataset ds = load_dataset(s.path, lo);
  data.format = ds.format;
  data.rows_total = ds.total_rows;
  data.seed = s.seed;
  data.shuffle = s.shuffle;
  check_data_shape(ds.format, s.shape, s.path);  // first: a file for another method is no bad rows
  data.rows_bad = check_dataset(ds, s.strict);
  if (s.shape == DataShape::Labelled) unpair_preference(ds);
  const TokenizeOptions to{.max_seq_length = s.max_seq_length, .train_on_all = s.train_on_all};
  data.tokenized = tokenize_dataset(ds, tok, tmpl, to);
  const auto dropped = static_cast<int64_t>(data.tokenized.issues.size());
  if (dropped > 0 && s.strict) {
    const RowIssue& first = data.tokenized.issues.front();
    throw Error(ErrorCode::INPUT_DATASET_INVALID,
                fmt::format("[dataset] --strict: {} rows of {} cannot be trained on (first: line {}: {})", dropped,
                            s.path, first.line, first.message));
  }
  data.rows_skipped = data.rows_bad + dropped;
  const auto n = static_cast<int64_t>(data.tokenized.samples.size());
  if (n == 0)
    throw Error(ErrorCode::INPUT_DATASET_INVALID,
                fmt::format("[dataset] no sample of {} is left for training ({} rows, {} skipped)", s.path,
                            ds.total_rows, data.rows_skipped));
  if (!s.eval_path.empty()) {  // a separate held-out file: all of `path` trains
    LoadedDataset eds = load_dataset(s.eval_path, lo);
    check_data_shape(eds.format, s.shape, s.eval_path);
    data.eval_rows_bad = check_dataset(eds, s.strict);
    if (s.shape == DataShape::Labelled) unpair_preference(eds);
    data.eval_file = tokenize_dataset(eds, tok, tmpl, to);
    if (s.keep_eval_conversations) data.eval_conversations = sample_conversations(eds, data.eval_file, nullptr);
    for (int64_t i = 0; i < n; ++i) data.train.push_back(i);
    return data;
  }
  HoldoutSplit split = split_holdout(n, n >= 2 ? s.holdout : 0.0, s.seed);
  data.train = std::move(split.train);
  data.eval = std::move(split.eval);
  if (s.keep_eval_conversations) data.eval_conversations = sample_conversations(ds, data.tokenized, &data.eval);
  return data;
}

}  // namespace bp
