// CSV and TSV dataset files -> raw records (contract: text/dataset_internal.h split_csv_records).
//
// RFC 4180 as spreadsheets and pandas write it: fields separated by the delimiter, records by LF
// or CRLF; a field that starts with '"' is quoted, may hold delimiters and line breaks, and writes
// a quote as "". A quote inside an unquoted field is an ordinary character (as Python's csv
// module reads it). A UTF-8 byte-order mark before the header (Excel's "CSV UTF-8") is skipped.
// The first record is the header: its cells name the keys. Every later record becomes one JSON
// object, serialised once here, so that the JSON path (format detection, conversion, validation)
// reads it like any other row; a record that cannot be one (a field count that differs from the
// header's, text after a closing quote, invalid UTF-8) keeps its line and its problem.
//
// Types: every cell is a string, except that a column whose non-empty cells are all true/false
// (any case) is boolean, as pandas infers it (KTO's `label`). Empty cells are empty strings.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "text/dataset_internal.h"

namespace bp::data {

namespace {

struct CsvRow {
  int64_t line = 0;  // line of the record's first character
  std::vector<std::string> cells;
  std::string problem;  // non-empty: the record is malformed
};

// Splits `content` into records of cells. Stops at an unterminated quote, which spoils the rest of
// the file (nothing after it can be told apart from the quoted text): that record keeps the problem.
std::vector<CsvRow> read_rows(std::string_view content, char delim) {
  std::vector<CsvRow> rows;
  size_t pos = 0;
  int64_t line = 1;
  if (content.substr(0, 3) == "\xEF\xBB\xBF") pos = 3;
  const size_t n = content.size();
  while (pos < n) {
    // A blank line (nothing but a line break, or spaces and tabs) is no record.
    size_t k = pos;
    while (k < n && (content[k] == ' ' || (content[k] == '\t' && delim != '\t') || content[k] == '\r')) ++k;
    if (k >= n) break;
    if (content[k] == '\n') {
      pos = k + 1;
      ++line;
      continue;
    }
    CsvRow row;
    row.line = line;
    std::string cell;
    bool done = false;
    while (!done) {
      cell.clear();
      if (pos < n && content[pos] == '"') {
        const int64_t open_line = line;
        ++pos;
        bool closed = false;
        while (pos < n) {
          const char c = content[pos];
          if (c == '"') {
            if (pos + 1 < n && content[pos + 1] == '"') {
              cell += '"';
              pos += 2;
              continue;
            }
            ++pos;
            closed = true;
            break;
          }
          line += c == '\n';
          cell += c;
          ++pos;
        }
        if (!closed) {
          row.problem = fmt::format("the quoted field opened on line {} is never closed", open_line);
          row.cells.push_back(cell);
          rows.push_back(std::move(row));
          return rows;
        }
        // After the closing quote: the delimiter, the end of the record, or a malformed tail.
        if (pos < n && content[pos] != delim && content[pos] != '\n' && content[pos] != '\r') {
          if (row.problem.empty())
            row.problem =
                fmt::format("text after the closing quote of field {} (write a quote inside a quoted field as \"\")",
                            row.cells.size() + 1);
          while (pos < n && content[pos] != delim && content[pos] != '\n') cell += content[pos++];
        }
      } else {
        while (pos < n && content[pos] != delim && content[pos] != '\n') cell += content[pos++];
        if (!cell.empty() && cell.back() == '\r' && (pos >= n || content[pos] == '\n')) cell.pop_back();
      }
      row.cells.push_back(cell);
      if (pos < n && content[pos] == delim) {
        ++pos;
        continue;
      }
      // End of the record: CRLF or LF (or the end of the file).
      if (pos < n && content[pos] == '\r') ++pos;
      if (pos < n && content[pos] == '\n') {
        ++pos;
        ++line;
      }
      done = true;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

bool is_bool_text(const std::string& s) {
  std::string l(s);
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return l == "true" || l == "false";
}

}  // namespace

CsvRecords split_csv_records(std::string_view content, char delim, const std::string& path) {
  CsvRecords out;
  std::vector<CsvRow> rows = read_rows(content, delim);
  if (rows.empty()) return out;
  const CsvRow& head = rows.front();
  const char* kind = delim == '\t' ? "TSV" : "CSV";
  if (!head.problem.empty())
    throw Error(
        ErrorCode::INPUT_DATASET_PARSE_FAILED,
        fmt::format("[dataset] {}: the {} header (line {}) is malformed: {}", path, kind, head.line, head.problem),
        {{"path", path}});
  std::vector<std::string> keys = head.cells;
  for (size_t c = 0; c < keys.size(); ++c) {
    size_t bad = 0;
    if (!valid_utf8(keys[c], &bad))
      throw Error(ErrorCode::INPUT_DATASET_PARSE_FAILED,
                  fmt::format("[dataset] {}: column {} of the {} header is not valid UTF-8", path, c + 1, kind),
                  {{"path", path}});
    if (keys[c].empty())
      throw Error(ErrorCode::INPUT_DATASET_PARSE_FAILED,
                  fmt::format("[dataset] {}: column {} of the {} header (line {}) has no name; every column needs one "
                              "(e.g. instruction, output)",
                              path, c + 1, kind, head.line),
                  {{"path", path}});
    for (size_t d = 0; d < c; ++d)
      if (keys[d] == keys[c])
        throw Error(ErrorCode::INPUT_DATASET_PARSE_FAILED,
                    fmt::format("[dataset] {}: the {} header names column '{}' twice (columns {} and {})", path, kind,
                                keys[c], d + 1, c + 1),
                    {{"path", path}});
  }
  out.header = keys;
  // Boolean columns: every non-empty cell of the well-formed records is true/false, and one is.
  std::vector<bool> boolean(keys.size(), true), any(keys.size(), false);
  for (size_t r = 1; r < rows.size(); ++r) {
    if (!rows[r].problem.empty() || rows[r].cells.size() != keys.size()) continue;
    for (size_t c = 0; c < keys.size(); ++c) {
      const std::string& v = rows[r].cells[c];
      if (v.empty()) continue;
      any[c] = true;
      boolean[c] = boolean[c] && is_bool_text(v);
    }
  }
  out.texts.reserve(rows.size() - 1);
  out.records.reserve(rows.size() - 1);
  for (size_t r = 1; r < rows.size(); ++r) {
    CsvRow& row = rows[r];
    if (row.problem.empty() && row.cells.size() != keys.size())
      row.problem = fmt::format("{} fields where the header has {} columns ({}); quote a field that holds a '{}'",
                                row.cells.size(), keys.size(), fmt::join(keys, ", "), delim == '\t' ? "\\t" : ",");
    // One issue per record: its malformation, else its first cell that is not UTF-8.
    std::optional<RowIssue> bad_row;
    if (!row.problem.empty()) bad_row = RowIssue{row.line, RowProblem::BadCsvRow, row.problem};
    for (size_t c = 0; c < row.cells.size() && !bad_row; ++c)
      if (size_t at = 0; !valid_utf8(row.cells[c], &at))
        bad_row = RowIssue{row.line, RowProblem::InvalidUtf8,
                           fmt::format("invalid UTF-8 at byte {} of column '{}'", at + 1, keys[c])};
    if (bad_row) {
      out.records.push_back({row.line, {}, false, std::move(bad_row)});
      continue;
    }
    nlohmann::ordered_json obj = nlohmann::ordered_json::object();
    for (size_t c = 0; c < keys.size(); ++c) {
      const std::string& v = row.cells[c];
      if (boolean[c] && any[c] && !v.empty()) {
        obj[keys[c]] = v.size() == 4;  // "true" has 4 letters, "false" 5
      } else {
        obj[keys[c]] = v;
      }
    }
    out.texts.push_back(obj.dump());
    out.records.push_back({row.line, {}, false, std::nullopt});
  }
  // The texts are all in place now (no more reallocation): point the good records at them.
  size_t t = 0;
  for (auto& rec : out.records)
    if (!rec.issue) rec.text = out.texts[t++];
  return out;
}

}  // namespace bp::data
