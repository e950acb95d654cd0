#include "train/train_data.h"

#include "text/chat_template.h"
#include "text/data_cursor.h"
#include "text/tokenizer.h"
#include "train/train_options.h"

namespace bp {

TrainData build_train_data(const TrainOptions& o, const Tokenizer& tok) {
  TrainData d;
  ChatTemplate tmpl = ChatTemplate::from_tokenizer(
      tok, o.chat_template, {.max_steps = o.template_max_steps, .max_bytes = o.template_max_bytes});
  d.chat_template = tmpl.source();
  if (tmpl.is_fallback() && !tmpl.warning().empty()) d.warnings.push_back(tmpl.warning());
  DatasetLoadOptions lo;
  lo.format = parse_dataset_format(o.data_format);
  LoadedDataset ds = load_dataset(o.data_path, lo);
  d.rows_total = ds.total_rows;
  d.rows_skipped = check_dataset(ds, o.strict);
  d.format = dataset_format_name(ds.format);
  if (d.rows_skipped > 0)
    d.warnings.push_back(fmt::format("skipped {} of {} rows of {} (run `backprop validate {}` to see them)",
                                     d.rows_skipped, d.rows_total, o.data_path, o.data_path));
  TokenizeOptions to;
  to.max_seq_length = o.max_seq_length;
  to.train_on_all = o.train_on_all;
  TokenizedDataset td = tokenize_dataset(ds, tok, tmpl, to);
  d.samples_truncated = td.truncated;
  if (td.truncated > 0)
    d.warnings.push_back(fmt::format(
        "{} samples were longer than --max-seq-length {} and were cut ({}{} tokens dropped)", td.truncated,
        o.max_seq_length, td.truncated_uncounted > 0 ? "at least " : "", td.tokens_dropped + td.truncated_uncounted));
  if (!td.issues.empty())
    d.warnings.push_back(fmt::format("{} rows produced no trainable tokens and were skipped (first at line {})",
                                     td.issues.size(), td.issues.front().line));
  if (td.samples.empty())
    throw Error(ErrorCode::INPUT_DATASET_INVALID,
                fmt::format("[train] {} has no rows with trainable tokens ({} rows read)", o.data_path, d.rows_total));
  if (!o.eval_data_path.empty()) {  // a separate held-out file: all of --data trains
    LoadedDataset eds = load_dataset(o.eval_data_path, lo);
    int64_t bad = check_dataset(eds, o.strict);
    if (bad > 0) d.warnings.push_back(fmt::format("skipped {} bad rows of {}", bad, o.eval_data_path));
    d.train = std::move(td.samples);
    d.eval = tokenize_dataset(eds, tok, tmpl, to).samples;
    return d;
  }
  double frac = td.samples.size() >= 2 ? o.holdout : 0.0;
  HoldoutSplit split = split_holdout(static_cast<int64_t>(td.samples.size()), frac, o.seed);
  for (int64_t i : split.train) d.train.push_back(td.samples[static_cast<size_t>(i)]);
  for (int64_t i : split.eval) d.eval.push_back(td.samples[static_cast<size_t>(i)]);
  return d;
}

int64_t sample_label_tokens(const Sample& s) {
  int64_t n = 0;
  for (size_t t = 1; t < s.loss_mask.size(); ++t) n += s.loss_mask[t] ? 1 : 0;
  return n;
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
