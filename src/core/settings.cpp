// Settings: parsing, validation and layering of the values in settings_registry.inc.
// Every layer goes through parse_text() (or a typed TOML path that ends in the same checks), so a
// value is accepted or rejected the same way whether it came from TOML, the environment or a flag.
#include "core/settings.h"

#include <fmt/format.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_read.h"
#include "core/redact.h"

extern char** environ;

namespace bp {

namespace {

constexpr std::string_view kEnvPrefix = "BACKPROPAGATE_";

std::string lower(std::string_view s) {
  std::string r(s);
  for (auto& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

[[noreturn]] void unknown_key(std::string_view key, const std::string& where) {
  std::string best;
  size_t best_d = 4;
  for (const auto& s : settings_registry()) {
    size_t d = edit_distance(key, s.key);
    if (d < best_d) best_d = d, best = s.key;
  }
  std::string hint = best.empty() ? "" : fmt::format("; did you mean {}?", best);
  throw Error(ErrorCode::CONFIG_INVALID_SETTING,
              fmt::format("[settings] unknown setting '{}' in {}{} (`backprop info --env-vars` lists every setting)",
                          key, where, hint),
              {{"key", std::string(key)}, {"source", where}, {"did_you_mean", best}});
}

std::string source_text(SettingSource source, const SettingSpec& spec, const std::string& origin) {
  switch (source) {
    case SettingSource::Default: return "the built-in default";
    case SettingSource::Preset: return "the preset";
    case SettingSource::Toml: return "config file " + origin;
    case SettingSource::Env: return "environment variable " + setting_env_var(spec);
    case SettingSource::Flag: return spec.flag[0] ? fmt::format("flag {}", spec.flag) : "the command line";
  }
  return "?";
}

[[noreturn]] void bad_value(const SettingSpec& spec, std::string_view text, SettingSource source,
                            const std::string& origin, const std::string& reason = "") {
  std::string shown = spec.secret ? "***" : std::string(text);
  throw Error(ErrorCode::CONFIG_INVALID_SETTING,
              fmt::format("[settings] invalid value '{}' for {} (from {}): {}{}", shown, spec.key,
                          source_text(source, spec, origin), reason.empty() ? "" : reason + "; ",
                          "allowed: " + setting_allowed_text(spec)),
              {{"key", spec.key},
               {"value", shown},
               {"allowed", setting_allowed_text(spec)},
               {"source", setting_source_name(source)}});
}

std::optional<bool> parse_bool(std::string_view text) {
  std::string t = lower(text);
  if (t == "true" || t == "1" || t == "yes") return true;
  if (t == "false" || t == "0" || t == "no") return false;
  return std::nullopt;
}

// The whole text as an integer of type T (an optional leading '+'); nullopt when malformed or out of T's range.
template <class T>
std::optional<T> parse_integer(std::string_view text) {
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  T v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}
std::optional<int64_t> parse_int(std::string_view text) {
  return parse_integer<int64_t>(text);
}
std::optional<uint64_t> parse_uint(std::string_view text) {
  return parse_integer<uint64_t>(text);
}

// An Int setting that spans the whole uint64 range (a seed): stored as the bits of Value::i.
bool is_uint64_setting(const SettingSpec& spec) {
  return spec.type == SettingType::Int && spec.min >= 0 && spec.max >= 1.8e19;
}

std::optional<double> parse_float(std::string_view text) {
  std::string t(text);
  if (t.empty()) return std::nullopt;
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

bool in_choices(const SettingSpec& spec, std::string_view v) {
  std::string_view c = spec.choices;
  while (!c.empty()) {
    size_t bar = c.find('|');
    if (c.substr(0, bar) == v) return true;
    if (bar == std::string_view::npos) break;
    c.remove_prefix(bar + 1);
  }
  return false;
}

std::optional<uint64_t> try_parse_bytes(std::string_view text) {
  if (text.empty()) return std::nullopt;
  uint64_t mult = 1;
  char last = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
  if (last == 'B' && text.size() >= 2 && std::isalpha(static_cast<unsigned char>(text[text.size() - 2]))) {
    text.remove_suffix(1);  // "8GB" == "8G"
    last = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
  }
  const char* units = "KMGT";
  if (const char* u = std::strchr(units, last); u && last) {
    mult = uint64_t{1} << (10 * (u - units + 1));
    text.remove_suffix(1);
  }
  auto f = parse_float(text);
  if (!f || *f < 0 || *f * static_cast<double>(mult) > 1.8e19) return std::nullopt;
  return static_cast<uint64_t>(std::llround(*f * static_cast<double>(mult)));
}

}  // namespace

// An Enum of exactly auto|true|false: a boolean with an automatic default. Its flag works like a
// boolean's (--x, --no-x) and also takes =auto.
bool is_auto_bool(const SettingSpec& spec) {
  return spec.type == SettingType::Enum && std::string_view(spec.choices) == "auto|true|false";
}

bool is_testing_setting(const SettingSpec& spec) {
  return std::string_view(spec.help).starts_with("Testing:");
}

const SettingSpec* find_setting(std::string_view key) {
  for (const auto& s : settings_registry())
    if (key == s.key) return &s;
  return nullptr;
}

std::string setting_env_var(const SettingSpec& spec) {
  std::string k = spec.key;
  size_t dot = k.find('.');
  std::string name = std::string(kEnvPrefix) + k.substr(0, dot) + "__" + k.substr(dot + 1);
  for (auto& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

const char* setting_type_name(SettingType t) {
  switch (t) {
    case SettingType::Bool: return "bool";
    case SettingType::Int: return "int";
    case SettingType::Float: return "float";
    case SettingType::String: return "string";
    case SettingType::Enum: return "enum";
  }
  return "?";
}

const char* setting_source_name(SettingSource s) {
  switch (s) {
    case SettingSource::Default: return "default";
    case SettingSource::Preset: return "preset";
    case SettingSource::Toml: return "toml";
    case SettingSource::Env: return "env";
    case SettingSource::Flag: return "flag";
  }
  return "?";
}

std::string setting_allowed_text(const SettingSpec& spec) {
  switch (spec.type) {
    case SettingType::Bool: return "true|false|1|0|yes|no";
    case SettingType::Int:
      if (is_uint64_setting(spec)) return fmt::format("an integer from {} to {}", spec.min, UINT64_MAX);
      if (spec.max >= 9e18) return fmt::format("an integer >= {}", spec.min);
      return fmt::format("an integer from {} to {}", spec.min, static_cast<int64_t>(spec.max));
    case SettingType::Float: return fmt::format("a number from {} to {}", spec.min, spec.max);
    case SettingType::Enum: return fmt::format("one of {}", spec.choices);
    case SettingType::String:
      switch (spec.rule) {
        case StringRule::Any: return "any text";
        case StringRule::AutoOrPositiveInt: return "auto or an integer >= 1";
        case StringRule::AutoOrBytes:
          if (spec.min > 0)
            return fmt::format("auto, none or a size of at least {} byte(s), such as 512M, 8G", spec.min);
          return "auto, none or a size such as 512M, 8G, 1073741824";
        case StringRule::Device: return "auto, cpu, cuda or cuda:N";
        case StringRule::UserPass: return "empty or user:password";
        case StringRule::Bytes: return "a size such as 512K, 64M, 1G, 1073741824";
        case StringRule::JsonObject: return "empty or a JSON object such as {\"enable_thinking\": false}";
      }
  }
  return "?";
}

namespace {
// One table row; the Testing section mixes sections, so it names the full key.
std::string markdown_row(const SettingSpec& s, bool full_key) {
  std::string key = s.key;
  std::string allowed = setting_allowed_text(s);
  for (size_t p = 0; (p = allowed.find('|', p)) != std::string::npos; p += 2) allowed.replace(p, 1, "\\|");
  return fmt::format("| `{}` | `{}` | {} | {} | `{}` | {} | {} |\n", full_key ? key : key.substr(key.find('.') + 1),
                     setting_env_var(s), s.flag[0] ? fmt::format("`{}`", s.flag) : "", setting_type_name(s.type),
                     s.default_value, allowed, s.help);
}
constexpr const char* kMarkdownTableHead =
    "| Key | Variable | Flag | Type | Default | Allowed | Description |\n|---|---|---|---|---|---|---|\n";
}  // namespace

std::string settings_markdown() {
  std::string md =
      "# Settings\n\n"
      "<!-- Generated from src/core/settings_registry.inc by `backprop info --env-vars --markdown`;\n"
      "     do not edit by hand (a test fails when this file is stale). -->\n\n"
      "Every setting has a key (`section.key`, used in the TOML file given with `--config`), an\n"
      "environment variable and usually a command-line flag. Later layers win: defaults < TOML file <\n"
      "environment < flags. Booleans accept true/false/1/0/yes/no (flags: `--x`, `--x=false`, `--no-x`).\n"
      "Unknown keys, wrong types and out-of-range values fail with `CONFIG_INVALID_SETTING`.\n";
  std::string section;
  for (const auto& s : settings_registry()) {
    if (is_testing_setting(s)) continue;
    std::string key = s.key;
    std::string sec = key.substr(0, key.find('.'));
    if (sec != section) {
      section = sec;
      md += fmt::format("\n## [{}]\n\n{}", section, kMarkdownTableHead);
    }
    md += markdown_row(s, false);
  }
  md +=
      "\n## Testing\n\n"
      "Test aids (fault injection, a fake `/proc`): settings like any other (TOML, environment, flag), but\n"
      "their flags are not listed in `--help`.\n\n";
  md += kMarkdownTableHead;
  for (const auto& s : settings_registry())
    if (is_testing_setting(s)) md += markdown_row(s, true);
  return md;
}

uint64_t parse_byte_size(std::string_view text, std::string_view key) {
  auto v = try_parse_bytes(text);
  if (!v)
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[settings] '{}' for {} is not a size (use e.g. 512M, 8G, 1073741824)", text, key),
                {{"key", std::string(key)}, {"value", std::string(text)}});
  return *v;
}

Environment current_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

// ---- Settings ------------------------------------------------------------------------------------

namespace {
// Parses and checks one value. `origin` names the file for TOML values (used in messages).
void parse_into(const SettingSpec& spec, std::string_view text, SettingSource source, const std::string& origin,
                bool& b, int64_t& i, double& f, std::string& s) {
  switch (spec.type) {
    case SettingType::Bool: {
      auto v = parse_bool(text);
      if (!v) bad_value(spec, text, source, origin, "not a boolean");
      b = *v;
      return;
    }
    case SettingType::Int: {
      if (is_uint64_setting(spec)) {
        auto u = parse_uint(text);
        if (!u) bad_value(spec, text, source, origin, parse_int(text) ? "out of range" : "not an integer");
        if (static_cast<double>(*u) < spec.min) bad_value(spec, text, source, origin, "out of range");
        i = static_cast<int64_t>(*u);  // the bits; get_uint reads them back
        return;
      }
      auto v = parse_int(text);
      if (!v) bad_value(spec, text, source, origin, "not an integer");
      if (static_cast<double>(*v) < spec.min || static_cast<double>(*v) > spec.max)
        bad_value(spec, text, source, origin, "out of range");
      i = *v;
      return;
    }
    case SettingType::Float: {
      auto v = parse_float(text);
      if (!v) bad_value(spec, text, source, origin, "not a number");
      if (*v < spec.min || *v > spec.max) bad_value(spec, text, source, origin, "out of range");
      f = *v;
      return;
    }
    case SettingType::Enum:
      if (is_auto_bool(spec) && !in_choices(spec, text)) {  // auto|true|false also takes 1/0/yes/no
        if (auto v = parse_bool(text)) {
          s = *v ? "true" : "false";
          return;
        }
      }
      if (!in_choices(spec, text)) bad_value(spec, text, source, origin, "not a known choice");
      s = std::string(text);
      return;
    case SettingType::String: {
      bool ok = true;
      switch (spec.rule) {
        case StringRule::Any: break;
        case StringRule::AutoOrPositiveInt: {
          auto v = parse_int(text);
          ok = text == "auto" || (v && *v >= 1);
          break;
        }
        case StringRule::AutoOrBytes: {  // a row's min (e.g. 1 for a memory budget) refuses smaller sizes
          auto v = try_parse_bytes(text);
          ok = text == "auto" || text == "none" || (v && static_cast<double>(*v) >= spec.min);
          break;
        }
        case StringRule::Bytes: ok = try_parse_bytes(text).has_value(); break;
        case StringRule::JsonObject: {
          const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
          ok = text.empty() || (!j.is_discarded() && j.is_object());
          break;
        }
        case StringRule::Device: {
          ok = text == "auto" || text == "cpu" || text == "cuda";
          if (!ok && text.substr(0, 5) == "cuda:") {
            auto n = parse_int(text.substr(5));
            ok = n && *n >= 0;
          }
          break;
        }
        case StringRule::UserPass: {
          size_t colon = text.find(':');
          ok = text.empty() || (colon != std::string_view::npos && colon > 0 && colon + 1 < text.size());
          break;
        }
      }
      if (!ok) bad_value(spec, text, source, origin);
      s = std::string(text);
      return;
    }
  }
}
}  // namespace

Settings::Settings() {
  for (const auto& spec : settings_registry()) set(spec.key, spec.default_value, SettingSource::Default);
}

Settings Settings::load(const std::string& config_path, const Environment& env,
                        const std::vector<SettingOverride>& flags) {
  {
    // The --config file is read under the environment's caps (limits.*), before its own are known.
    Settings env_only;
    env_only.apply_environment(env);
    apply_file_read_limits(env_only);
  }
  Settings s;
  if (!config_path.empty()) s.apply_toml_file(config_path);
  s.apply_environment(env);
  for (const auto& o : flags) s.set(o.key, o.text, SettingSource::Flag);
  apply_file_read_limits(s);
  return s;
}

void apply_file_read_limits(const Settings& s) {
  FileReadLimits& l = file_read_limits();
  for (FileKind kind : {FileKind::Config, FileKind::Tokenizer, FileKind::Dataset}) {
    const char* key = file_read_cap_setting(kind);
    const uint64_t bytes = parse_byte_size(s.get_string(key), key);
    (kind == FileKind::Config      ? l.config_bytes
     : kind == FileKind::Tokenizer ? l.tokenizer_bytes
                                   : l.dataset_bytes) = bytes;
  }
}

void Settings::set(std::string_view key, std::string_view text, SettingSource source) {
  const SettingSpec* spec = find_setting(key);
  if (!spec) unknown_key(key, source == SettingSource::Flag ? "the command line" : setting_source_name(source));
  Value v;
  parse_into(*spec, text, source, "", v.b, v.i, v.f, v.s);
  v.source = source;
  store(*spec, std::move(v));
}

void Settings::store(const SettingSpec& spec, Value v) {
  values_[spec.key] = std::move(v);
}

void Settings::apply_environment(const Environment& env) {
  for (const auto& [name, text] : env) {
    if (name.compare(0, kEnvPrefix.size(), kEnvPrefix) != 0) continue;
    std::string rest = name.substr(kEnvPrefix.size());
    size_t sep = rest.find("__");
    std::string key =
        sep == std::string::npos ? lower(rest) : lower(rest.substr(0, sep)) + "." + lower(rest.substr(sep + 2));
    const SettingSpec* spec = find_setting(key);
    if (!spec || setting_env_var(*spec) != name)
      unknown_key(key, "environment variable " + name + " (expected BACKPROPAGATE_<SECTION>__<KEY>)");
    Value v;
    parse_into(*spec, text, SettingSource::Env, "", v.b, v.i, v.f, v.s);
    v.source = SettingSource::Env;
    store(*spec, std::move(v));
  }
}

void Settings::apply_toml_file(const std::string& path) {
  // A folder, FIFO or device is refused by the shared reader (INPUT_FILE_NOT_REGULAR), as for every file.
  apply_toml_string(read_file_capped(path, FileKind::Config, {"settings", ErrorCode::CONFIG_INVALID}), path);
}

namespace {
// A TOML value as text for parse_into, after checking that its TOML type fits the setting's type.
std::string toml_value_text(const SettingSpec& spec, const toml::node& node, const std::string& origin) {
  auto wrong_type = [&](const char* got) {
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[settings] {} in {} is a TOML {}, but it must be {} ({})", spec.key, origin, got,
                            setting_type_name(spec.type), setting_allowed_text(spec)),
                {{"key", spec.key}, {"value_type", got}, {"allowed", setting_allowed_text(spec)}, {"source", "toml"}});
  };
  if (auto v = node.as_string()) return v->get();
  if (auto v = node.as_boolean()) {
    if (spec.type != SettingType::Bool && !is_auto_bool(spec)) wrong_type("boolean");
    return v->get() ? "true" : "false";
  }
  if (auto v = node.as_integer()) {
    if (spec.type == SettingType::Enum || (spec.type == SettingType::String && spec.rule == StringRule::Any))
      wrong_type("integer");
    return std::to_string(v->get());
  }
  if (auto v = node.as_floating_point()) {
    if (spec.type != SettingType::Float) wrong_type("float");
    return fmt::format("{}", v->get());
  }
  wrong_type(node.is_table() ? "table" : node.is_array() ? "array" : "date/time");
  return {};
}
}  // namespace

void Settings::apply_toml_string(std::string_view toml_text, const std::string& origin) {
  toml::table tbl;
  try {
    tbl = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw Error(ErrorCode::CONFIG_INVALID,
                fmt::format("[settings] {}:{}:{}: {}", origin, where.line, where.column, std::string(e.description())),
                {{"file", origin}, {"line", where.line}, {"column", where.column}});
  }
  for (const auto& [section_key, section_node] : tbl) {
    std::string section(section_key.str());
    const toml::table* section_tbl = section_node.as_table();
    if (!section_tbl) unknown_key(section, "config file " + origin + " (settings live in [section] tables)");
    for (const auto& [k, node] : *section_tbl) {
      std::string key = section + "." + std::string(k.str());
      const SettingSpec* spec = find_setting(key);
      if (!spec) unknown_key(key, "config file " + origin);
      Value v;
      parse_into(*spec, toml_value_text(*spec, node, origin), SettingSource::Toml, origin, v.b, v.i, v.f, v.s);
      v.source = SettingSource::Toml;
      store(*spec, std::move(v));
    }
  }
}

const Settings::Value& Settings::value(std::string_view key, SettingType want) const {
  const SettingSpec* spec = find_setting(key);
  BP_CHECK(spec, "[settings] no setting named '{}' in the registry", key);
  bool ok = spec->type == want || (want == SettingType::String && spec->type == SettingType::Enum);
  BP_CHECK(ok, "[settings] {} is a {}, read as {}", key, setting_type_name(spec->type), setting_type_name(want));
  auto it = values_.find(key);
  BP_CHECK(it != values_.end(), "[settings] {} has no value", key);
  return it->second;
}

bool Settings::get_bool(std::string_view key) const {
  return value(key, SettingType::Bool).b;
}
int64_t Settings::get_int(std::string_view key) const {
  const SettingSpec* spec = find_setting(key);
  const int64_t v = value(key, SettingType::Int).i;
  BP_CHECK(!spec || !is_uint64_setting(*spec) || v >= 0, "[settings] {} is {}, past int64: read it with get_uint", key,
           static_cast<uint64_t>(v));
  return v;
}
uint64_t Settings::get_uint(std::string_view key) const {
  return static_cast<uint64_t>(value(key, SettingType::Int).i);
}
double Settings::get_float(std::string_view key) const {
  return value(key, SettingType::Float).f;
}
const std::string& Settings::get_string(std::string_view key) const {
  return value(key, SettingType::String).s;
}

SettingSource Settings::source(std::string_view key) const {
  auto it = values_.find(key);
  BP_CHECK(it != values_.end(), "[settings] no setting named '{}' in the registry", key);
  return it->second.source;
}

std::string Settings::text(std::string_view key, bool reveal_secrets) const {
  const SettingSpec* spec = find_setting(key);
  BP_CHECK(spec, "[settings] no setting named '{}' in the registry", key);
  const Value& v = values_.find(key)->second;
  switch (spec->type) {
    case SettingType::Bool: return v.b ? "true" : "false";
    case SettingType::Int:
      return is_uint64_setting(*spec) ? std::to_string(static_cast<uint64_t>(v.i)) : std::to_string(v.i);
    case SettingType::Float: return fmt::format("{}", v.f);
    default:
      if (reveal_secrets) return v.s;
      // Secrets are masked whole; any other text loses what redact() finds in it (a password in
      // a URL such as --ollama-host http://user:pass@host), also in the run's settings.json.
      return spec->secret && !v.s.empty() ? "***" : redact(v.s);
  }
}

nlohmann::json Settings::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& spec : settings_registry()) {
    std::string key = spec.key;
    size_t dot = key.find('.');
    auto& slot = j[key.substr(0, dot)][key.substr(dot + 1)];
    switch (spec.type) {
      case SettingType::Bool: slot = get_bool(key); break;
      case SettingType::Int:
        if (is_uint64_setting(spec))
          slot = get_uint(key);
        else
          slot = get_int(key);
        break;
      case SettingType::Float: slot = get_float(key); break;
      default: slot = text(key); break;
    }
  }
  return j;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto b = item.find_first_not_of(" \t");
    auto e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

}  // namespace bp
