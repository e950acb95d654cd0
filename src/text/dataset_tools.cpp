// Tool-calling data (issue 43): tool calls checked and put in the form the chat template gets them,
// ShareGPT's function_call turns (LLaMA-Factory) as OpenAI tool calls, a row's tools and template
// variables, data.tools files, and data.reasoning's drop (contract: dataset.h, dataset_internal.h).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/file_read.h"
#include "core/settings.h"
#include "text/dataset_internal.h"
#include "text/jinja_value.h"

namespace bp {

namespace {

using json = nlohmann::ordered_json;

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string json_error_text(const nlohmann::json::exception& e) {
  std::string msg = e.what();
  if (auto p = msg.find("] "); msg.rfind("[json.exception", 0) == 0 && p != std::string::npos) msg = msg.substr(p + 2);
  return msg;
}

// JSON text inside a row (a tool call's arguments, a tools column stored as a string): nullopt and
// *error when it is not JSON or nested too deep.
std::optional<json> parse_embedded_json(const std::string& text, std::string* error) {
  if (json_nesting_depth(text) > data::kMaxJsonDepth) {
    *error = fmt::format("nested deeper than {} levels", data::kMaxJsonDepth);
    return std::nullopt;
  }
  try {
    return json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    *error = json_error_text(e);
    return std::nullopt;
  }
}

void drop_null_keys(json& obj) {
  for (auto it = obj.begin(); it != obj.end();) it = it->is_null() ? obj.erase(it) : std::next(it);
}

bool blank(const std::string& s) {
  return s.find_first_not_of(" \t\r\n") == std::string::npos;
}

}  // namespace

ReasoningMode parse_reasoning_mode(std::string_view name) {
  if (name == "keep" || name.empty()) return ReasoningMode::Keep;
  if (name == "drop") return ReasoningMode::Drop;
  throw Error(ErrorCode::CONFIG_INVALID_SETTING,
              fmt::format("[dataset] unknown data.reasoning '{}' (use keep or drop)", name));
}

ToolArguments parse_tool_arguments(std::string_view name) {
  if (name == "object" || name.empty()) return ToolArguments::Object;
  if (name == "string") return ToolArguments::String;
  throw Error(ErrorCode::CONFIG_INVALID_SETTING,
              fmt::format("[dataset] unknown data.tool_arguments '{}' (use object or string)", name));
}

json parse_template_kwargs(std::string_view text) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) return nullptr;
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[dataset] data.template_kwargs is not JSON: '{}' (write a JSON object such as "
                            "{{\"enable_thinking\": false}})",
                            text));
  check_template_variables(j, "data.template_kwargs");
  return j;
}

ChatDataOptions ChatDataOptions::from_settings(const Settings& s) {
  ChatDataOptions o;
  o.columns = parse_column_map(s.get_string("data.columns"));
  o.tools_path = s.get_string("data.tools");
  o.template_kwargs = parse_template_kwargs(s.get_string("data.template_kwargs"));
  o.reasoning = parse_reasoning_mode(s.get_string("data.reasoning"));
  o.tool_arguments = parse_tool_arguments(s.get_string("data.tool_arguments"));
  return o;
}

void ChatDataOptions::apply(DatasetLoadOptions& lo) const {
  lo.columns = columns;
  lo.reasoning = reasoning;
  lo.tool_arguments = tool_arguments;
  lo.tools = tools_path.empty() ? json() : load_tools_file(tools_path);
}

void ChatDataOptions::apply(ChatTemplate& tmpl) const {
  tmpl.set_template_kwargs(template_kwargs);
}

