// `backprop doctor` engine: loads the embedded knowledge base, matches it against a log, extracts
// the numbers, runs the analyzers and builds the report (doctor.h). Rendering lives in
// doctor_render.cpp, the analyzers in doctor_analyzers.cpp.
//
// Matching: an entry matches when any of its patterns (or, for entries that explain catalog codes,
// an `[ERROR] [CODE]` line or a `"code": "CODE"` JSON field) occurs. Its numbers are read from the
// region that starts at the line of the first match and spans kRegionBytes, so the numbers of one
// message are read together even when the log repeats the message; counting modes read the whole
// log. Entries whose yield_to names another matched entry are dropped (a generic "CUDA error" gives
// way to "device-side assert"); the rest are ordered by rank (most specific first), then position.
#include "cli/doctor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include "cli/doctor_regex.h"
#include "core/error.h"

namespace bp::cli::doctor {

// ---- Regex ----------------------------------------------------------------------------------------

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* c =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), 0, &err, &offset, nullptr);
  if (!c) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    throw Error(ErrorCode::RUNTIME_INTERNAL,
                fmt::format("[doctor] data/troubleshooting.json: regex '{}' does not compile at offset {}: {}", pattern,
                            offset, reinterpret_cast<const char*>(msg)));
  }
  pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter is used if it fails
  code_.reset(c, Free{});
}

std::optional<RegexMatch> Regex::find(std::string_view text, size_t start) const {
  if (start > text.size()) return std::nullopt;
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
  int rc =
      pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0, md.get(), nullptr);
  if (rc < 0) return std::nullopt;  // no match (or a match-limit error on a pathological log)
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
  uint32_t pairs = pcre2_get_ovector_count(md.get());
  RegexMatch m;
  m.begin = ov[0];
  m.end = ov[1];
  for (uint32_t i = 1; i < pairs; ++i) {
    if (static_cast<int>(i) >= rc || ov[2 * i] == PCRE2_UNSET)
      m.groups.push_back(std::nullopt);
    else
      m.groups.push_back(text.substr(ov[2 * i], ov[2 * i + 1] - ov[2 * i]));
  }
  return m;
}

std::vector<RegexMatch> Regex::find_all(std::string_view text) const {
  std::vector<RegexMatch> out;
  size_t pos = 0;
  while (auto m = find(text, pos)) {
    out.push_back(*m);
    pos = m->end > m->begin ? m->end : m->begin + 1;
  }
  return out;
}

// ---- bytes ----------------------------------------------------------------------------------------

bool parse_bytes(std::string_view s, double* bytes, double* half_unit) {
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  size_t num_begin = i;
  int decimals = -1;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) {
    if (s[i] == '.')
      decimals = 0;
    else if (decimals >= 0)
      ++decimals;
    ++i;
  }
  if (i == num_begin) return false;
  double v = std::stod(std::string(s.substr(num_begin, i - num_begin)));
  while (i < s.size() && s[i] == ' ') ++i;
  std::string_view unit = s.substr(i);
  static const std::pair<const char*, double> kUnits[] = {{"bytes", 1.0},
                                                          {"KiB", 1024.0},
                                                          {"MiB", 1048576.0},
                                                          {"GiB", 1073741824.0},
                                                          {"TiB", 1099511627776.0},
                                                          {"PiB", 1125899906842624.0},
                                                          {"EiB", 1152921504606846976.0}};
  for (const auto& [name, mult] : kUnits) {
    if (unit.substr(0, std::string_view(name).size()) == name) {
      *bytes = v * mult;
      if (half_unit) *half_unit = 0.5 * std::pow(10.0, -std::max(decimals, 0)) * mult;
      return true;
    }
  }
  return false;
}

std::string bytes_text(double bytes) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double a = std::fabs(bytes);
  if (a < 1024.0) return fmt::format("{:.0f} bytes", bytes);
  double v = bytes / 1024.0;
  int u = 0;
  while (std::fabs(v) >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, kUnits[u]);
}

// ---- knowledge base -----------------------------------------------------------------------------

