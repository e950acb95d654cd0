// Dataset loading (detection, per-row validation, length check), the strict/skip policy the
// trainer applies, and tokenization with truncation.
#include "text/dataset.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/file_read.h"
#include "core/settings.h"
#include "text/dataset_internal.h"

namespace bp {

namespace {

using json = nlohmann::ordered_json;

std::string lower_extension(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

bool has_txt_extension(const std::string& path) {
  return lower_extension(path) == ".txt";
}

// The delimiter of a .csv (',') or .tsv ('\t') file; 0 for any other name.
char csv_delimiter(const std::string& path) {
  const std::string ext = lower_extension(path);
  return ext == ".csv" ? ',' : ext == ".tsv" ? '\t' : '\0';
}

// Parquet (a .parquet name, or the "PAR1" magic at both ends) is refused until a reader exists,
// with the one-line conversion; never parsed as JSONL into a wall of bad rows.
void refuse_parquet(std::string_view content, const std::string& path) {
  const bool magic =
      content.size() >= 8 && content.substr(0, 4) == "PAR1" && content.substr(content.size() - 4) == "PAR1";
  if (lower_extension(path) != ".parquet" && !magic) return;
  throw Error(ErrorCode::INPUT_DATASET_PARSE_FAILED,
              fmt::format("[dataset] {} is a Parquet file; backprop reads JSONL, JSON, CSV/TSV and .txt datasets, "
                          "not Parquet yet",
                          path),
              {{"path", path}})
      .with_suggestion(
          "Convert it once: python3 -c \"import pandas as pd; pd.read_parquet('FILE.parquet').to_json('FILE.jsonl', "
          "orient='records', lines=True, force_ascii=False)\" (Debian: python3-pandas python3-pyarrow), or use the "
          "dataset's JSONL/CSV files where the repository has them.");
}

std::string issue_summary(const std::vector<RowIssue>& issues, size_t max_listed) {
  std::string out;
  for (size_t k = 0; k < issues.size() && k < max_listed; ++k)
    out += fmt::format("{}line {}: {}", k ? "; " : "", issues[k].line, issues[k].message);
  if (issues.size() > max_listed) out += fmt::format("; and {} more", issues.size() - max_listed);
  return out;
}

json issues_json(const std::vector<RowIssue>& issues, size_t max_listed) {
  json arr = json::array();
  for (size_t k = 0; k < issues.size() && k < max_listed; ++k)
    arr.push_back(
        {{"line", issues[k].line}, {"reason", row_problem_name(issues[k].problem)}, {"message", issues[k].message}});
  return arr;
}

// data.columns on one parsed row: each mapped column renamed to its key (a key the file also has under
// its own name gives way to the mapped column); a row without a mapped column is a missing_field issue.
std::optional<RowIssue> rename_columns(const data::RawRecord& rec, const ColumnMap& columns, json& obj) {
  if (columns.empty() || rec.plain_text || !obj.is_object()) return std::nullopt;
  for (const auto& [key, column] : columns)
    if (!obj.contains(column))
      return RowIssue{rec.line, RowProblem::MissingField,
                      fmt::format("no '{}' (read as '{}' by --columns)", column, key)};
  json out = json::object();
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    std::string name = it.key();
    bool replaced = false;
    for (const auto& [key, column] : columns) {
      if (name == column) {
        name = key;
        break;
      }
      replaced = replaced || name == key;
    }
    if (!replaced || name != it.key()) out[name] = std::move(it.value());
  }
  obj = std::move(out);
  return std::nullopt;
}

// A CSV/TSV header must have every column --columns names (else no row could be read).
void check_header_columns(const std::vector<std::string>& header, const ColumnMap& columns, const std::string& path) {
  for (const auto& [key, column] : columns)
    if (std::find(header.begin(), header.end(), column) == header.end())
      throw Error(ErrorCode::INPUT_DATASET_INVALID,
                  fmt::format("[dataset] {}: --columns reads '{}' from column '{}', which the header does not have "
                              "(its columns: {})",
                              path, key, column, fmt::join(header, ", ")),
                  {{"path", path}, {"column", column}})
          .with_suggestion("Name one of the header's columns in --columns, or fix the header row.");
}

// The chat template, not the row, is at fault (it cannot be run, or fails inside itself): the
// dataset stops at the first row it fails on, named once, instead of listing every row as bad.
Error template_fault_at_row(const Error& e, const std::string& path, int64_t line) {
  return Error(e.code(), fmt::format("{} (dataset row: line {} of {})", e.what(), line, path), e.details());
}

// Length of a good row in tokens (exact with a tokenizer, else estimated); may add an issue.
std::optional<RowIssue> check_length(const DatasetRow& row, const DatasetLoadOptions& opts, const std::string& path) {
  if (opts.max_length <= 0) return std::nullopt;
  if (opts.tokenizer) {
    int64_t n;
    // Only whether the row is longer matters: no need to tokenize past max_length (issue 13).
    bool cut = false;
    const auto keep = static_cast<size_t>(opts.max_length);
    if (row.is_text) {
      n = static_cast<int64_t>(encode_prefix(*opts.tokenizer, row.text, true, keep, &cut).size()) +
          (opts.tokenizer->eos_ids().empty() ? 0 : 1);
    } else {
      std::optional<ChatTemplate> chatml;  // only without a template (its constructor warns)
      if (!opts.chat_template) chatml.emplace("", "", "");
      const ChatTemplate& t = opts.chat_template ? *opts.chat_template : *chatml;
      try {
        n = 0;
        for (const Conversation* c : {&row.conv, &row.rejected_conv}) {  // a pair's longer sequence counts
          if (c->empty()) continue;
          bool cut_c = false;
          n = std::max(
              n, static_cast<int64_t>(encode_prefix(*opts.tokenizer, t.render(*c, false), false, keep, &cut_c).size()));
          cut = cut || cut_c;
        }
      } catch (const Error& e) {
        if (e.code() == ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED) throw template_fault_at_row(e, path, row.line);
        return RowIssue{row.line, RowProblem::RejectedByTemplate, e.what()};
      }
    }
    if (n > opts.max_length)
      return RowIssue{row.line, RowProblem::TooLong,
                      fmt::format("{}{} tokens, longer than the maximum length {}", cut ? "more than " : "",
                                  cut ? opts.max_length : n, opts.max_length)};
    return std::nullopt;
  }
  // Tool calls, reasoning and tool definitions are text the template renders too.
  const auto conv_bytes = [](const Conversation& c) {
    size_t n = c.tools.is_array() ? c.tools.dump().size() : 0;
    for (const auto& m : c) n += m.content.size() + (m.extra.is_object() ? m.extra.dump().size() : 0);
    return n;
  };
  size_t bytes = row.text.size() + conv_bytes(row.conv), rejected_bytes = conv_bytes(row.rejected_conv);
  bytes = std::max(bytes, rejected_bytes);  // a pair's longer sequence counts
  const int64_t est = static_cast<int64_t>((bytes + 3) / 4);
  if (est > opts.max_length)
    return RowIssue{row.line, RowProblem::TooLong,
                    fmt::format("about {} tokens (estimated from {} bytes at 4 bytes per token; pass --model for exact "
                                "counts), longer than the maximum length {}",
                                est, bytes, opts.max_length)};
  return std::nullopt;
}

}  // namespace

// What each name of the data.format row means. The names accepted are the row's (so a name here that
// the row lacks is refused like any other, and one the row has but this table lacks is a bug that
// tests/text/dataset_test.cpp catches).
struct FormatName {
  std::string_view name;
  DatasetFormat format;
};
constexpr FormatName kFormatMeanings[] = {
    {"auto", DatasetFormat::Auto},     {"sharegpt", DatasetFormat::ShareGPT},
    {"openai", DatasetFormat::OpenAI}, {"messages", DatasetFormat::OpenAI},
    {"alpaca", DatasetFormat::Alpaca}, {"text", DatasetFormat::Text},
    {"txt", DatasetFormat::PlainText}, {"preference", DatasetFormat::Preference},
    {"kto", DatasetFormat::Unpaired},  {"csv", DatasetFormat::Csv},
    {"tsv", DatasetFormat::Tsv},
};

std::vector<std::string> dataset_format_names() {
  const SettingSpec* spec = find_setting("data.format");
  BP_CHECK(spec != nullptr && spec->type == SettingType::Enum, "[dataset] the data.format setting is not an enum");
  std::vector<std::string> names;
  std::string_view rest = spec->choices;
  for (size_t bar; (bar = rest.find('|')) != std::string_view::npos; rest.remove_prefix(bar + 1))
    names.emplace_back(rest.substr(0, bar));
  names.emplace_back(rest);
  return names;
}

DatasetFormat parse_dataset_format(std::string_view name) {
  if (name.empty()) return DatasetFormat::Auto;
  const std::vector<std::string> names = dataset_format_names();
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[dataset] unknown format '{}' (use one of {})", name, fmt::join(names, ", ")));
  for (const FormatName& f : kFormatMeanings)
    if (f.name == name) return f.format;
  throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[dataset] format '{}' has no meaning in dataset.cpp", name));
}

const char* dataset_format_name(DatasetFormat f) {
  switch (f) {
    case DatasetFormat::Auto: return "auto";
    case DatasetFormat::ShareGPT: return "sharegpt";
    case DatasetFormat::OpenAI: return "openai";
    case DatasetFormat::Alpaca: return "alpaca";
    case DatasetFormat::Text: return "text";
    case DatasetFormat::PlainText: return "txt";
    case DatasetFormat::Preference: return "preference";
    case DatasetFormat::Unpaired: return "kto";
    case DatasetFormat::Csv: return "csv";
    case DatasetFormat::Tsv: return "tsv";
  }
  return "?";
}

// The keys the row formats read (text/dataset_formats.cpp, dataset_preference.cpp, dataset_tools.cpp).
constexpr std::string_view kColumnKeys[] = {"instruction", "input",         "output",     "system", "prompt",
                                            "chosen",      "rejected",      "completion", "label",  "text",
                                            "messages",    "conversations", "tools"};

ColumnMap parse_column_map(std::string_view text) {
  ColumnMap map;
  auto bad = [&](const std::string& why) {
    return Error(ErrorCode::CONFIG_INVALID_SETTING, fmt::format("[dataset] --columns '{}': {}", text, why))
        .with_suggestion(
            "Write KEY=COLUMN pairs, e.g. --columns 'instruction=question,output=answer', or a JSON "
            "object {\"instruction\": \"question\", \"output\": \"answer\"}.");
  };
  auto add = [&](std::string key, std::string column) {
    if (std::find(std::begin(kColumnKeys), std::end(kColumnKeys), key) == std::end(kColumnKeys))
      throw bad(fmt::format("'{}' is not a key the formats read ({})", key, fmt::join(kColumnKeys, ", ")));
    if (column.empty()) throw bad(fmt::format("key '{}' names no column", key));
    for (const auto& [k, c] : map) {
      if (k == key) throw bad(fmt::format("key '{}' is mapped twice", key));
      if (c == column) throw bad(fmt::format("column '{}' is mapped to both '{}' and '{}'", column, k, key));
    }
    map.emplace_back(std::move(key), std::move(column));
  };
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return map;
  if (text[first] == '{') {
    const json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw bad("not a JSON object");
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!it.value().is_string()) throw bad(fmt::format("the column of '{}' is not a string", it.key()));
      add(it.key(), it.value().get<std::string>());
    }
    return map;
  }
  auto trim = [](std::string_view v) {
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    return std::string(v);
  };
  for (std::string_view rest = text; !rest.empty();) {
    const size_t comma = rest.find(',');
    const std::string_view pair = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t eq = pair.find('=');
    if (eq == std::string_view::npos) throw bad(fmt::format("'{}' is not KEY=COLUMN", trim(pair)));
    add(trim(pair.substr(0, eq)), trim(pair.substr(eq + 1)));
  }
  return map;
}