json load_tools_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw Error(ErrorCode::INPUT_DATASET_NOT_FOUND,
                fmt::format("[dataset] --tools {} {}", path,
                            std::filesystem::exists(path, ec) ? "is not a regular file" : "does not exist"),
                {{"path", path}});
  const std::string text =
      read_file_capped(path, FileKind::Dataset, {"tools file", ErrorCode::INPUT_DATASET_NOT_FOUND});
  std::string error;
  std::optional<json> doc = parse_embedded_json(text, &error);
  const auto refuse = [&](const std::string& why) {
    return Error(ErrorCode::INPUT_DATASET_PARSE_FAILED,
                 fmt::format("[dataset] --tools {}: {}; expected a JSON list of tool definitions such as [{{\"type\": "
                             "\"function\", \"function\": {{\"name\": ..., \"parameters\": {{...}}}}}}] (or "
                             "{{\"tools\": [...]}})",
                             path, why),
                 {{"path", path}});
  };
  if (!doc) throw refuse("not valid JSON: " + error);
  if (doc->is_object() && doc->contains("tools")) doc = (*doc)["tools"];
  if (!doc->is_array()) throw refuse(fmt::format("found a JSON {}", doc->type_name()));
  DatasetRow none;
  Conversation conv;
  if (auto bad = data::parse_row_tools(json{{"tools", *doc}}, none, conv)) throw refuse(bad->message);
  return conv.tools;
}

