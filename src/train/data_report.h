// `backprop data report` and `backprop data split` (issue 43): what is wrong with a dataset before
// a run trains on it, and a train/eval split that keeps near-duplicates on one side.
//
// A finding names its kind, the 1-based line of the row and, for the pairwise kinds, the other
// row's line (and file for contamination):
//   bad_row             a row training skips (load_dataset's RowIssue: not JSON, missing field,
//                       role order, unknown role, invalid UTF-8, rejected by the chat template, ...)
//   empty_target        a row that leaves no token to learn from: an empty assistant turn or
//                       completion, or (with --model) a loss mask with no trained token at all (the
//                       "every label is -100, the loss is 0" bug)
//   too_long            longer than max_seq_length (with --model in tokens, exact; without, an
//                       estimate at 4 characters per token): training truncates it, or skips it when
//                       its trained part lies past the limit (the message says which)
//   duplicate           the same row text as an earlier line
//   near_duplicate      estimated Jaccard similarity of word 3-shingles >= the threshold with an
//                       earlier line (MinHash + LSH, text/minhash.h)
//   contamination       an eval row (--eval-data) whose text equals a training row's
//   near_contamination  an eval row near a training row (the same test as near_duplicate)
// A row's text for these comparisons is every message's role and content in order (a pair: its
// prompt, chosen and rejected completions; a text row: its text).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "text/dataset.h"
#include "text/minhash.h"

namespace bp {

struct DataReportOptions {
  std::string file;
  std::string eval_file;      // optional: contamination against it, and its own findings
  std::string model_dir;      // optional: exact token lengths and loss masks (tokenizer + template)
  std::string chat_template;  // as data.chat_template
  ChatDataOptions chat;       // tools, template variables, reasoning, tool arguments (as training)
  DatasetFormat format = DatasetFormat::Auto;
  int64_t max_seq_length = 2048;
  double near_threshold = 0.8;  // data.near_duplicate_threshold
  MinHashOptions minhash;
};

struct DataFinding {
  std::string kind;
  std::string file;  // the file of `line` (the eval file's rows have their own findings)
  int64_t line = 0;
  int64_t other_line = 0;  // duplicate / near_duplicate: the earlier line; contamination: the train line
  double similarity = 0;   // near_*: the estimated Jaccard similarity
  std::string message;
};

// The finding kinds, in report order (the values --fail-on takes).
const std::vector<std::string>& data_finding_kinds();

struct DataFileSummary {
  std::string path;
  std::string format;
  int64_t rows = 0, good_rows = 0;
  std::string length_unit;                   // "tokens" (with a model) or "characters"
  int64_t total_length = 0, max_length = 0;  // over good rows
  std::vector<std::pair<int64_t, int64_t>>
      histogram;  // (upper bound of the bucket, rows); the last bound is -1 = above max_seq_length
};

struct DataReport {
  DataFileSummary train;
  std::optional<DataFileSummary> eval;
  int64_t max_seq_length = 0;
  double near_threshold = 0;
  std::vector<DataFinding> findings;  // in data_finding_kinds() order, then file order
  std::map<std::string, int64_t> counts() const;
  nlohmann::ordered_json to_json(int64_t max_findings) const;
  std::string to_text(int64_t max_findings) const;
};

// Errors as load_dataset's (missing file, unknown format) and the model's loaders.
DataReport build_data_report(const DataReportOptions& o);

struct DataSplitOptions {
  std::string file;
  double eval_fraction = 0.1;  // (0, 1)
  uint64_t seed = 0;
  std::string train_out, eval_out;  // default: FILE's stem + .train.jsonl / .eval.jsonl beside it
  double near_threshold = 0.8;
  MinHashOptions minhash;
  ColumnMap columns{};  // data.columns: how the rows are read (they are written back as they are)
};

struct DataSplitResult {
  std::string train_path, eval_path;
  int64_t train_rows = 0, eval_rows = 0, groups = 0, grouped_rows = 0;  // groups of 2+ rows kept together
};

// JSONL only (the rows are written back byte for byte); a row that does not parse stays on the
// train side. Deterministic: the same file, fraction and seed give the same two files.
DataSplitResult split_dataset(const DataSplitOptions& o);

}  // namespace bp
