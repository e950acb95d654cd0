// Datasets (issue 5, DESIGN.md "text & data"): reading, format detection, per-row validation
// and tokenization into training samples.
//
// Files: JSONL (one JSON object per line), a JSON array of objects, or plain .txt (samples are
// paragraphs separated by blank lines). Row formats, detected from the first JSON object or forced:
//   sharegpt  {"conversations": [{"from": "human"|"user"|"gpt"|"assistant"|"system", "value": "..."}]}
//             (LLaMA-Factory's tool roles too: "function_call" is an assistant turn calling tools, its
//             value the call JSON; "observation" a tool result; row keys "system" and "tools")
//   openai    {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "...", ...}],
//              "tools": [...] (optional), "chat_template_kwargs": {...} (optional)}
//             every key of a message reaches the template (tool_calls, tool_call_id, name,
//             reasoning_content, thinking, ...), as transformers passes it (see "Tool calls" below)
//   alpaca    {"instruction": "...", "input": "..." (optional), "output": "...", "system": "..." (optional)}
//   text      {"text": "..."}                      (and .txt files)
//   preference {"prompt", "chosen", "rejected"}    (TRL's preference form; strings or message lists)
//              {"chosen": [...], "rejected": [...]} (conversations; the prompt is all but the last message)
//   kto        {"prompt", "completion", "label": true|false}   (TRL's unpaired preference form)
// (docs/preference.md "Datasets" describes the preference forms and their checks.)
// Every bad row is reported with its 1-based line number (for JSON arrays: the line where the
// element starts) and a reason; loading never throws for a bad row. Conversations must be: an
// optional system message first, then user/assistant alternating from user, with at least one
// assistant turn; an assistant turn with tool calls is followed by its tool results (role tool, one or
// more), then the assistant again.
//
// Tool calls (issue 43): a message's tool_calls is a list of {"type": "function", "function": {"name",
// "arguments"}, "id"} (or {"name", "arguments"}); arguments an object or a JSON string of one, given
// to the template as data.tool_arguments says (object by default: a string is parsed, as TRL and
// LLaMA-Factory do, since most templates write `arguments | tojson`). A key whose value is null is left
// out (datasets exported from Arrow tables carry null for every missing key), content excepted, and so
// is an empty tool_calls list. A malformed call is bad_tool_call, a malformed tools list bad_tools.
//
// Pipeline: load_dataset -> check_dataset (skip bad rows and say how many, or --strict fails)
// -> tokenize_dataset (chat template + loss mask, truncation to max_seq_length keeping the start)
// -> split_holdout / DataCursor (data_cursor.h) -> pack_samples (packing.h).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace bp {

// PlainText (--format txt) reads the file as plain text whatever its name (samples: paragraphs
// separated by blank lines, as a .txt file under auto or text); its rows are then Text.
// Preference and Unpaired are the preference formats (docs/preference.md).
// Csv and Tsv force the file type (a CSV/TSV file whatever its name: `--format csv`); its rows' format
// is then detected from the header's column names, as Auto does for JSON rows.
enum class DatasetFormat { Auto, ShareGPT, OpenAI, Alpaca, Text, PlainText, Preference, Unpaired, Csv, Tsv };
// The names --format takes (train's data.format, validate's --format): the allowed values of the
// data.format row of core/settings_registry.inc, the one list that the settings check, the help,
// docs/settings.md and parse_dataset_format share.
std::vector<std::string> dataset_format_names();
// One of dataset_format_names() ("" = auto); any other name is INPUT_VALIDATION_FAILED listing them.
DatasetFormat parse_dataset_format(std::string_view name);
const char* dataset_format_name(DatasetFormat f);

// What a training method reads (sft: Single; dpo/orpo/simpo: Pair; kto: Labelled).
enum class DataShape { Single, Pair, Labelled };
const char* data_shape_name(DataShape s);         // "single", "pair", "labelled"
DataShape dataset_format_shape(DatasetFormat f);  // Preference: Pair, Unpaired: Labelled, others: Single
// Why data of format `f` cannot train a method reading `want` ("" when it fits). Pair data fits
// Labelled (unpair_preference splits it); Single fits only Single; Labelled fits only Labelled.
// Auto (no row could be read) fits anything: the empty file is check_dataset's to report.
std::string data_shape_problem(DatasetFormat f, DataShape want);
// Throws INPUT_DATASET_WRONG_SHAPE with data_shape_problem when the file's format does not fit.
void check_data_shape(DatasetFormat f, DataShape want, const std::string& path);

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
  RejectedByTemplate,
  IdenticalPair,    // chosen and rejected completions are the same text
  EmptyCompletion,  // a preference row's completion (chosen, rejected, completion) is empty
  PromptMismatch,   // chosen and rejected conversations differ before their final message
  BadCsvRow,        // a .csv/.tsv record that is not one row of the header's columns
  BadToolCall,      // a malformed tool call (arguments not a JSON object, no name, an unanswered id, ...)
  BadTools          // a row's tools is not a list of tool definitions
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
  Conversation conv;  // otherwise (preference rows: the prompt + the chosen or the one completion)
  // Preference rows: the prompt + the rejected completion (pairs), and KTO's label (1 desirable,
  // 0 undesirable; -1 for other rows). The completion is always conv's final (assistant) message.
  Conversation rejected_conv;
  int8_t label = -1;
  bool is_pair() const { return !rejected_conv.empty(); }
  bool is_preference() const { return is_pair() || label >= 0; }
};

struct LoadedDataset {
  std::string path;
  DatasetFormat format = DatasetFormat::Auto;  // the detected or forced format
  int64_t total_rows = 0;
  std::vector<DatasetRow> rows;  // good rows, in file order
  std::vector<RowIssue> issues;  // bad rows, in file order
};