const char* row_problem_name(RowProblem p) {
  switch (p) {
    case RowProblem::NotJson: return "not_json";
    case RowProblem::NotObject: return "not_object";
    case RowProblem::MissingField: return "missing_field";
    case RowProblem::WrongType: return "wrong_type";
    case RowProblem::EmptyTurn: return "empty_turn";
    case RowProblem::WrongRoleOrder: return "wrong_role_order";
    case RowProblem::UnknownRole: return "unknown_role";
    case RowProblem::TooLong: return "too_long";
    case RowProblem::InvalidUtf8: return "invalid_utf8";
    case RowProblem::RejectedByTemplate: return "rejected_by_template";
    case RowProblem::IdenticalPair: return "identical_pair";
    case RowProblem::EmptyCompletion: return "empty_completion";
    case RowProblem::PromptMismatch: return "prompt_mismatch";
    case RowProblem::BadCsvRow: return "bad_csv_row";
    case RowProblem::BadToolCall: return "bad_tool_call";
    case RowProblem::BadTools: return "bad_tools";
  }
  return "?";
}

bool is_valid_utf8(std::string_view s) {
  return data::valid_utf8(s, nullptr);
}

LoadedDataset parse_dataset(std::string_view content, const std::string& path, const DatasetLoadOptions& opts) {
  refuse_parquet(content, path);
  LoadedDataset ds;
  ds.path = path;
  const bool plain =
      opts.format == DatasetFormat::PlainText ||
      (has_txt_extension(path) && (opts.format == DatasetFormat::Auto || opts.format == DatasetFormat::Text));
  bool json_array = false;
  std::string array_problem;
  // --format csv|tsv: a table whatever the file's name, its rows' format detected from the header.
  const bool forced_table = opts.format == DatasetFormat::Csv || opts.format == DatasetFormat::Tsv;
  const char delim = forced_table ? (opts.format == DatasetFormat::Csv ? ',' : '\t')
                     : plain      ? '\0'
                                  : csv_delimiter(path);
  data::CsvRecords csv;
  if (delim) {
    csv = data::split_csv_records(content, delim, path);
    if (!csv.records.empty()) check_header_columns(csv.header, opts.columns, path);
  }
  const std::vector<data::RawRecord> records =
      delim ? std::move(csv.records) : data::split_records(content, plain, &json_array, &array_problem);
  if (!array_problem.empty())
    throw Error(ErrorCode::INPUT_DATASET_PARSE_FAILED, fmt::format("[dataset] {}: {}", path, array_problem),
                {{"path", path}});
  ds.total_rows = static_cast<int64_t>(records.size());
  ds.format = plain ? DatasetFormat::Text : forced_table ? DatasetFormat::Auto : opts.format;
  json obj;
  if (ds.format == DatasetFormat::Auto) {
    // Detect from the first object that matches a known format.
    std::string first_keys;
    bool saw_object = false;
    for (const auto& rec : records) {
      if (data::parse_record(rec, &obj) || rename_columns(rec, opts.columns, obj)) continue;
      if (!saw_object) {
        saw_object = true;
        for (auto it = obj.begin(); it != obj.end(); ++it) first_keys += (first_keys.empty() ? "" : ", ") + it.key();
        first_keys = fmt::format("line {} has keys [{}]", rec.line, first_keys);
      }
      ds.format = data::detect_format(obj);
      if (ds.format != DatasetFormat::Auto) break;
    }
    if (ds.format == DatasetFormat::Auto && saw_object)
      throw Error(ErrorCode::INPUT_DATASET_PARSE_FAILED,
                  fmt::format("[dataset] {}: no row matches a known format ({}); expected 'conversations' (ShareGPT), "
                              "'messages' (OpenAI), 'instruction'/'output' (Alpaca), 'text', "
                              "'chosen'/'rejected' (preference pairs) or 'completion'/'label' (KTO)",
                              path, first_keys));
  }
  for (size_t k = 0; k < records.size(); ++k) {
    DatasetRow row;
    row.line = records[k].line;
    row.index = static_cast<int64_t>(k);
    if (auto bad = data::parse_record(records[k], &obj)) {
      ds.issues.push_back(*bad);
      continue;
    }
    if (auto bad = rename_columns(records[k], opts.columns, obj)) {
      ds.issues.push_back(*bad);
      continue;
    }
    if (ds.format == DatasetFormat::Auto) continue;  // nothing parsed as an object: unreachable
    if (auto bad = data::convert_row(obj, ds.format, row, opts)) {
      ds.issues.push_back(*bad);
      continue;
    }
    if (!row.is_text) {
      for (Conversation* c : {&row.conv, &row.rejected_conv}) {
        if (c->empty()) continue;
        if (c->tools.is_null() && opts.tools.is_array()) c->tools = opts.tools;  // --tools: rows without their own
        if (opts.reasoning == ReasoningMode::Drop) data::drop_history_reasoning(*c);
      }
    }
    if (auto bad = check_length(row, opts, path)) {
      ds.issues.push_back(*bad);
      continue;
    }
    ds.rows.push_back(std::move(row));
  }
  return ds;
}

