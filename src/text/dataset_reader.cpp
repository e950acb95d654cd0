// Dataset files -> raw records with line numbers: JSONL lines, JSON-array elements (split by a
// small scanner so each element keeps its own line number and a broken element spoils only
// itself), or plain-text paragraphs. Also the UTF-8 check. Never throws on malformed content.
#include <fmt/format.h>

#include "core/file_read.h"
#include "text/dataset_internal.h"

namespace bp::data {

bool valid_utf8(std::string_view s, size_t* bad_offset) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    if (i + len > n) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    for (size_t k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) {
        if (bad_offset) *bad_offset = i;
        return false;
      }
      cp = (cp << 6) | (d & 0x3F);
    }
    const bool overlong = (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      if (bad_offset) *bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

}  // namespace

std::vector<RawRecord> split_records(std::string_view content, bool plain_text, bool* json_array,
                                     std::string* array_problem) {
  std::vector<RawRecord> out;
  *json_array = false;
  array_problem->clear();
  if (plain_text) {
    // Paragraphs separated by blank (whitespace-only) lines; each is a contiguous slice of content.
    size_t pos = 0, para_start = 0, para_end = 0;
    int64_t line = 1, para_line = 0;
    bool in_para = false;
    auto flush = [&] {
      if (in_para) {
        while (para_end > para_start && (content[para_end - 1] == '\n' || content[para_end - 1] == '\r')) --para_end;
        out.push_back({para_line, content.substr(para_start, para_end - para_start), true, std::nullopt});
      }
      in_para = false;
    };
    while (pos < content.size()) {
      size_t nl = content.find('\n', pos);
      const size_t end = nl == std::string_view::npos ? content.size() : nl + 1;
      bool blank = true;
      for (size_t k = pos; k < end; ++k) blank = blank && is_ws(content[k]);
      if (blank) {
        flush();
      } else {
        if (!in_para) {
          in_para = true;
          para_start = pos;
          para_line = line;
        }
        para_end = end;
      }
      pos = end;
      ++line;
    }
    flush();
    return out;
  }
  size_t first = 0;
  while (first < content.size() && is_ws(content[first])) ++first;
  if (first < content.size() && content[first] == '[') {
    *json_array = true;
    int64_t line = 1;
    for (size_t k = 0; k < first; ++k) line += content[k] == '\n';
    size_t pos = first + 1;
    for (;;) {
      while (pos < content.size() && (is_ws(content[pos]) || content[pos] == ',')) line += content[pos++] == '\n';
      if (pos >= content.size()) break;  // never closed: the broken last element is a bad row
      if (content[pos] == ']') {
        size_t rest = pos + 1;
        while (rest < content.size() && is_ws(content[rest])) line += content[rest++] == '\n';
        if (rest < content.size())
          *array_problem = fmt::format("line {} has text after the closing ']' of the JSON array", line);
        break;
      }
      const size_t start = pos;
      const int64_t start_line = line;
      int depth = 0;
      bool in_str = false;
      while (pos < content.size()) {
        const char c = content[pos];
        if (in_str) {
          if (c == '\\' && pos + 1 < content.size()) {
            line += content[pos + 1] == '\n';
            pos += 2;
            continue;
          }
          if (c == '"') in_str = false;
        } else if (c == '"') {
          in_str = true;
        } else if (c == '{' || c == '[') {
          ++depth;
        } else if (c == '}' || c == ']') {
          if (depth == 0 && c == ']') break;  // the array's closing bracket
          if (depth > 0) --depth;             // a stray '}' stays in this (broken) element
        } else if (c == ',' && depth == 0) {
          break;
        }
        line += c == '\n';
        ++pos;
      }
      out.push_back({start_line, content.substr(start, pos - start), false, std::nullopt});
    }
    return out;
  }
  // JSONL: every non-blank line is a record.
  size_t pos = 0;
  int64_t line = 1;
  while (pos < content.size()) {
    size_t nl = content.find('\n', pos);
    const size_t end = nl == std::string_view::npos ? content.size() : nl;
    std::string_view l = content.substr(pos, end - pos);
    bool blank = true;
    for (char c : l) blank = blank && is_ws(c);
    if (!blank) out.push_back({line, l, false, std::nullopt});
    pos = end + 1;
    ++line;
  }
  return out;
}

std::optional<RowIssue> parse_record(const RawRecord& rec, nlohmann::ordered_json* out) {
  if (rec.issue) return rec.issue;
  size_t bad = 0;
  if (!valid_utf8(rec.text, &bad))
    return RowIssue{rec.line, RowProblem::InvalidUtf8, fmt::format("invalid UTF-8 at byte {} of the row", bad + 1)};
  if (rec.plain_text) {
    *out = nlohmann::ordered_json{{"text", std::string(rec.text)}};
    return std::nullopt;
  }
  if (json_nesting_depth(rec.text) > kMaxJsonDepth)
    return RowIssue{rec.line, RowProblem::NotJson, fmt::format("JSON nested deeper than {} levels", kMaxJsonDepth)};
  try {
    *out = nlohmann::ordered_json::parse(rec.text);
  } catch (const nlohmann::json::exception& e) {
    std::string msg = e.what();
    if (auto p = msg.find("] "); msg.rfind("[json.exception", 0) == 0 && p != std::string::npos)
      msg = msg.substr(p + 2);
    return RowIssue{rec.line, RowProblem::NotJson, "not valid JSON: " + msg};
  }
  if (!out->is_object())
    return RowIssue{rec.line, RowProblem::NotObject, fmt::format("expected a JSON object, found {}", out->type_name())};
  return std::nullopt;
}

}  // namespace bp::data
