// The model card of a push (see model_card.h).
#include "export/model_card.h"

#include <fmt/format.h>

#include <filesystem>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "build_info.h"
#include "core/error.h"
#include "core/file_read.h"
#include "core/settings.h"
#include "hub/hf_cache.h"
#include "io/sha256.h"
#include "train/run_history.h"

namespace bp {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The sections `backprop train` reads (settings_registry.inc): the rest (export, ui, ...) never
// changes what a run trains.
const std::set<std::string> kTrainSections = {"model", "lora", "training", "data", "monitor"};

std::string shell_quote(const std::string& s) {
  static const std::regex plain(R"(^[A-Za-z0-9_./:=@%+,-]+$)");
  if (!s.empty() && std::regex_match(s, plain)) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A value for a Markdown table cell: no line breaks or pipes.
std::string cell(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string fmt_number(const json& v) {
  if (!v.is_number()) return v.is_null() ? "-" : cell(v.dump());
  return fmt::format("{:.4g}", v.get<double>());
}

// "hf://datasets/org/name/path@rev" -> "org/name".
std::string hub_dataset_of(const std::string& data) {
  static const std::regex re(R"(^hf://datasets/([A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*)(/|@|$))");
  std::smatch m;
  return std::regex_search(data, m, re) ? m[1].str() : "";
}

std::string setting_of(const json& settings, const char* sec, const char* key) {
  if (!settings.contains(sec) || !settings[sec].is_object() || !settings[sec].contains(key)) return "";
  const json& v = settings[sec][key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

void section_usage(const ModelCardInput& in, std::string& md) {
  const std::string base = in.base_model_id.empty() ? "<base model>" : in.base_model_id;
  md += "## How to use\n\n";
  if (in.format == "lora") {
    md += fmt::format(
        "A LoRA adapter (PEFT format) for `{}`.\n\n```python\nfrom peft import AutoPeftModelForCausalLM\nmodel = "
        "AutoPeftModelForCausalLM.from_pretrained(\"{}\")\n```\n\nWith backprop: `backprop generate --model {} "
        "--adapter <downloaded folder> --prompt \"...\"`.\n\n",
        base, in.repo_id, base);
  } else if (in.format == "merged") {
    md += fmt::format(
        "The base model `{}` with the LoRA adapter merged into its weights (Hugging Face transformers "
        "format).\n\n```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\nmodel = "
        "AutoModelForCausalLM.from_pretrained(\"{}\")\ntokenizer = AutoTokenizer.from_pretrained(\"{}\")\n```\n\n",
        base, in.repo_id, in.repo_id);
  } else {
    md += fmt::format(
        "A GGUF file for llama.cpp and Ollama{}. The Modelfile beside it registers it with Ollama: download both, "
        "then `ollama create <name> -f <file>.Modelfile`.\n\n",
        in.format == "gguf-lora" ? fmt::format(" (a LoRA adapter over `{}`: llama.cpp --lora)", base) : "");
  }
}

void section_training(const json& settings, const json& summary, std::string& md) {
  md += "## Training\n\n";
  if (settings.empty()) {
    md += "The export's input was not a backprop run folder, so its training settings are unknown.\n\n";
    return;
  }
  const std::string method = setting_of(settings, "training", "method");
  md += fmt::format("Trained with backprop (`{}`{}).\n\n", method.empty() ? "sft" : method,
                    summary.contains("steps") ? fmt::format(", {} steps", summary["steps"].dump()) : "");
  md += "Settings that differ from backprop's defaults:\n\n| setting | value |\n|---|---|\n";
  for (const auto& [key, value] : changed_settings(settings)) {
    const SettingSpec* spec = find_setting(key);
    if (!spec || spec->secret || !kTrainSections.count(key.substr(0, key.find('.')))) continue;
    md += fmt::format("| `{}` | `{}` |\n", key, cell(value));
  }
  md += "\n";
}

void section_data(const json& settings, std::string& md) {
  const std::string data = setting_of(settings, "data", "path");
  if (data.empty()) return;
  md += "## Data\n\n";
  md += fmt::format("Training data: `{}`", cell(data));
  std::error_code ec;
  if (fs::is_regular_file(data, ec)) {
    const auto bytes = fs::file_size(data, ec);
    md += fmt::format(" ({} bytes, sha256 `{}` as found when pushed)", bytes, sha256_file_hex(data));
  }
  md += ".\n";
  const std::string eval_path = setting_of(settings, "data", "eval_path");
  if (!eval_path.empty()) {
    md += fmt::format("Held-out data: `{}`", cell(eval_path));
    if (fs::is_regular_file(eval_path, ec))
      md += fmt::format(" ({} bytes, sha256 `{}`)", fs::file_size(eval_path, ec), sha256_file_hex(eval_path));
    md += ".\n";
  }
  md += "\n";
}

void section_results(const json& summary, const std::optional<json>& eval, std::string& md) {
  if (summary.empty() && !eval) return;
  md += "## Results\n\n";
  if (!summary.empty()) {
    md += "| measure | value |\n|---|---|\n";
    for (const char* k : {"final_loss", "initial_eval_loss", "final_eval_loss", "best_eval_loss", "tokens", "seconds"})
      if (summary.contains(k) && !summary[k].is_null()) md += fmt::format("| {} | {} |\n", k, fmt_number(summary[k]));
    md += "\n";
  }
  if (eval && eval->contains("metrics") && (*eval)["metrics"].is_object() && !(*eval)["metrics"].empty()) {
    md += fmt::format("`backprop eval` on `{}` ({} examples; 95% bootstrap intervals, {} resamples, seed {}):\n\n",
                      cell(eval->value("eval_data", std::string("?"))), fmt_number(eval->value("examples", json())),
                      fmt_number(eval->value("resamples", json())), fmt_number(eval->value("seed", json())));
    md += "| metric | value | 95% interval |\n|---|---|---|\n";
    for (const auto& [name, e] : (*eval)["metrics"].items()) {
      if (!e.is_object()) continue;
      md += fmt::format("| {} | {} | [{}, {}] |\n", cell(name), fmt_number(e.value("value", json())),
                        fmt_number(e.value("ci_low", json())), fmt_number(e.value("ci_high", json())));
    }
    md += "\n";
  }
}

}  // namespace

std::optional<json> read_json_object_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  try {
    json j = read_json_file_capped(path, FileKind::Config, {"push", ErrorCode::INPUT_VALIDATION_FAILED});
    if (j.is_object()) return j;
  } catch (const Error&) {
  }
  return std::nullopt;
}

std::string hub_id_of_model_ref(const std::string& ref) {
  if (const auto hub = hub::parse_hub_ref(ref); hub && !fs::exists(ref)) return hub->repo_id;
  static const std::regex cache(
      R"((^|/)models--([A-Za-z0-9][A-Za-z0-9_.\-]*)--([A-Za-z0-9][A-Za-z0-9_.\-]*)/snapshots/)");
  std::smatch m;
  if (std::regex_search(ref, m, cache) && m[2].str().find("--") == std::string::npos)
    return m[2].str() + "/" + m[3].str();
  return "";
}

std::string license_from_card(const std::string& text) {
  if (text.rfind("---", 0) != 0) return "";
  const size_t end = text.find("\n---", 3);
  const std::string yaml = text.substr(0, end == std::string::npos ? 0 : end);
  static const std::regex re(R"((^|\n)license:[ \t]*["']?([A-Za-z0-9_.\-]+)["']?[ \t]*(\r?\n|$))");
  std::smatch m;
  return std::regex_search(yaml, m, re) ? m[2].str() : "";
}

std::string reproduce_command(const json& settings) {
  std::string env, flags;
  for (const auto& [key, value] : changed_settings(settings)) {
    const SettingSpec* spec = find_setting(key);
    if (!spec || spec->secret || is_testing_setting(*spec) || !kTrainSections.count(key.substr(0, key.find('.'))))
      continue;
    const std::string flag = spec->flag;
    if (flag.empty())
      env += setting_env_var(*spec) + "=" + shell_quote(value) + " ";
    else if (spec->type == SettingType::Bool)
      flags += " " + (value == "true" ? flag : "--no-" + flag.substr(2));
    else if (is_auto_bool(*spec))
      flags += " " + flag + "=" + shell_quote(value);
    else
      flags += " " + flag + " " + shell_quote(value);
  }
  return env + "backprop train" + flags;
}

std::string model_card_markdown(const ModelCardInput& in) {
  json settings = json::object(), summary = json::object();
  std::optional<json> eval;
  if (!in.run_dir.empty()) {
    settings = read_json_object_file((fs::path(in.run_dir) / "settings.json").string()).value_or(json::object());
    summary = read_json_object_file((fs::path(in.run_dir) / "summary.json").string()).value_or(json::object());
    eval = read_json_object_file((fs::path(in.run_dir) / "eval_results.json").string());
  }
  const std::string method = setting_of(settings, "training", "method");
  std::vector<std::string> tags = {"backprop"};
  if (in.format == "lora") tags.insert(tags.end(), {"lora", "peft"});
  if (in.format == "merged") tags.push_back("lora-merged");
  if (in.format.rfind("gguf", 0) == 0) tags.push_back("gguf");
  if (!method.empty()) tags.push_back(method);
  const std::string dataset = hub_dataset_of(setting_of(settings, "data", "path"));

  std::string md = "---\n";
  if (!in.base_model_id.empty()) md += "base_model: " + in.base_model_id + "\n";
  md += std::string("library_name: ") +
        (in.format == "lora"     ? "peft"
         : in.format == "merged" ? "transformers"
                                 : "gguf") +
        "\n";
  md += "pipeline_tag: text-generation\n";
  if (!in.license.empty()) md += "license: " + in.license + "\n";
  if (!dataset.empty()) md += "datasets:\n- " + dataset + "\n";
  md += "tags:\n";
  for (const auto& t : tags) md += "- " + t + "\n";
  md += "---\n\n";

  const std::string name = in.repo_id.substr(in.repo_id.find('/') + 1);
  md += fmt::format("# {}\n\n", name);
  md += fmt::format("{} of {}, trained and exported with backprop {}.\n\n",
                    in.format == "lora"     ? "A LoRA adapter"
                    : in.format == "merged" ? "A fine-tuned model (LoRA merged)"
                                            : "A GGUF export",
                    in.base_model_id.empty()
                        ? fmt::format("`{}`", cell(fs::path(in.base_model).filename().string()))
                        : fmt::format("[{}]({})", in.base_model_id, "https://huggingface.co/" + in.base_model_id),
                    BP_VERSION);
  section_usage(in, md);
  section_training(settings, summary, md);
  section_data(settings, md);
  section_results(summary, eval, md);
  md += "## Reproduce\n\n";
  md += fmt::format("backprop {}", BP_VERSION);
  if (!settings.empty()) {
    md += ":\n\n```sh\n" + reproduce_command(settings) + "\n```\n\n";
  } else {
    md += ".\n\n";
  }
  md += "Files: ";
  for (size_t i = 0; i < in.files.size(); ++i) md += (i ? ", `" : "`") + in.files[i] + "`";
  md += "\n";
  return md;
}

}  // namespace bp