LoadedDataset load_dataset(const std::string& path, const DatasetLoadOptions& opts) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw Error(ErrorCode::INPUT_DATASET_NOT_FOUND,
                fmt::format("[dataset] {} {}", path,
                            std::filesystem::exists(path, ec) ? "is not a regular file" : "does not exist"));
  const std::string content =
      read_file_capped(path, FileKind::Dataset, {"dataset", ErrorCode::INPUT_DATASET_NOT_FOUND});
  return parse_dataset(content, path, opts);
}

int64_t check_dataset(const LoadedDataset& ds, bool strict) {
  const int64_t bad = static_cast<int64_t>(ds.issues.size());
  json details = {
      {"path", ds.path}, {"total_rows", ds.total_rows}, {"bad_rows", bad}, {"issues", issues_json(ds.issues, 20)}};
  if (ds.total_rows == 0)
    throw Error(ErrorCode::INPUT_DATASET_INVALID, fmt::format("[dataset] {} is empty (no rows)", ds.path), details);
  if (ds.rows.empty())
    throw Error(
        ErrorCode::INPUT_DATASET_INVALID,
        fmt::format("[dataset] all {} rows of {} are bad: {}", ds.total_rows, ds.path, issue_summary(ds.issues, 3)),
        details);
  if (bad > 0 && strict)
    throw Error(ErrorCode::INPUT_DATASET_INVALID,
                fmt::format("[dataset] --strict: {} of {} rows of {} are bad: {}", bad, ds.total_rows, ds.path,
                            issue_summary(ds.issues, 3)),
                details);
  if (bad > 0)
    spdlog::warn("[dataset] skipping {} bad rows of {} in {} ({}); `backprop validate {}` lists them all", bad,
                 ds.total_rows, ds.path, issue_summary(ds.issues, 1), ds.path);
  return bad;
}

