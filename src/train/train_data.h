// The trainer's view of the data; text/dataset_pipeline.h does the work (the one path from a
// dataset file to training samples). This file only maps the training options onto it, words its
// warnings, and turns packed batches into model tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "text/dataset.h"
#include "text/packing.h"
#include "train/preference.h"

namespace bp {

class Tokenizer;
struct TrainOptions;

struct TrainData {
  std::vector<Sample> train, eval;
  int64_t rows_total = 0, rows_skipped = 0, samples_truncated = 0;
  std::string format;  // detected or forced
  std::vector<std::string> warnings;
  ChatTemplateSource chat_template;  // the template the samples were rendered with, and its source
  // --eval-metric: each held-out sample's conversation (eval's order) and the template that renders it.
  std::vector<Conversation> eval_conversations;
  std::shared_ptr<const ChatTemplate> eval_template;
};

// What a training method reads: dpo/orpo/simpo pairs, kto labelled completions, sft single rows.
DataShape method_data_shape(TrainMethod m);

// prepare_training_data with the options (the method's shape: a file that does not fit it is
// INPUT_DATASET_WRONG_SHAPE; pairs for kto are unpaired): loads, validates (skipping bad rows unless strict),
// renders with the chat template, masks (assistant-only unless train_on_all), truncates and splits
// off the holdout (seeded) or reads the eval file.
TrainData build_train_data(const TrainOptions& options, const Tokenizer& tokenizer);

// Label tokens a sample contributes once packed (its loss-mask positions after the first; a pair's
// two sequences both count).
int64_t sample_label_tokens(const Sample& s);
// Label tokens of one sequence's loss mask once packed (its mask positions after the first).
int64_t label_tokens(const std::vector<uint8_t>& loss_mask);
// Tokens a sample packs into (a pair: its chosen and rejected sequences).
int64_t sample_tokens(const Sample& s);
// Packs samples and makes the model's tensors.
Batch make_batch(const std::vector<const Sample*>& samples);

}  // namespace bp