namespace data {

std::optional<RowIssue> normalize_tool_calls(json& calls, const DatasetRow& row, const std::string& where,
                                             ToolArguments args) {
  const auto bad = [&](const std::string& msg) { return issue(row, RowProblem::BadToolCall, where + ": " + msg); };
  if (!calls.is_array()) return bad(fmt::format("'tool_calls' must be a list, found {}", calls.type_name()));
  for (size_t i = 0; i < calls.size(); ++i) {
    json& call = calls[i];
    const std::string which = fmt::format("tool call {}", i + 1);
    if (!call.is_object()) return bad(fmt::format("{} must be an object, found {}", which, call.type_name()));
    drop_null_keys(call);
    // OpenAI's {"type": "function", "function": {"name", "arguments"}, "id"}, or the flat {"name", "arguments"}.
    const bool nested = call.contains("function");
    if (nested && !call["function"].is_object())
      return bad(fmt::format("{}: 'function' must be an object, found {}", which, call["function"].type_name()));
    json& fn = nested ? call["function"] : call;
    if (nested) drop_null_keys(fn);
    if (!fn.contains("name") || !fn["name"].is_string() || blank(fn["name"].get_ref<const std::string&>()))
      return bad(fmt::format("{} has no function name ('name' must be a non-empty string{})", which,
                             nested ? " in 'function'" : ""));
    const std::string name = fn["name"].get<std::string>();
    if (!fn.contains("arguments"))
      return bad(fmt::format("{} ({}) has no 'arguments' (write {{}} for a call without any)", which, name));
    json& a = fn["arguments"];
    if (a.is_string()) {
      const std::string text = a.get<std::string>();
      std::string error;
      std::optional<json> parsed =
          blank(text) ? std::optional<json>(json::object()) : parse_embedded_json(text, &error);
      if (!parsed) return bad(fmt::format("{} ({}): 'arguments' is not valid JSON: {}", which, name, error));
      if (!parsed->is_object())
        return bad(fmt::format("{} ({}): 'arguments' must be a JSON object, found a JSON {}", which, name,
                               parsed->type_name()));
      if (args == ToolArguments::Object) a = std::move(*parsed);
    } else if (a.is_object()) {
      // json.dumps as transformers' tojson writes it (", " and ": ", non-ASCII kept).
      if (args == ToolArguments::String) a = jinja::Value::from_json(a).to_json();
    } else {
      return bad(fmt::format("{} ({}): 'arguments' must be an object or a JSON string of one, found {}", which, name,
                             a.type_name()));
    }
    if (call.contains("id") && !call["id"].is_string())
      return bad(fmt::format("{} ({}): 'id' must be a string, found {}", which, name, call["id"].type_name()));
  }
  return std::nullopt;
}

std::optional<RowIssue> sharegpt_function_call(const json& value, const DatasetRow& row, const std::string& where,
                                               ToolArguments args, json& calls) {
  const auto bad = [&](const std::string& msg) { return issue(row, RowProblem::BadToolCall, where + ": " + msg); };
  json v = value;
  if (v.is_string()) {
    std::string error;
    std::optional<json> parsed = parse_embedded_json(v.get<std::string>(), &error);
    if (!parsed)
      return bad(
          "the value must be the call as JSON, {\"name\": ..., \"arguments\": {...}}, but it is not valid JSON: " +
          error);
    v = std::move(*parsed);
  }
  if (v.is_object()) v = json::array({std::move(v)});
  if (!v.is_array() || v.empty())
    return bad(
        fmt::format("the value must be a call {{\"name\": ..., \"arguments\": {{...}}}} or a list of them, "
                    "found {}",
                    v.is_array() ? "an empty list" : v.type_name()));
  calls = json::array();
  for (json& c : v) {
    if (!c.is_object() || c.contains("function")) {  // already OpenAI's form, or not a call: checked below
      calls.push_back(std::move(c));
      continue;
    }
    json fn = json::object();
    for (auto it = c.begin(); it != c.end(); ++it)
      if (it.key() != "id") fn[it.key()] = *it;
    json call{{"type", "function"}, {"function", std::move(fn)}};
    if (c.contains("id")) call["id"] = c["id"];
    calls.push_back(std::move(call));
  }
  return normalize_tool_calls(calls, row, where, args);
}

std::optional<RowIssue> parse_row_tools(const json& obj, const DatasetRow& row, Conversation& conv) {
  auto it = obj.find("tools");
  if (it == obj.end() || it->is_null()) return std::nullopt;
  json tools = *it;
  if (tools.is_string()) {  // datasets often store the list as JSON text (a column of one type)
    std::string error;
    std::optional<json> parsed = parse_embedded_json(tools.get<std::string>(), &error);
    if (!parsed) return issue(row, RowProblem::BadTools, "'tools' is a string but not valid JSON: " + error);
    tools = std::move(*parsed);
  }
  if (!tools.is_array())
    return issue(row, RowProblem::BadTools,
                 fmt::format("'tools' must be a list of tool definitions, found {}", tools.type_name()));
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    if (!t.is_object())
      return issue(row, RowProblem::BadTools, fmt::format("tool {} must be an object, found {}", i + 1, t.type_name()));
    const json& fn = t.contains("function") ? t["function"] : t;
    if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
      return issue(row, RowProblem::BadTools,
                   fmt::format("tool {} has no name: expected {{\"type\": \"function\", \"function\": {{\"name\": "
                               "..., \"description\": ..., \"parameters\": {{...}}}}}}",
                               i + 1));
  }
  conv.tools = std::move(tools);
  return std::nullopt;
}

std::optional<RowIssue> parse_row_template_kwargs(const json& obj, const DatasetRow& row, Conversation& conv) {
  auto it = obj.find("chat_template_kwargs");
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_object())
    return issue(
        row, RowProblem::WrongType,
        fmt::format("'chat_template_kwargs' must be an object of template variables, found {}", it->type_name()));
  for (auto k = it->begin(); k != it->end(); ++k)
    if (is_reserved_template_variable(k.key()))
      return issue(
          row, RowProblem::WrongType,
          fmt::format("'chat_template_kwargs' may not set '{}': the template gets it from the row itself", k.key()));
  conv.template_kwargs = *it;
  return std::nullopt;
}

void drop_history_reasoning(Conversation& conv) {
  size_t last_user = 0;
  for (size_t k = 0; k < conv.size(); ++k)
    if (conv[k].role == "user") last_user = k;
  for (size_t k = 0; k < last_user; ++k) {
    ChatMessage& m = conv[k];
    if (m.role != "assistant" || !m.extra.is_object()) continue;
    m.extra.erase("reasoning_content");
    m.extra.erase("thinking");
    if (m.extra.empty()) m.extra = nullptr;
  }
}

}  // namespace data

}  // namespace bp
