// Row formats: detection from keys, and conversion of ShareGPT / OpenAI / Alpaca / text rows into
// DatasetRow with the reason when a row is bad (missing field, wrong type, empty turn, unknown
// role, wrong role order). The preference formats' rows are dataset_preference.cpp's.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

#include "text/dataset_internal.h"

namespace bp::data {

using json = nlohmann::ordered_json;

RowIssue issue(const DatasetRow& row, RowProblem p, std::string msg) {
  return RowIssue{row.line, p, std::move(msg)};
}

namespace {

bool is_tool_role(const std::string& role) {
  return role == "tool" || role == "ipython";
}

// The ids of a message's tool calls (calls without an id are left out).
std::vector<std::string> tool_call_ids(const ChatMessage& m) {
  std::vector<std::string> ids;
  if (!m.has_tool_calls()) return ids;
  for (const json& c : m.extra.at("tool_calls"))
    if (auto it = c.find("id"); it != c.end() && it->is_string()) ids.push_back(it->get<std::string>());
  return ids;
}

}  // namespace

std::optional<RowIssue> check_order(const DatasetRow& row, const Conversation& c) {
  if (c.empty()) return issue(row, RowProblem::EmptyTurn, "the conversation has no turns");
  size_t k = 0;
  if (c[0].role == "system") ++k;
  bool has_assistant = false;
  // What the previous turn lets come next: user after the start or a plain assistant turn;
  // assistant after user; tool results after an assistant turn that calls tools; after a result,
  // another result or the assistant.
  enum class After { Start, User, Assistant, Calls, Tool } prev = After::Start;
  size_t calls_at = 0, calls = 0, results = 0;
  std::vector<std::string> ids;
  for (; k < c.size(); ++k) {
    const std::string& role = c[k].role;
    const bool tool = is_tool_role(role);
    const char* want = nullptr;
    switch (prev) {
      case After::Start:
      case After::Assistant: want = role == "user" ? nullptr : "user"; break;
      case After::User: want = role == "assistant" ? nullptr : "assistant"; break;
      case After::Calls: want = tool ? nullptr : "tool"; break;
      case After::Tool: want = tool || role == "assistant" ? nullptr : "tool' or 'assistant"; break;
    }
    if (want) {
      const std::string before = k == 0 ? "the start" : "'" + c[k - 1].role + "'";
      const char* rule = prev == After::Calls  ? "an assistant turn that calls tools is followed by their results"
                         : prev == After::Tool ? "tool results are followed by the assistant"
                                               : "optional system first, then user and assistant alternating";
      return issue(row, RowProblem::WrongRoleOrder,
                   fmt::format("turn {} is '{}' after {}; expected '{}' ({})", k + 1, role, before, want, rule));
    }
    if (tool) {
      ++results;
      if (results > calls)
        return issue(row, RowProblem::BadToolCall,
                     fmt::format("turn {} ({}) is result {} of turn {}'s {} tool call{}: more results than calls",
                                 k + 1, role, results, calls_at + 1, calls, calls == 1 ? "" : "s"));
      const json& extra = c[k].extra;
      if (auto it = extra.is_object() ? extra.find("tool_call_id") : extra.end();
          !ids.empty() && it != extra.end() && it->is_string() &&
          std::find(ids.begin(), ids.end(), it->get<std::string>()) == ids.end())
        return issue(row, RowProblem::BadToolCall,
                     fmt::format("turn {} ({}) answers tool_call_id '{}', which no call of turn {} has (its ids: {})",
                                 k + 1, role, it->get<std::string>(), calls_at + 1, fmt::join(ids, ", ")));
      prev = After::Tool;
    } else if (role == "assistant") {
      has_assistant = true;
      if (c[k].has_tool_calls()) {
        prev = After::Calls;
        calls_at = k;
        calls = c[k].extra.at("tool_calls").size();
        results = 0;
        ids = tool_call_ids(c[k]);
      } else {
        prev = After::Assistant;
      }
    } else {
      prev = After::User;
    }
  }
  if (!has_assistant) return issue(row, RowProblem::WrongRoleOrder, "the conversation has no assistant turn");
  return std::nullopt;
}

namespace {

bool blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

// One turn of a tool-calling conversation (keys.tools): OpenAI's message with all its keys, or
// ShareGPT's {"from", "value"} with LLaMA-Factory's function_call / observation roles.
std::optional<RowIssue> parse_tool_turn(const json& t, size_t k, const DatasetRow& row, const TurnKeys& keys,
                                        Conversation& out) {
  const std::string& w = keys.what;
  const std::string from = t[keys.role].get<std::string>();
  ChatMessage m;
  bool function_call = false;
  if (keys.sharegpt) {
    if (from == "human" || from == "user")
      m.role = "user";
    else if (from == "gpt" || from == "assistant" || from == "function_call")
      m.role = "assistant";
    else if (from == "observation" || from == "tool")
      m.role = "tool";
    else if (from == "system")
      m.role = "system";
    else
      return issue(row, RowProblem::UnknownRole,
                   fmt::format("{}turn {}: unknown role '{}' (expected human, gpt, system, function_call, observation, "
                               "user, assistant or tool)",
                               w, k + 1, from));
    function_call = from == "function_call";
  } else {
    if (from != "system" && from != "user" && from != "assistant" && !is_tool_role(from))
      return issue(
          row, RowProblem::UnknownRole,
          fmt::format("{}turn {}: unknown role '{}' (expected system, user, assistant or tool)", w, k + 1, from));
    m.role = from;
  }
  const std::string where = fmt::format("{}turn {} ({})", w, k + 1, from);
  json extra = json::object();
  if (function_call) {
    const json& v = t.contains(keys.content) ? t[keys.content] : json();
    json calls;
    if (auto bad = sharegpt_function_call(v, row, where, keys.tool_arguments, calls)) return bad;
    extra["tool_calls"] = std::move(calls);
  } else if (!keys.sharegpt) {  // every other key of an OpenAI message reaches the template
    for (auto it = t.begin(); it != t.end(); ++it) {
      if (it.key() == keys.role || it.key() == keys.content || it->is_null()) continue;
      extra[it.key()] = *it;
    }
  }
  if (auto it = extra.find("tool_calls"); it != extra.end()) {
    if (m.role != "assistant")
      return issue(row, RowProblem::BadToolCall,
                   fmt::format("{} has tool_calls: only assistant turns call tools", where));
    if (auto bad = normalize_tool_calls(*it, row, where, keys.tool_arguments)) return bad;
    if (it->empty()) extra.erase(it);
  }
  for (const char* key : {"reasoning_content", "thinking", "tool_call_id", "name"})
    if (auto it = extra.find(key); it != extra.end() && !it->is_string())
      return issue(row, RowProblem::WrongType,
                   fmt::format("{}: '{}' must be a string, found {}", where, key, it->type_name()));
  if (!extra.empty()) m.extra = std::move(extra);
  const bool calls = m.has_tool_calls();
  if (function_call) {
    m.content_kind = ChatMessage::ContentKind::Text;  // "": Qwen3 and Llama 3.x need a string there
  } else if (!t.contains(keys.content)) {
    if (!calls)
      return issue(row, RowProblem::MissingField, fmt::format("{}turn {} has no '{}'", w, k + 1, keys.content));
    m.content_kind = ChatMessage::ContentKind::Absent;
  } else if (const json& v = t[keys.content]; v.is_null()) {
    if (!calls)
      return issue(row, k >= keys.completion_from ? RowProblem::EmptyCompletion : RowProblem::EmptyTurn,
                   fmt::format("{}turn {} ({}) is empty", w, k + 1, from));
    m.content_kind = ChatMessage::ContentKind::Null;
  } else if (!v.is_string()) {
    return issue(row, RowProblem::WrongType,
                 fmt::format("{}turn {}: '{}' must be a string, found {}", w, k + 1, keys.content, v.type_name()));
  } else {
    m.content = v.get<std::string>();
    // A tool may return nothing; an assistant turn that calls tools needs no text.
    if (blank(m.content) && !calls && !is_tool_role(m.role))
      return issue(row, k >= keys.completion_from ? RowProblem::EmptyCompletion : RowProblem::EmptyTurn,
                   fmt::format("{}turn {} ({}) is empty", w, k + 1, from));
  }
  out.push_back(std::move(m));
  return std::nullopt;
}

}  // namespace

std::optional<RowIssue> parse_turns(const json& turns, const DatasetRow& row, const TurnKeys& keys, Conversation& out) {
  const std::string& w = keys.what;
  for (size_t k = 0; k < turns.size(); ++k) {
    const json& t = turns[k];
    if (!t.is_object())
      return issue(row, RowProblem::WrongType,
                   fmt::format("{}turn {} must be an object, found {}", w, k + 1, t.type_name()));
    if (!t.contains(keys.role))
      return issue(row, RowProblem::MissingField, fmt::format("{}turn {} has no '{}'", w, k + 1, keys.role));
    if (!keys.tools && !t.contains(keys.content))
      return issue(row, RowProblem::MissingField, fmt::format("{}turn {} has no '{}'", w, k + 1, keys.content));
    const json& r = t[keys.role];
    if (!r.is_string())
      return issue(row, RowProblem::WrongType, fmt::format("{}turn {}: '{}' must be a string", w, k + 1, keys.role));
    if (keys.tools) {
      if (auto bad = parse_tool_turn(t, k, row, keys, out)) return bad;
      continue;
    }
    const json& v = t[keys.content];
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
                                      const char* content_key, bool sharegpt, const DatasetLoadOptions& opts) {
  if (!obj.contains(list_key)) return issue(row, RowProblem::MissingField, fmt::format("missing field '{}'", list_key));
  const json& turns = obj[list_key];
  if (!turns.is_array())
    return issue(row, RowProblem::WrongType,
                 fmt::format("'{}' must be an array, found {}", list_key, turns.type_name()));
  // LLaMA-Factory's ShareGPT rows carry the system prompt as a row key.
  if (sharegpt && obj.contains("system") && !obj["system"].is_null()) {
    const json& sys = obj["system"];
    if (!sys.is_string())
      return issue(row, RowProblem::WrongType, fmt::format("'system' must be a string, found {}", sys.type_name()));
    if (!blank(sys.get_ref<const std::string&>())) row.conv.push_back({"system", sys.get<std::string>()});
  }
  const TurnKeys keys{.role = role_key,
                      .content = content_key,
                      .sharegpt = sharegpt,
                      .tools = true,
                      .tool_arguments = opts.tool_arguments};
  if (auto bad = parse_turns(turns, row, keys, row.conv)) return bad;
  if (auto bad = parse_row_tools(obj, row, row.conv)) return bad;
  if (auto bad = parse_row_template_kwargs(obj, row, row.conv)) return bad;
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

std::optional<RowIssue> convert_row(const json& obj, DatasetFormat fmt, DatasetRow& row,
                                    const DatasetLoadOptions& opts) {
  switch (fmt) {
    case DatasetFormat::ShareGPT: return convert_turns(obj, row, "conversations", "from", "value", true, opts);
    case DatasetFormat::OpenAI: return convert_turns(obj, row, "messages", "role", "content", false, opts);
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
    case DatasetFormat::Csv:
    case DatasetFormat::Tsv:               // parse_dataset detects a table's row format
    case DatasetFormat::PlainText: break;  // a plain file's rows are Text (parse_dataset)
  }
  return issue(row, RowProblem::MissingField, "no known format");
}

}  // namespace bp::data
