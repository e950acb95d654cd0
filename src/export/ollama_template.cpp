// Modelfile text, model-name and OLLAMA_HOST validation (export/ollama.h).
#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "core/redact.h"
#include "export/ollama.h"

namespace bp {
namespace {

bool has(const std::string& s, const char* needle) {
  return s.find(needle) != std::string::npos;
}

[[noreturn]] void bad_input(const std::string& msg) {
  throw Error(ErrorCode::INPUT_VALIDATION_FAILED, msg);
}

// A name part: first character [A-Za-z0-9_], then also '-' and '.' (not '.' in a namespace).
void check_part(const std::string& full, const std::string& part, const char* kind, size_t max_len, bool allow_dot,
                bool allow_colon) {
  if (part.empty() || part.size() > max_len)
    bad_input(fmt::format("[ollama] model name '{}': the {} must have 1 to {} characters (has {})", full, kind, max_len,
                          part.size()));
  for (size_t i = 0; i < part.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(part[i]);
    const bool ok =
        std::isalnum(c) || c == '_' || (i > 0 && (c == '-' || (c == '.' && allow_dot) || (c == ':' && allow_colon)));
    if (!ok)
      bad_input(
          fmt::format("[ollama] model name '{}': character '{}' is not allowed {} of the {} '{}' (use letters, "
                      "digits, '_', '-', '.')",
                      full, part[i], i == 0 ? "at the start" : "inside", kind, part));
  }
}

}  // namespace

std::string make_modelfile(const std::string& from, const OllamaTemplate& t, int64_t num_ctx,
                           const std::string& adapter_path, const std::string& given_system) {
  const std::string& system = given_system.empty() ? t.default_system : given_system;
  auto quote = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') q += '\\';
      q += c;
    }
    return q + "\"";
  };
  std::string m = "# Modelfile written by backprop export (" +
                  std::string(t.fallback              ? "no known chat template; plain prompt"
                              : t.family == "derived" ? "template derived from the model's chat template"
                                                      : t.family + " chat template") +
                  ")\n";
  m += "FROM " + from + "\n";
  if (!adapter_path.empty()) m += "ADAPTER " + adapter_path + "\n";
  BP_CHECK(!has(t.go_template, "\"\"\"") && !has(system, "\"\"\""),
           "[ollama] template or system prompt contains a triple quote");
  if (!t.go_template.empty()) m += "TEMPLATE \"\"\"" + t.go_template + "\"\"\"\n";
  if (!system.empty()) m += "SYSTEM \"\"\"" + system + "\"\"\"\n";
  for (const auto& s : t.stops) m += "PARAMETER stop " + quote(s) + "\n";
  if (num_ctx > 0) m += "PARAMETER num_ctx " + std::to_string(num_ctx) + "\n";
  return m;
}

void validate_ollama_model_name(const std::string& name) {
  if (name.empty()) bad_input("[ollama] the model name is empty");
  std::string rest = name, tag;
  const size_t slash = rest.rfind('/');
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos && (slash == std::string::npos || colon > slash)) {
    tag = rest.substr(colon + 1);
    rest = rest.substr(0, colon);
    check_part(name, tag, "tag", 80, true, false);
  }
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= rest.size(); ++i)
    if (i == rest.size() || rest[i] == '/') {
      parts.push_back(rest.substr(start, i - start));
      start = i + 1;
    }
  if (parts.size() > 3)
    bad_input(fmt::format("[ollama] model name '{}' has {} '/'-separated parts; at most host/namespace/model", name,
                          parts.size()));
  check_part(name, parts.back(), "model", 80, true, false);
  if (parts.size() >= 2) check_part(name, parts[parts.size() - 2], "namespace", 80, false, false);
  if (parts.size() == 3) check_part(name, parts[0], "host", 350, true, true);
}

OllamaEndpoint parse_ollama_host(const std::string& value) {
  OllamaEndpoint e;
  std::string v = value;
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.pop_back();
  if (v.empty()) return e;
  if (v.rfind("https://", 0) == 0)
    bad_input(fmt::format("[ollama] OLLAMA_HOST '{}' uses https, which this build does not speak; use http://",
                          redact(value)));
  if (v.rfind("http://", 0) == 0) v = v.substr(7);
  if (const size_t p = v.find('/'); p != std::string::npos) v = v.substr(0, p);
  if (const size_t at = v.rfind('@'); at != std::string::npos) {  // user[:password]@host
    const std::string userinfo = v.substr(0, at);
    const size_t colon = userinfo.find(':');
    e.user = userinfo.substr(0, colon);
    if (colon != std::string::npos) e.password = userinfo.substr(colon + 1);
    v = v.substr(at + 1);
  }
  const std::string shown = e.user.empty() ? value : "***@" + v;  // messages never show credentials
  const size_t colon = v.rfind(':');
  if (colon != std::string::npos) {
    const std::string port = v.substr(colon + 1);
    v = v.substr(0, colon);
    if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) || std::stoi(port) < 1 ||
        std::stoi(port) > 65535)
      bad_input(fmt::format("[ollama] OLLAMA_HOST '{}' has an invalid port '{}'", shown, port));
    e.port = std::stoi(port);
  }
  if (!v.empty()) e.host = v;
  if (e.host == "0.0.0.0") e.host = "127.0.0.1";  // the server's listen-on-all address; connect locally
  return e;
}

}  // namespace bp
