// `backprop doctor` output: the human-readable report and docs/troubleshooting.md (doctor.h).
#include <fmt/format.h>

#include <cctype>

#include "cli/doctor.h"

namespace bp::cli::doctor {

namespace {

std::string flag_suffix(const nlohmann::json& fix) {
  if (!fix.contains("flag") || fix.at("flag").is_null()) return "";
  return fmt::format("  [{}]", fix.at("flag").get<std::string>());
}

std::string md_escape_pipes(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out;
}

}  // namespace

std::string render_text(const nlohmann::json& report) {
  std::string s;
  const auto& matches = report.at("matches");
  if (matches.empty()) {
    s += fmt::format(
        "backprop doctor: not recognised. Nothing in the input ({} line{}) matches a known problem.\n\n"
        "Generic first steps:\n",
        report.at("input_lines").get<long long>(), report.at("input_lines").get<long long>() == 1 ? "" : "s");
    int i = 1;
    for (const auto& step : report.at("generic_first_steps"))
      s += fmt::format("  {}. {}\n", i++, step.get<std::string>());
    return s;
  }
  s += fmt::format("backprop doctor: {} problem{} recognised (most specific first).\n", matches.size(),
                   matches.size() == 1 ? "" : "s");
  int k = 1;
  for (const auto& m : matches) {
    s += fmt::format("\n{}. {}  [{}]\n", k++, m.at("title").get<std::string>(), m.at("id").get<std::string>());
    if (!m.at("code").is_null()) s += fmt::format("   backprop error code: {}\n", m.at("code").get<std::string>());
    s += fmt::format("   Line {}: {}\n", m.at("line").get<long long>(), m.at("evidence").get<std::string>());
    s += fmt::format("\n   What happened: {}\n", m.at("what_happened").get<std::string>());
    if (!m.at("numbers").empty()) {
      s += "\n   Numbers found:\n";
      for (auto it = m.at("numbers").begin(); it != m.at("numbers").end(); ++it) {
        const auto& n = it.value();
        s += fmt::format("     {:<24} {:<16} {}{}\n", it.key(), n.at("text").get<std::string>(),
                         n.at("meaning").get<std::string>(), n.value("derived", false) ? " (computed)" : "");
      }
    }
    if (!m.at("analysis").empty()) {
      s += "\n   Analysis:\n";
      for (const auto& line : m.at("analysis")) s += fmt::format("     - {}\n", line.get<std::string>());
    }
    s += "\n   Likely causes (most likely first):\n";
    int i = 1;
    for (const auto& c : m.at("causes")) s += fmt::format("     {}. {}\n", i++, c.get<std::string>());
    s += "\n   Fixes (least effort first):\n";
    i = 1;
    for (const auto& f : m.at("fixes"))
      s += fmt::format("     {}. {}{}\n", i++, f.at("text").get<std::string>(), flag_suffix(f));
  }
  return s;
}

std::string troubleshooting_markdown() {
  const auto& data = knowledge_data_for_docs();
  std::string s =
      "# Troubleshooting\n\n"
      "<!-- Generated from data/troubleshooting.json and src/core/error_catalog.inc by\n"
      "     `backprop doctor --markdown`; do not edit by hand (a test fails when this file is stale). -->\n\n"
      "`backprop doctor [FILE|-] [--json]` reads an error message or a whole log — from backprop, PyTorch,\n"
      "Hugging Face, CUDA, NCCL, XLA or Ollama — and answers what happened, the likely causes ranked, the\n"
      "numbers it found and what they mean, and the fixes in order of effort with the matching backprop\n"
      "flags. This page is the same knowledge, one section per problem it recognises.\n\n"
      "## When nothing is recognised\n\n";
  int i = 1;
  for (const auto& step : data.value("generic_first_steps", nlohmann::json::array()))
    s += fmt::format("{}. {}\n", i++, step.get<std::string>());
  auto entries = knowledge_entries_for_docs();
  s += "\n## Problems\n\n| Problem | id |\n|---|---|\n";
  for (const auto& e : entries)
    if (!e.value("from_catalog", false))
      s += fmt::format("| [{}](#{}) | `{}` |\n", md_escape_pipes(e.at("title").get<std::string>()),
                       e.at("id").get<std::string>(), e.at("id").get<std::string>());
  for (const auto& e : entries) {
    if (e.value("from_catalog", false)) continue;
    s +=
        fmt::format("\n<a id=\"{}\"></a>\n### {}\n\n", e.at("id").get<std::string>(), e.at("title").get<std::string>());
    s += fmt::format("{}\n\n", e.at("what_happened").get<std::string>());
    if (e.contains("codes") && !e.at("codes").empty()) {
      s += "backprop error codes:";
      for (const auto& c : e.at("codes"))
        s += fmt::format(" [`{0}`](errors.md#{1})", c.get<std::string>(), [&] {
          std::string a = c.get<std::string>();
          for (auto& ch : a) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
          return a;
        }());
      s += "\n\n";
    }
    s += "Recognised by:\n\n";
    for (const auto& p : e.value("patterns", nlohmann::json::array()))
      s += fmt::format("- `{}`\n", md_escape_pipes(p.get<std::string>()));
    if (!e.value("numbers", nlohmann::json::array()).empty()) {
      s += "\nNumbers it reads:\n\n";
      for (const auto& n : e.at("numbers"))
        s += fmt::format("- `{}`: {}\n", n.at("name").get<std::string>(), n.value("meaning", ""));
    }
    if (e.contains("analyzer"))
      s += fmt::format("\nAnalyzer: `{}` (src/cli/doctor_analyzers.cpp).\n", e.at("analyzer").get<std::string>());
    s += "\nLikely causes, most likely first:\n\n";
    i = 1;
    for (const auto& c : e.at("causes")) s += fmt::format("{}. {}\n", i++, c.get<std::string>());
    s += "\nFixes, least effort first:\n\n";
    i = 1;
    for (const auto& f : e.at("fixes")) {
      std::string when = f.contains("when") ? fmt::format(" *(when: {})*", f.at("when").get<std::string>()) : "";
      std::string flag =
          f.contains("flag") && !f.at("flag").is_null() ? fmt::format(" — `{}`", f.at("flag").get<std::string>()) : "";
      s += fmt::format("{}. {}{}{}\n", i++, f.at("text").get<std::string>(), flag, when);
    }
  }
  s += "\n## backprop's own error codes\n\n"
       "Every code of the error catalog is recognised in `[ERROR] [CODE] message` lines and in JSON\n"
       "envelopes (`{\"code\": \"CODE\", ...}`). Codes explained by a section above are listed there; the\n"
       "others are answered from the catalog ([errors.md](errors.md)):\n\n"
       "| Code | What happened | What to do |\n|---|---|---|\n";
  for (const auto& e : entries)
    if (e.value("from_catalog", false))
      s += fmt::format("| `{}` | {} | {} |\n", e.at("codes").at(0).get<std::string>(),
                       md_escape_pipes(e.at("what_happened").get<std::string>()),
                       md_escape_pipes(e.at("fixes").at(0).at("text").get<std::string>()));
  return s;
}

}  // namespace bp::cli::doctor
