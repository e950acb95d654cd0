// Datasets (issue 5, DESIGN.md "text & data"): reading, format detection, per-row validation
// and tokenization into training samples.
//
// Files: JSONL (one JSON object per line), a JSON array of objects, or plain .txt (samples are
// paragraphs separated by blank lines). Row formats, detected from the first JSON object or forced:
//   sharegpt  {"conversations": [{"from": "human"|"user"|"gpt"|"assistant"|"system", "value": "..."}]}
//   openai    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}]}
//   alpaca    {"instruction": "...", "input": "..." (optional), "output": "...", "system": "..." (optional)}
//   text      {"text": "..."}                      (and .txt files)
// Every bad row is reported with its 1-based line number (for JSON arrays: the line where the
// element starts) and a reason; loading never throws for a bad row. Conversations must be: an
// optional system message first, then user/assistant alternating from user, with at least one
// assistant turn.
//
// Pipeline: load_dataset -> check_dataset (skip bad rows and say how many, or --strict fails)
// -> tokenize_dataset (chat template + loss mask, truncation to max_seq_length keeping the start)
// -> split_holdout / DataCursor (data_cursor.h) -> pack_samples (packing.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace bp {

// PlainText (--format txt) reads the file as plain text whatever its name (samples: paragraphs
// separated by blank lines, as a .txt file under auto or text); its rows are then Text.
enum class DatasetFormat { Auto, ShareGPT, OpenAI, Alpaca, Text, PlainText };
// The names --format takes (train's data.format, validate's --format): the allowed values of the
// data.format row of core/settings_registry.inc, the one list that the settings check, the help,
// docs/settings.md and parse_dataset_format share.
std::vector<std::string> dataset_format_names();
// One of dataset_format_names() ("" = auto); any other name is INPUT_VALIDATION_FAILED listing them.
DatasetFormat parse_dataset_format(std::string_view name);
const char* dataset_format_name(DatasetFormat f);

enum class RowProblem {
  NotJson,
  NotObject,
  MissingField,
  WrongType,
  EmptyTurn,
  WrongRoleOrder,
  UnknownRole,
  TooLong,
  InvalidUtf8,
  RejectedByTemplate
};
const char* row_problem_name(RowProblem p);  // "not_json", "missing_field", ... (stable, for --json)

struct RowIssue {
  int64_t line = 0;
  RowProblem problem;
  std::string message;  // human reason with the numbers, e.g. "turn 3 (user) follows user"
};

struct DatasetRow {
  int64_t line = 0;   // 1-based line of the row in the file
  int64_t index = 0;  // 0-based position among all rows (good and bad)
  bool is_text = false;
  std::string text;   // is_text
  Conversation conv;  // otherwise
};

struct LoadedDataset {
  std::string path;
  DatasetFormat format = DatasetFormat::Auto;  // the detected or forced format
  int64_t total_rows = 0;
  std::vector<DatasetRow> rows;  // good rows, in file order
  std::vector<RowIssue> issues;  // bad rows, in file order
};

struct DatasetLoadOptions {
  DatasetFormat format = DatasetFormat::Auto;
  // > 0: rows longer than this are reported as TooLong. With a tokenizer (and template) the
  // length is exact in tokens; without one it is estimated as ceil(bytes / 4) tokens.
  int64_t max_length = 0;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
};

// Errors: INPUT_DATASET_NOT_FOUND (missing/unreadable), INPUT_DATASET_PARSE_FAILED (JSON objects
// whose format matches none of the known ones). Bad rows are issues, not exceptions.
LoadedDataset load_dataset(const std::string& path, const DatasetLoadOptions& opts = {});
// Parses an in-memory file (path only names it; ".txt" selects plain text). Used by the fuzzer.
LoadedDataset parse_dataset(std::string_view content, const std::string& path, const DatasetLoadOptions& opts = {});

// What the trainer calls after loading: throws INPUT_DATASET_INVALID when the file has no rows,
// every row is bad, or strict and any row is bad (the message names the first bad rows with line
// numbers). Otherwise logs a warning "skipped N of M rows" when rows are bad and returns N.
int64_t check_dataset(const LoadedDataset& ds, bool strict);

struct Sample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss_mask;  // 1 = token is a training target
  int64_t source_line = 0;
  int64_t id = 0;  // position in the tokenized dataset (stable sample id)
  // Preference data (training.method dpo/orpo/simpo/kto). ids/loss_mask: the chosen sequence (KTO:
  // the one completion); rejected_*: the rejected one (pairs only). prompt_len: tokens of the prompt at
  // the start of ids (rejected_prompt_len: of rejected_ids); the loss mask is 1 exactly on the final
  // assistant turn's trained tokens (what the SFT mask marks there, {% generation %} included).
  std::vector<int32_t> rejected_ids;
  std::vector<uint8_t> rejected_loss_mask;
  int64_t prompt_len = 0, rejected_prompt_len = 0;
  int8_t label = -1;  // KTO: 1 desirable, 0 undesirable; -1 for other data
  bool is_pair() const { return !rejected_ids.empty(); }
};

struct TokenizeOptions {
  int64_t max_seq_length = 2048;
  bool train_on_all = false;  // loss on every token (default: only assistant turns)
};

struct TokenizedDataset {
  std::vector<Sample> samples;
  int64_t truncated = 0;            // samples cut to max_seq_length
  int64_t tokens_dropped = 0;       // tokens removed by truncation (of rows tokenized whole)
  int64_t truncated_uncounted = 0;  // truncated rows not tokenized past the limit (each drops >= 1 more)
  std::vector<RowIssue> issues;     // rows the template rejected or left without loss tokens
};

// Text rows: encode(text, add_special=true) + the first eos id, all tokens trained. Chat rows:
// tokenize_conversation. Truncation keeps the start and warns with counts.
TokenizedDataset tokenize_dataset(const LoadedDataset& ds, const Tokenizer& tok, const ChatTemplate& tmpl,
                                  const TokenizeOptions& opts);

// Exported for tests and the fuzzer: strict UTF-8 check (no overlongs, surrogates or > U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace bp
