// Row formats: detection from keys, and conversion of ShareGPT / OpenAI / Alpaca / text rows into
// DatasetRow with the reason when a row is bad (missing field, wrong type, empty turn, unknown
// role, wrong role order). The preference formats' rows are dataset_preference.cpp's.
#include <fmt/format.h>

#include "text/dataset_internal.h"

namespace bp::data {

using json = nlohmann::ordered_json;

RowIssue issue(const DatasetRow& row, RowProblem p, std::string msg) {
  return RowIssue{row.line, p, std::move(msg)};
}

std::optional<RowIssue> check_order(const DatasetRow& row, const Conversation& c) {
  if (c.empty()) return issue(row, RowProblem::EmptyTurn, "the conversation has no turns");
  size_t k = 0;
  if (c[0].role == "system") ++k;
  bool has_assistant = false;
  for (size_t expect_user = 1; k < c.size(); ++k, expect_user ^= 1) {
    const char* want = expect_user ? "user" : "assistant";
    if (c[k].role != want) {
      const std::string prev = k == 0 ? "the start" : c[k - 1].role;
      return issue(row, RowProblem::WrongRoleOrder,
                   fmt::format("turn {} is '{}' after {}; expected '{}' (optional system first, then user and "
                               "assistant alternating)",
                               k + 1, c[k].role, k == 0 ? prev : "'" + prev + "'", want));
    }
    has_assistant = has_assistant || c[k].role == "assistant";
  }
  if (!has_assistant) return issue(row, RowProblem::WrongRoleOrder, "the conversation has no assistant turn");
  return std::nullopt;
}

std::optional<RowIssue> parse_turns(const json& turns, const DatasetRow& row, const TurnKeys& keys, Conversation& out) {
  const std::string& w = keys.what;
  for (size_t k = 0; k < turns.size(); ++k) {
    const json& t = turns[k];
    if (!t.is_object())
      return issue(row, RowProblem::WrongType,
                   fmt::format("{}turn {} must be an object, found {}", w, k + 1, t.type_name()));
    if (!t.contains(keys.role))
      return issue(row, RowProblem::MissingField, fmt::format("{}turn {} has no '{}'", w, k + 1, keys.role));
    if (!t.contains(keys.content))
      return issue(row, RowProblem::MissingField, fmt::format("{}turn {} has no '{}'", w, k + 1, keys.content));
    const json& r = t[keys.role];
    const json& v = t[keys.content];
    if (!r.is_string())
      return issue(row, RowProblem::WrongType, fmt::format("{}turn {}: '{}' must be a string", w, k + 1, keys.role));
    std::string role = r.get<std::string>();
    if (keys.sharegpt) {
      if (role == "human" || role == "user")
        role = "user";
      else if (role == "gpt" || role == "assistant")
        role = "assistant";
      else if (role != "system")
        return issue(row, RowProblem::UnknownRole,
                     fmt::format("{}turn {}: unknown role '{}' (expected human, gpt, system, user or assistant)", w,
                                 k + 1, role));
    } else if (role != "system" && role != "user" && role != "assistant") {
      return issue(row, RowProblem::UnknownRole,
                   fmt::format("{}turn {}: unknown role '{}' (expected system, user or assistant)", w, k + 1, role));
    }
    if (v.is_null() ||
        (v.is_string() && v.get_ref<const std::string&>().find_first_not_of(" \t\r\n") == std::string::npos))
      return issue(row, k >= keys.completion_from ? RowProblem::EmptyCompletion : RowProblem::EmptyTurn,
                   fmt::format("{}turn {} ({}) is empty", w, k + 1, role));
    if (!v.is_string())
      return issue(row, RowProblem::WrongType,
                   fmt::format("{}turn {}: '{}' must be a string, found {}", w, k + 1, keys.content, v.type_name()));
    out.push_back({role, v.get<std::string>()});
  }
  return std::nullopt;
}

namespace {

std::optional<RowIssue> convert_turns(const json& obj, DatasetRow& row, const char* list_key, const char* role_key,
                                      const char* content_key, bool sharegpt) {
  if (!obj.contains(list_key)) return issue(row, RowProblem::MissingField, fmt::format("missing field '{}'", list_key));
  const json& turns = obj[list_key];
  if (!turns.is_array())
    return issue(row, RowProblem::WrongType,
                 fmt::format("'{}' must be an array, found {}", list_key, turns.type_name()));
  if (auto bad = parse_turns(turns, row, {.role = role_key, .content = content_key, .sharegpt = sharegpt}, row.conv))
    return bad;
  return check_order(row, row.conv);
}

// A required (non-empty) or optional string field.
std::optional<RowIssue> string_field(const json& obj, const DatasetRow& row, const char* key, bool required,
                                     std::string* out) {
  if (!obj.contains(key) || obj[key].is_null()) {
    if (required) return issue(row, RowProblem::MissingField, fmt::format("missing field '{}'", key));
    return std::nullopt;
  }
  const json& v = obj[key];
  if (!v.is_string())
    return issue(row, RowProblem::WrongType, fmt::format("'{}' must be a string, found {}", key, v.type_name()));
  *out = v.get<std::string>();
  if (required && out->find_first_not_of(" \t\r\n") == std::string::npos)
    return issue(row, RowProblem::EmptyTurn, fmt::format("'{}' is empty", key));
  return std::nullopt;
}

}  // namespace

DatasetFormat detect_format(const json& obj) {
  if (!obj.is_object()) return DatasetFormat::Auto;
  if (obj.contains("chosen") || obj.contains("rejected")) return DatasetFormat::Preference;
  if (obj.contains("completion") && obj.contains("label")) return DatasetFormat::Unpaired;
  if (obj.contains("conversations")) return DatasetFormat::ShareGPT;
  if (obj.contains("messages")) return DatasetFormat::OpenAI;
  if (obj.contains("instruction") || obj.contains("output")) return DatasetFormat::Alpaca;
  if (obj.contains("text")) return DatasetFormat::Text;
  return DatasetFormat::Auto;
}

std::optional<RowIssue> convert_row(const json& obj, DatasetFormat fmt, DatasetRow& row) {
  switch (fmt) {
    case DatasetFormat::ShareGPT: return convert_turns(obj, row, "conversations", "from", "value", true);
    case DatasetFormat::OpenAI: return convert_turns(obj, row, "messages", "role", "content", false);
    case DatasetFormat::Alpaca: {
      std::string instruction, input, output, system;
      if (auto i = string_field(obj, row, "instruction", true, &instruction)) return i;
      if (auto i = string_field(obj, row, "input", false, &input)) return i;
      if (auto i = string_field(obj, row, "output", true, &output)) return i;
      if (auto i = string_field(obj, row, "system", false, &system)) return i;
      if (!system.empty()) row.conv.push_back({"system", system});
      row.conv.push_back({"user", input.empty() ? instruction : instruction + "\n\n" + input});
      row.conv.push_back({"assistant", output});
      return std::nullopt;
    }
    case DatasetFormat::Text: {
      row.is_text = true;
      return string_field(obj, row, "text", true, &row.text);
    }
    case DatasetFormat::Preference: return convert_pair_row(obj, row);
    case DatasetFormat::Unpaired: return convert_unpaired_row(obj, row);
    case DatasetFormat::Auto:
    case DatasetFormat::PlainText: break;  // a plain file's rows are Text (parse_dataset)
  }
  return issue(row, RowProblem::MissingField, "no known format");
}

}  // namespace bp::data