namespace {

constexpr size_t kRegionBytes = 4000;

struct NumberSpec {
  std::string name, type, mode, scope, meaning;
  Regex re;
};

struct Entry {
  nlohmann::json data;  // the entry as written in the data file (or built from the catalog)
  std::string id;
  int rank = 0;
  std::vector<Regex> patterns;
  std::vector<std::pair<std::string, Regex>> code_patterns;  // (code, regex)
  std::vector<std::string> yield_to;
  std::vector<NumberSpec> numbers;
  AnalyzerFn analyzer = nullptr;
};

struct Knowledge {
  nlohmann::json data;
  std::vector<Entry> entries;
};

std::string expand_macros(std::string s, const nlohmann::json& macros) {
  for (auto it = macros.begin(); it != macros.end(); ++it) {
    std::string key = "{" + it.key() + "}";
    std::string val = "(?:" + it.value().get<std::string>() + ")";
    for (size_t p = s.find(key); p != std::string::npos; p = s.find(key, p + val.size())) s.replace(p, key.size(), val);
  }
  return s;
}

std::string lower_dashed(std::string s) {
  for (auto& c : s) c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::pair<std::string, Regex>> code_regexes(const std::string& code) {
  std::vector<std::pair<std::string, Regex>> v;
  v.emplace_back(code, Regex("\\[ERROR\\] \\[" + code + "\\]"));
  v.emplace_back(code, Regex("\"code\"\\s*:\\s*\"" + code + "\""));
  return v;
}

// An entry for a catalog code no data entry explains: trigger, suggestion and the message.
nlohmann::json catalog_entry(const ErrorInfo& e) {
  std::string suggestion = e.suggestion;
  nlohmann::json flag = nullptr;
  if (auto p = suggestion.find("--"); p != std::string::npos) {
    size_t q = p + 2;
    while (q < suggestion.size() && (std::isalnum(static_cast<unsigned char>(suggestion[q])) || suggestion[q] == '-'))
      ++q;
    flag = suggestion.substr(p, q - p);
  }
  std::string code = e.name;
  return {{"id", "code-" + lower_dashed(code)},
          {"title", fmt::format("backprop error {} ({})", code, e.category)},
          {"rank", 50},
          {"codes", {code}},
          {"patterns", nlohmann::json::array()},
          {"numbers",
           {{{"name", "message"},
             {"type", "text"},
             {"regex", "(?:\\[ERROR\\] \\[" + code + "\\] ([^\\n]+)|\"message\"\\s*:\\s*\"((?:[^\"\\\\]|\\\\.)*)\")"},
             {"meaning", "the message backprop printed"}}}},
          {"what_happened", e.trigger},
          {"causes", {e.trigger}},
          {"fixes", {{{"text", suggestion}, {"flag", flag}}}},
          {"retryable", retryable_name(e.retryable)},
          {"from_catalog", true}};
}

Entry compile_entry(const nlohmann::json& d, const nlohmann::json& macros) {
  Entry e;
  e.data = d;
  e.id = d.at("id").get<std::string>();
  e.rank = d.value("rank", 0);
  for (const auto& p : d.value("patterns", nlohmann::json::array()))
    e.patterns.emplace_back(expand_macros(p.get<std::string>(), macros));
  for (const auto& c : d.value("codes", nlohmann::json::array())) {
    std::string code = c.get<std::string>();
    if (!find_error(code))
      throw Error(
          ErrorCode::RUNTIME_INTERNAL,
          fmt::format("[doctor] data/troubleshooting.json: entry '{}' names unknown error code {}", e.id, code));
    for (auto& cp : code_regexes(code)) e.code_patterns.push_back(std::move(cp));
  }
  for (const auto& y : d.value("yield_to", nlohmann::json::array())) e.yield_to.push_back(y.get<std::string>());
  for (const auto& n : d.value("numbers", nlohmann::json::array())) {
    std::string mode = n.value("mode", "first");
    std::string def_scope = (mode == "count" || mode == "distinct" || mode == "last") ? "log" : "message";
    e.numbers.push_back({n.at("name").get<std::string>(), n.at("type").get<std::string>(), mode,
                         n.value("scope", def_scope), n.value("meaning", ""),
                         Regex(expand_macros(n.at("regex").get<std::string>(), macros))});
  }
  if (d.contains("analyzer")) {
    std::string name = d.at("analyzer").get<std::string>();
    e.analyzer = find_analyzer(name);
    if (!e.analyzer)
      throw Error(
          ErrorCode::RUNTIME_INTERNAL,
          fmt::format("[doctor] data/troubleshooting.json: entry '{}' names unknown analyzer '{}'", e.id, name));
  }
  return e;
}

const Knowledge& knowledge() {
  static const Knowledge k = [] {
    Knowledge k;
    try {
      k.data = nlohmann::json::parse(knowledge_json());
    } catch (const nlohmann::json::exception& ex) {
      throw Error(ErrorCode::RUNTIME_INTERNAL, fmt::format("[doctor] data/troubleshooting.json: {}", ex.what()));
    }
    const auto& macros = k.data.value("macros", nlohmann::json::object());
    std::set<std::string> covered;
    for (const auto& d : k.data.at("entries")) {
      k.entries.push_back(compile_entry(d, macros));
      for (const auto& c : d.value("codes", nlohmann::json::array())) covered.insert(c.get<std::string>());
    }
    for (const auto& info : error_catalog())
      if (!covered.count(info.name)) k.entries.push_back(compile_entry(catalog_entry(info), macros));
    return k;
  }();
  return k;
}

size_t line_start(std::string_view text, size_t pos) {
  size_t p = text.rfind('\n', pos == 0 ? 0 : pos - 1);
  return (p == std::string_view::npos || pos == 0) ? 0 : p + 1;
}

nlohmann::json number_json(const NumberSpec& spec, std::string_view text, double value, int count) {
  nlohmann::json j = {{"text", std::string(text)}, {"meaning", spec.meaning}};
  if (spec.type == "bytes") {
    j["value"] = std::llround(value);
    j["unit"] = "bytes";
  } else if (spec.type == "int") {
    j["value"] = std::llround(value);
  } else if (spec.type == "number") {
    j["value"] = value;
  }
  if (spec.mode != "first" && spec.mode != "last") j["count"] = count;
  return j;
}

// Reads one number; null when absent.
nlohmann::json extract_number(const NumberSpec& spec, std::string_view text, std::string_view region) {
  std::string_view scope = spec.scope == "log" ? text : region;
  auto value_of = [&](std::string_view s, double* v) -> bool {
    if (spec.type == "bytes") return parse_bytes(s, v);
    if (spec.type == "int" || spec.type == "number") {
      try {
        *v = std::stod(std::string(s));
        return true;
      } catch (...) {
        return false;
      }
    }
    *v = 0;
    return true;
  };
  if (spec.mode == "first" || spec.mode == "last") {
    std::optional<RegexMatch> m;
    if (spec.mode == "first") {
      m = spec.re.find(scope);
    } else {
      auto all = spec.re.find_all(scope);
      if (!all.empty()) m = all.back();
    }
    if (!m || !m->first_group()) return nullptr;
    double v = 0;
    if (!value_of(*m->first_group(), &v)) return nullptr;
    return number_json(spec, *m->first_group(), v, 1);
  }
  // count / distinct / sum over all matches in scope
  auto all = spec.re.find_all(scope);
  if (all.empty()) return nullptr;
  std::set<std::string> distinct;
  double sum = 0;
  std::string texts;
  for (const auto& m : all) {
    auto g = m.first_group();
    if (!g) continue;
    double v = 0;
    if (!value_of(*g, &v)) continue;
    sum += v;
    if (distinct.insert(std::string(*g)).second) texts += (texts.empty() ? "" : ", ") + std::string(*g);
  }
  int count = static_cast<int>(all.size());
  if (spec.mode == "count") return number_json(spec, std::to_string(count), count, count);
  if (spec.mode == "distinct")
    return number_json(spec, texts, static_cast<double>(distinct.size()), static_cast<int>(distinct.size()));
  // sum
  std::string shown = spec.type == "bytes" ? bytes_text(sum) : fmt::format("{}", sum);
  return number_json(spec, shown + " (sum of " + texts + ")", sum, count);
}

struct Match {
  const Entry* entry;
  size_t pos;
  std::string code;
};

}  // namespace

nlohmann::json diagnose(std::string_view text) {
  const Knowledge& k = knowledge();
  std::vector<Match> found;
  for (const auto& e : k.entries) {
    std::optional<size_t> best;
    std::string code;
    for (const auto& re : e.patterns)
      if (auto m = re.find(text); m && (!best || m->begin < *best)) best = m->begin;
    for (const auto& [c, re] : e.code_patterns)
      if (auto m = re.find(text)) {
        if (!best || m->begin < *best) best = m->begin;
        if (code.empty()) code = c;
      }
    if (best) found.push_back({&e, *best, code});
  }
  std::set<std::string> matched_ids;
  for (const auto& m : found) matched_ids.insert(m.entry->id);
  std::erase_if(found, [&](const Match& m) {
    return std::any_of(m.entry->yield_to.begin(), m.entry->yield_to.end(),
                       [&](const std::string& y) { return matched_ids.count(y) > 0; });
  });
  std::stable_sort(found.begin(), found.end(), [](const Match& a, const Match& b) {
    return a.entry->rank != b.entry->rank ? a.entry->rank > b.entry->rank : a.pos < b.pos;
  });

  nlohmann::json matches = nlohmann::json::array();
  for (const auto& m : found) {
    const Entry& e = *m.entry;
    size_t ls = line_start(text, m.pos);
    std::string_view region = text.substr(ls, kRegionBytes);
    size_t le = text.find('\n', m.pos);
    std::string evidence(text.substr(ls, (le == std::string_view::npos ? text.size() : le) - ls));
    if (evidence.size() > 300) evidence = evidence.substr(0, 297) + "...";
    nlohmann::json numbers = nlohmann::json::object();
    for (const auto& spec : e.numbers)
      if (auto n = extract_number(spec, text, region); !n.is_null()) numbers[spec.name] = n;

    AnalyzerOutput out;
    if (e.analyzer) {
      nlohmann::json params = e.data.value("params", nlohmann::json(nullptr));
      e.analyzer(AnalyzerInput{text, region, numbers, params}, out);
      for (auto it = out.derived.begin(); it != out.derived.end(); ++it) {
        nlohmann::json n = it.value();
        n["derived"] = true;
        numbers[it.key()] = n;
      }
    }
    nlohmann::json fixes = nlohmann::json::array();
    for (const auto& f : e.data.value("fixes", nlohmann::json::array())) {
      if (f.contains("when") && e.analyzer && !out.tags.count(f.at("when").get<std::string>())) continue;
      fixes.push_back({{"text", f.at("text")}, {"flag", f.value("flag", nlohmann::json(nullptr))}});
    }
    nlohmann::json j = {{"id", e.id},
                        {"title", e.data.at("title")},
                        {"code", m.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(m.code)},
                        {"line", std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(m.pos), '\n') + 1},
                        {"evidence", evidence},
                        {"what_happened", e.data.at("what_happened")},
                        {"causes", e.data.at("causes")},
                        {"numbers", numbers},
                        {"analysis", out.lines},
                        {"verdict", out.verdict.empty() ? nlohmann::json(nullptr) : nlohmann::json(out.verdict)},
                        {"fixes", fixes}};
    if (e.data.contains("retryable")) j["retryable"] = e.data.at("retryable");
    matches.push_back(j);
  }
  return {{"recognised", !matches.empty()},
          {"input_bytes", text.size()},
          {"input_lines", text.empty() ? 0 : std::count(text.begin(), text.end(), '\n') + (text.back() != '\n')},
          {"matches", matches},
          {"generic_first_steps", k.data.value("generic_first_steps", nlohmann::json::array())}};
}

// Used by doctor_render.cpp to document every entry (data entries, then catalog-built ones).
std::vector<nlohmann::json> knowledge_entries_for_docs() {
  std::vector<nlohmann::json> v;
  for (const auto& e : knowledge().entries) v.push_back(e.data);
  return v;
}
const nlohmann::json& knowledge_data_for_docs() {
  return knowledge().data;
}

}  // namespace bp::cli::doctor
