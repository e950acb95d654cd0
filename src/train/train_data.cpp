// The trainer's view of the data (train_data.h): text/dataset_pipeline does the work; this file
// maps TrainOptions to its settings, words its warnings, and turns packed batches into tensors.
#include "train/train_data.h"

#include "text/chat_template.h"
#include "text/data_cursor.h"
#include "text/dataset_pipeline.h"
#include "text/tokenizer.h"
#include "train/preference.h"
#include "train/train_options.h"

namespace bp {

DataShape method_data_shape(TrainMethod m) {
  if (method_is_pairwise(m)) return DataShape::Pair;
  return m == TrainMethod::Kto ? DataShape::Labelled : DataShape::Single;
}

TrainData build_train_data(const TrainOptions& o, const Tokenizer& tok) {
  DataSettings ds;
  ds.path = o.data_path;
  ds.format = parse_dataset_format(o.data_format);
  ds.strict = o.strict;
  ds.max_seq_length = o.max_seq_length;
  ds.train_on_all = o.train_on_all;
  ds.holdout = o.holdout;
  ds.seed = o.seed;
  ds.shuffle = o.shuffle;
  ds.chat_template = o.chat_template;
  ds.chat.columns = parse_column_map(o.data_columns);
  ds.chat.tools_path = o.tools_path;
  ds.chat.template_kwargs = parse_template_kwargs(o.template_kwargs);
  ds.chat.reasoning = parse_reasoning_mode(o.reasoning);
  ds.chat.tool_arguments = parse_tool_arguments(o.tool_arguments);
  ds.template_limits = {.max_steps = o.template_max_steps, .max_bytes = o.template_max_bytes};
  ds.eval_path = o.eval_data_path;
  ds.shape = method_data_shape(o.method);
  ds.keep_eval_conversations = !o.eval_metrics.empty();
  TrainingData data = prepare_training_data(ds, tok);

  TrainData d;
  d.chat_template = data.chat_template;
  if (data.template_is_fallback && !data.template_warning.empty()) d.warnings.push_back(data.template_warning);
  d.rows_total = data.rows_total;
  d.rows_skipped = data.rows_bad;  // --max-errors counts the bad rows; untrainable ones are reported below
  d.format = dataset_format_name(data.format);
  if (d.rows_skipped > 0)
    d.warnings.push_back(fmt::format("skipped {} of {} rows of {} (run `backprop validate {}` to see them)",
                                     d.rows_skipped, d.rows_total, o.data_path, o.data_path));
  const TokenizedDataset& td = data.tokenized;
  d.samples_truncated = td.truncated;
  if (td.truncated > 0)
    d.warnings.push_back(fmt::format(
        "{} samples were longer than --max-seq-length {} and were cut ({}{} tokens dropped)", td.truncated,
        o.max_seq_length, td.truncated_uncounted > 0 ? "at least " : "", td.tokens_dropped + td.truncated_uncounted));
  if (!td.issues.empty())
    d.warnings.push_back(fmt::format("{} rows produced no trainable tokens and were skipped (first at line {})",
                                     td.issues.size(), td.issues.front().line));
  if (data.eval_rows_bad > 0)
    d.warnings.push_back(fmt::format("skipped {} bad rows of {}", data.eval_rows_bad, o.eval_data_path));
  for (int64_t i : data.train) d.train.push_back(td.samples[static_cast<size_t>(i)]);
  for (const Sample* s : data.eval_samples()) d.eval.push_back(*s);
  if (ds.keep_eval_conversations) {
    d.eval_conversations = std::move(data.eval_conversations);
    d.eval_template = std::make_shared<const ChatTemplate>(data_chat_template(ds, tok));
  }
  return d;
}

int64_t label_tokens(const std::vector<uint8_t>& loss_mask) {
  int64_t n = 0;
  for (size_t t = 1; t < loss_mask.size(); ++t) n += loss_mask[t] ? 1 : 0;
  return n;
}

int64_t sample_label_tokens(const Sample& s) {
  return label_tokens(s.loss_mask) + label_tokens(s.rejected_loss_mask);
}

int64_t sample_tokens(const Sample& s) {
  return static_cast<int64_t>(s.ids.size() + s.rejected_ids.size());
}

Batch make_batch(const std::vector<const Sample*>& samples) {
  PackedBatch p = pack_samples(samples);
  Batch b;
  int64_t T = p.num_tokens();
  b.tokens = Tensor::from_vector(p.tokens, {T});
  b.positions = Tensor::from_vector(p.positions, {T});
  b.labels = Tensor::from_vector(p.labels, {T});
  b.cu_seqlens = Tensor::from_vector(p.cu_seqlens, {static_cast<int64_t>(p.cu_seqlens.size())});
  return b;
}

}  // namespace bp