// data.reasoning: what reaches the template of the reasoning (reasoning_content, thinking) of
// assistant turns before the conversation's last user message. Keep: all of it (the template decides,
// as at inference: Qwen3 shows only the turns after the last user message); Drop: those keys are
// removed first, whatever the template would do.
enum class ReasoningMode { Keep, Drop };
ReasoningMode parse_reasoning_mode(std::string_view name);  // "keep" | "drop"
// data.tool_arguments: a tool call's arguments as the template gets them. Object: a JSON string is
// parsed into its object (what `arguments | tojson` templates need: Qwen, Llama 3.x, Mistral, ...);
// String: an object is written as JSON text (json.dumps as transformers' tojson writes it; what
// DeepSeek's and FireFunction's templates concatenate).
enum class ToolArguments { Object, String };
ToolArguments parse_tool_arguments(std::string_view name);  // "object" | "string"
// data.template_kwargs: "" = null (none), else a JSON object (CONFIG_INVALID_SETTING otherwise).
nlohmann::ordered_json parse_template_kwargs(std::string_view text);

// data.columns: the file's column (or JSON key) names for the keys the formats read, as pairs (key,
// column): "output=answer,instruction=question" or a JSON object {"output": "answer", ...}; "" = none.
// Keys are the formats' own (instruction, input, output, system, prompt, chosen, rejected, completion,
// label, text, messages, conversations, tools); CONFIG_INVALID_SETTING names an unknown key, an empty
// column, or a key or column given twice.
using ColumnMap = std::vector<std::pair<std::string, std::string>>;
ColumnMap parse_column_map(std::string_view text);

struct DatasetLoadOptions {
  DatasetFormat format = DatasetFormat::Auto;
  // Each row's `column` is read as `key` (LLaMA-Factory's "columns"): renamed before the format is
  // detected, so every format and file type (JSON, CSV) takes it. A CSV header without a mapped
  // column is INPUT_DATASET_INVALID naming it; a JSON row without it is a missing_field issue.
  ColumnMap columns{};
  ReasoningMode reasoning = ReasoningMode::Keep;
  ToolArguments tool_arguments = ToolArguments::Object;
  // The tools of every conversation row that has none of its own (data.tools, read by
  // load_tools_file): a JSON list, or null for none.
  nlohmann::ordered_json tools = nullptr;
  // > 0: rows longer than this are reported as TooLong. With a tokenizer (and template) the
  // length is exact in tokens; without one it is estimated as ceil(bytes / 4) tokens.
  int64_t max_length = 0;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
};

// The tool definitions of data.tools: a JSON file holding a list of tools ({"type": "function",
// "function": {...}}) or an object with such a list under "tools". Errors: INPUT_DATASET_NOT_FOUND,
// INPUT_DATASET_PARSE_FAILED (not JSON, or not a list of objects).
nlohmann::ordered_json load_tools_file(const std::string& path);

class Settings;
// How rows are read (data.columns) and what conversation rows carry to the chat template besides their
// messages, as training, validate, data report and eval read it: data.tools, data.template_kwargs,
// data.reasoning, data.tool_arguments.
struct ChatDataOptions {
  ColumnMap columns{};                               // data.columns (how rows are read, for the same commands)
  std::string tools_path;                            // "" = none
  nlohmann::ordered_json template_kwargs = nullptr;  // an object, or null for none
  ReasoningMode reasoning = ReasoningMode::Keep;
  ToolArguments tool_arguments = ToolArguments::Object;
  static ChatDataOptions from_settings(const Settings& s);
  // Into the load options (reads the tools file) and the template (its variables).
  void apply(DatasetLoadOptions& lo) const;
  void apply(ChatTemplate& tmpl) const;
  bool operator==(const ChatDataOptions&) const = default;
};

// Errors: INPUT_DATASET_NOT_FOUND (missing/unreadable), INPUT_DATASET_PARSE_FAILED (JSON objects
// whose format matches none of the known ones). Bad rows are issues, not exceptions.
LoadedDataset load_dataset(const std::string& path, const DatasetLoadOptions& opts = {});
// Parses an in-memory file (path only names it; ".txt" selects plain text). Used by the fuzzer.
LoadedDataset parse_dataset(std::string_view content, const std::string& path, const DatasetLoadOptions& opts = {});

// Pair rows -> labelled rows, as TRL's unpair_preference_dataset: each pair becomes its chosen
// (label 1) then its rejected (label 0) conversation, both with the pair's line. format becomes
// Unpaired. Other rows are left alone.
void unpair_preference(LoadedDataset& ds);

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
  // For a pair prompt_len == rejected_prompt_len and the first prompt_len tokens of both are equal.
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
// tokenize_conversation. Preference rows: tokenize_preference_row. Truncation keeps the start
// (a preference row keeps its prompt and cuts the completion's end) and warns with counts; a row
// left without a trained token (past position 0) is an issue (TooLong).
TokenizedDataset tokenize_dataset(const LoadedDataset& ds, const Tokenizer& tok, const ChatTemplate& tmpl,
                                  const TokenizeOptions& opts);

struct TokenizedPreference {
  TokenizedConversation seq;  // loss mask restricted to the final assistant turn
  size_t prompt_len = 0;      // tokens before the final turn (lcp with the prompt's generation render)
};
// A preference conversation (the prompt + one final assistant message) through the SFT path
// (tokenize_conversation, {% generation %} included), its mask kept only on the final turn.
TokenizedPreference tokenize_preference_conv(const ChatTemplate& tmpl, const Tokenizer& tok, const Conversation& conv,
                                             size_t keep_tokens);

// Exported for tests and the fuzzer: strict UTF-8 check (no overlongs, surrogates or > U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace bp