TokenizedDataset tokenize_dataset(const LoadedDataset& ds, const Tokenizer& tok, const ChatTemplate& tmpl,
                                  const TokenizeOptions& opts) {
  BP_CHECK(opts.max_seq_length > 0, "[dataset] max_seq_length must be positive, got {}", opts.max_seq_length);
  TokenizedDataset out;
  for (const auto& row : ds.rows) {
    Sample s;
    s.source_line = row.line;
    // Work stops past what training keeps (issue 13): a row is tokenized only up to
    // max_seq_length (+ 1 token to know it was longer); `cut` rows drop an unknown number more.
    const auto keep = static_cast<size_t>(opts.max_seq_length);
    bool cut = false;
    if (row.is_text) {
      s.ids = encode_prefix(tok, row.text, true, keep, &cut);
      if (!cut && !tok.eos_ids().empty()) s.ids.push_back(tok.eos_ids().front());
      s.loss_mask.assign(s.ids.size(), 1);
    } else {
      try {
        if (row.is_preference()) {  // its own truncation and checks (both sequences of a pair)
          if (auto bad = data::tokenize_preference_row(row, tok, tmpl, opts.max_seq_length, s, out)) {
            out.issues.push_back(*bad);
          } else {
            s.id = static_cast<int64_t>(out.samples.size());
            out.samples.push_back(std::move(s));
          }
          continue;
        }
        TokenizedConversation tc = tokenize_conversation(tmpl, tok, row.conv, opts.train_on_all, keep);
        s.ids = std::move(tc.ids);
        s.loss_mask = std::move(tc.loss_mask);
        cut = tc.cut;
      } catch (const Error& e) {
        if (e.code() == ErrorCode::INPUT_CHAT_TEMPLATE_UNSUPPORTED) throw template_fault_at_row(e, ds.path, row.line);
        out.issues.push_back({row.line, RowProblem::RejectedByTemplate, e.what()});
        continue;
      }
    }
    if (static_cast<int64_t>(s.ids.size()) > opts.max_seq_length) {
      ++out.truncated;
      out.truncated_uncounted += cut ? 1 : 0;
      if (!cut) out.tokens_dropped += static_cast<int64_t>(s.ids.size()) - opts.max_seq_length;
      s.ids.resize(static_cast<size_t>(opts.max_seq_length));
      s.loss_mask.resize(static_cast<size_t>(opts.max_seq_length));
    }
    // A target at position 0 has no context to predict it from, so at least one later one is needed.
    if (std::count(s.loss_mask.begin() + (s.loss_mask.empty() ? 0 : 1), s.loss_mask.end(), 1) == 0) {
      out.issues.push_back({row.line, RowProblem::TooLong,
                            fmt::format("no trainable tokens left within max_seq_length {} ({} tokens)",
                                        opts.max_seq_length, s.ids.size())});
      continue;
    }
    s.id = static_cast<int64_t>(out.samples.size());
    out.samples.push_back(std::move(s));
  }
  if (out.truncated > 0)
    spdlog::warn(
        "[dataset] {} of {} samples were longer than max_seq_length {} and were truncated (kept the start; {}{} "
        "tokens dropped)",
        out.truncated, ds.rows.size(), opts.max_seq_length, out.truncated_uncounted > 0 ? "at least " : "",
        out.tokens_dropped + out.truncated_uncounted);
  if (!out.issues.empty())
    spdlog::warn("[dataset] skipped {} samples after tokenization ({})", out.issues.size(),
                 issue_summary(out.issues, 1));
  return out;
}

}  // namespace bp
