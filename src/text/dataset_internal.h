// Internals shared by dataset_reader.cpp, dataset_formats.cpp, dataset_preference.cpp and
// dataset.cpp (not a public API).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/dataset.h"

namespace bp::data {

inline constexpr int kMaxJsonDepth = 64;

struct RawRecord {
  int64_t line;
  std::string_view text;
  bool plain_text;                // a .txt paragraph, not JSON
  std::optional<RowIssue> issue;  // a row already known to be bad (a malformed CSV record)
};

bool valid_utf8(std::string_view s, size_t* bad_offset);
// Splits a file into records; *json_array tells whether it was a JSON array. Text after the
// closing ']' of a JSON array sets *array_problem (the file is not JSON).
std::vector<RawRecord> split_records(std::string_view content, bool plain_text, bool* json_array,
                                     std::string* array_problem);
// A .csv/.tsv file's records (text/dataset_csv.cpp): its header names the keys and each later
// record is one JSON object in `texts`, which the good records' text points into (keep `texts`
// alive and unmoved while the records are used). A malformed record carries its issue. A bad
// header (malformed, unnamed or repeated column) throws INPUT_DATASET_PARSE_FAILED.
struct CsvRecords {
  std::vector<std::string> header;  // the columns' names, in order
  std::vector<std::string> texts;
  std::vector<RawRecord> records;
};
CsvRecords split_csv_records(std::string_view content, char delim, const std::string& path);
// UTF-8 check + JSON parse; a plain-text record becomes {"text": ...}. nullopt when fine.
std::optional<RowIssue> parse_record(const RawRecord& rec, nlohmann::ordered_json* out);

// The format a row's keys indicate; Auto when none matches.
DatasetFormat detect_format(const nlohmann::ordered_json& obj);
// Converts one parsed object in format `fmt` into row (line/index already set); returns the
// problem when the row is bad. opts: how tool-call arguments are given to the template.
std::optional<RowIssue> convert_row(const nlohmann::ordered_json& obj, DatasetFormat fmt, DatasetRow& row,
                                    const DatasetLoadOptions& opts = {});

RowIssue issue(const DatasetRow& row, RowProblem p, std::string msg);
// The keys of a message list's turns, and how its problems are worded.
struct TurnKeys {
  const char* role = "role";
  const char* content = "content";
  bool sharegpt = false;              // ShareGPT role names (human, gpt) are accepted
  std::string what{};                 // prefix of the messages, e.g. "'chosen' "
  size_t completion_from = SIZE_MAX;  // an empty turn at or past this index is EmptyCompletion
  // Tool-calling conversations (OpenAI messages, ShareGPT conversations): the tool roles, tool_calls,
  // and every other key of a message passed to the template. Off (the preference formats): role and
  // content only, as before issue 43.
  bool tools = false;
  ToolArguments tool_arguments = ToolArguments::Object;
};
// Appends the turns of the JSON array `turns` to out (roles checked, contents non-empty strings).
std::optional<RowIssue> parse_turns(const nlohmann::ordered_json& turns, const DatasetRow& row, const TurnKeys& keys,
                                    Conversation& out);
// Optional system first, then user/assistant alternating from user, at least one assistant; an
// assistant turn with tool calls is followed by tool results (role tool or ipython), then the
// assistant. A result naming a tool_call_id the calls do not have, or more results than calls, is
// BadToolCall.
std::optional<RowIssue> check_order(const DatasetRow& row, const Conversation& c);

// Tool calls and tool definitions (text/dataset_tools.cpp).
// Checks and normalizes a message's tool_calls in place (null keys dropped, arguments in the form
// `args` asks for); `where` names the turn in messages ("turn 2 (assistant)").
std::optional<RowIssue> normalize_tool_calls(nlohmann::ordered_json& calls, const DatasetRow& row,
                                             const std::string& where, ToolArguments args);
// ShareGPT's function_call turn (LLaMA-Factory): its value, a JSON string or object {"name",
// "arguments"} or a list of them, as OpenAI tool_calls (normalized).
std::optional<RowIssue> sharegpt_function_call(const nlohmann::ordered_json& value, const DatasetRow& row,
                                               const std::string& where, ToolArguments args,
                                               nlohmann::ordered_json& calls);
// A row's "tools" (a list, or a JSON string of one) into conv.tools; null or absent leaves it null.
std::optional<RowIssue> parse_row_tools(const nlohmann::ordered_json& obj, const DatasetRow& row, Conversation& conv);
// A row's "chat_template_kwargs" (an object) into conv.template_kwargs.
std::optional<RowIssue> parse_row_template_kwargs(const nlohmann::ordered_json& obj, const DatasetRow& row,
                                                  Conversation& conv);
// data.reasoning drop: removes reasoning_content and thinking from assistant turns before the last
// user message.
void drop_history_reasoning(Conversation& conv);
// The preference formats (dataset_preference.cpp).
std::optional<RowIssue> convert_pair_row(const nlohmann::ordered_json& obj, DatasetRow& row);
std::optional<RowIssue> convert_unpaired_row(const nlohmann::ordered_json& obj, DatasetRow& row);
// A preference row's sample (both sequences of a pair); a kept row's truncation is added to `counts`. The
// returned issue is the row's problem (TooLong: nothing of a completion fits). Template errors throw
// as tokenize_conversation's do.
std::optional<RowIssue> tokenize_preference_row(const DatasetRow& row, const Tokenizer& tok, const ChatTemplate& tmpl,
                                                int64_t max_seq_length, Sample& s, TokenizedDataset& counts);

}  // namespace bp::data
