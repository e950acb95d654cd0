// The one path from a dataset file to training data (issue 5), the one the trainer takes
// (train/train_data.h only turns its result into the trainer's samples, warnings and tensors):
//   chat template (the model's own, a Jinja file or chatml) -> load_dataset -> check_dataset (skip
//   bad rows and say how many, or --strict fails) -> tokenize_dataset (loss masks, truncation)
//   -> seeded held-out split (or a separate eval file) -> a DataCursor over the training samples.
//
//   TrainingData data = prepare_training_data(settings, tokenizer);
//   DataCursor cursor = data.make_cursor(state_from_checkpoint_or_default);
//   std::vector<const Sample*> next = data.next_train_samples(cursor, sequences_per_step);
//   PackedBatch mb = pack_samples(next);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/chat_template.h"
#include "text/data_cursor.h"
#include "text/dataset.h"
#include "text/packing.h"

namespace bp {

struct DataSettings {
  std::string path;
  DatasetFormat format = DatasetFormat::Auto;
  bool strict = false;  // any bad row (or a row the template rejects) -> INPUT_DATASET_INVALID
  int64_t max_seq_length = 2048;
  bool train_on_all = false;  // loss on every token, not only assistant turns
  double holdout = 0.0;       // fraction of samples held out for evaluation, [0, 1); none below 2 samples
  uint64_t seed = 0;          // shuffling and the holdout split
  bool shuffle = true;
  std::string chat_template{};  // "" = the tokenizer's own, a Jinja file, or "chatml"
  ChatDataOptions chat{};       // tools, template variables, reasoning, tool arguments (dataset.h "Tool calls")
  jinja::RenderLimits template_limits{};  // step and size budget of one render
  std::string eval_path{};                // a separate held-out file: all of `path` trains, no holdout
  // What the training method reads (train/train_data.cpp maps training.method): a file whose format
  // does not fit is INPUT_DATASET_WRONG_SHAPE (data_shape_problem); pairs given to Labelled (KTO)
  // are unpaired (unpair_preference). train_on_all does not apply to preference samples.
  DataShape shape = DataShape::Single;
  // Keep each held-out sample's conversation (TrainingData::eval_conversations): --eval-metric.
  bool keep_eval_conversations = false;
};

struct TrainingData {
  DatasetFormat format = DatasetFormat::Auto;  // as detected (or forced), before any unpairing
  TokenizedDataset tokenized;                  // all usable samples; Sample::id indexes tokenized.samples
  std::vector<int64_t> train, eval;            // sample ids of the two splits (disjoint)
  TokenizedDataset eval_file;                  // the samples of eval_path (then `eval` is empty)
  // With keep_eval_conversations: the row of each held-out sample, in eval_samples()' order (a text
  // row's is empty).
  std::vector<Conversation> eval_conversations;
  int64_t rows_total = 0;
  int64_t rows_bad = 0;              // rows check_dataset rejected (skipped)
  int64_t rows_skipped = 0;          // bad rows + rows dropped at tokenization (tokenized.issues)
  int64_t eval_rows_bad = 0;         // bad rows of eval_path (skipped)
  ChatTemplateSource chat_template;  // the template the samples were rendered with, and its source
  bool template_is_fallback = false;
  std::string template_warning;  // non-empty when the model's template fell back to ChatML
  uint64_t seed = 0;
  bool shuffle = true;

  // A cursor over the training split; state comes from a checkpoint when resuming.
  DataCursor make_cursor(CursorState state = {}) const;
  // The next n training samples in the cursor's deterministic order.
  std::vector<const Sample*> next_train_samples(DataCursor& cursor, int64_t n) const;
  // The held-out samples: the eval split, or every sample of eval_path.
  std::vector<const Sample*> eval_samples() const;
};

// The chat template of `s` (its choice, render limits and template variables) and the load options of
// its files (format, tools, reasoning, tool arguments). Errors: those of ChatTemplate::from_tokenizer
// and load_tools_file, CONFIG_INVALID_SETTING (a reserved template variable).
ChatTemplate data_chat_template(const DataSettings& s, const Tokenizer& tok);
DatasetLoadOptions data_load_options(const DataSettings& s);

// Errors: INPUT_DATASET_NOT_FOUND, INPUT_DATASET_PARSE_FAILED, INPUT_DATASET_INVALID (empty, all
// bad, strict with a bad row, or no sample left for training), INPUT_DATASET_WRONG_SHAPE (the
// format does not fit settings.shape), CONFIG_INVALID_SETTING (holdout).
TrainingData prepare_training_data(const DataSettings& settings, const Tokenizer& tok);

}  // namespace bp
