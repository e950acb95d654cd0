// A resumed run's settings: its settings.json under this command's explicit values (resume_settings.h).
#include "train/resume_settings.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "core/error.h"
#include "core/file_read.h"
#include "core/settings.h"
#include "io/atomic_file.h"
#include "train/resume.h"
#include "train/train_options.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

// What the checkpoint's tensors are (shapes, which weights train), what the frozen base is, and
// which samples come next (the data, how it is split, rendered, cut and ordered, the batch).
constexpr std::string_view kPinned[] = {
    "model.path",
    "model.base_dtype",
    "lora.r",
    "lora.alpha",
    "lora.target_modules",
    "lora.use_rslora",
    "lora.use_dora",
    "lora.init_lora_weights",
    "training.mode",
    "training.batch_size",
    "training.micro_batch_size",
    "training.grad_accum",
    "training.max_seq_length",
    "training.seed",
    "training.init_from_config",
    "training.method",     // the loss, and what a micro-batch holds (pairs)
    "training.reference",  // whether checkpoints carry the precomputed reference
    "training.init_adapter",
    "data.path",
    "data.format",
    "data.columns",
    "data.holdout",
    "data.train_on_all",
    "data.chat_template",
    "data.tools",
    "data.template_kwargs",
    "data.reasoning",
    "data.tool_arguments",
    "data.shuffle",
};

// Settings naming files: the same file written another way ("./d.jsonl", an absolute path) is the same.
bool names_a_path(std::string_view key) {
  return key == "model.path" || key == "data.path" || key == "data.chat_template" || key == "data.tools" ||
         key == "training.init_from_config";
}

bool same_value(std::string_view key, const std::string& a, const std::string& b) {
  if (a == b) return true;
  if (!names_a_path(key) || a.empty() || b.empty()) return false;
  std::error_code ea, eb;
  const fs::path pa = fs::weakly_canonical(a, ea), pb = fs::weakly_canonical(b, eb);
  return !ea && !eb && fs::exists(pa, ea) && pa == pb;
}

std::string json_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  return v.dump();
}

const nlohmann::json* saved_value(const nlohmann::json& saved, std::string_view key) {
  const auto dot = key.find('.');
  auto sec = saved.find(std::string(key.substr(0, dot)));
  if (sec == saved.end() || !sec->is_object()) return nullptr;
  auto it = sec->find(std::string(key.substr(dot + 1)));
  return it == sec->end() || it->is_null() ? nullptr : &*it;
}

bool explicit_source(SettingSource s) {
  return s != SettingSource::Default && s != SettingSource::Preset;
}

}  // namespace

bool resumed_with_setting(const SettingSpec& spec) {
  const std::string_view k = spec.key;
  return spec.flag != nullptr && *spec.flag != 0 && !spec.secret && train_takes_setting(k) &&
         !is_testing_setting(spec) && k != "training.output" && k != "training.resume" && k != "training.preset" &&
         k != "training.nproc";  // how many processes continue the run is this command's choice
}

bool pinned_on_resume(std::string_view key) {
  return std::find(std::begin(kPinned), std::end(kPinned), key) != std::end(kPinned);
}

std::optional<std::string> find_resume_run_dir(const std::string& resume, const std::string& output_root) {
  std::error_code ec;
  auto has_checkpoints = [&](const fs::path& run) {
    return fs::is_directory(run / "checkpoints", ec) && !fs::is_empty(run / "checkpoints", ec);
  };
  if (resume == "latest") {
    std::vector<std::pair<fs::file_time_type, fs::path>> runs;
    if (fs::is_directory(output_root, ec))
      for (const auto& e : fs::directory_iterator(output_root, ec))
        if (e.is_directory(ec) && has_checkpoints(e.path()))
          runs.emplace_back(fs::last_write_time(e.path(), ec), e.path());
    if (runs.empty()) return std::nullopt;
    return std::max_element(runs.begin(), runs.end())->second.string();
  }
  const fs::path p = resume_path(resume, output_root);
  if (is_checkpoint_folder(p.string())) return p.parent_path().parent_path().string();
  if (fs::is_directory(p, ec)) return p.string();
  return std::nullopt;
}

void apply_resumed_settings(Settings& st, const nlohmann::json& saved, const std::string& run_dir) {
  if (!saved.is_object()) return;
  struct Mismatch {
    std::string key, flag, requested, saved;
  };
  std::vector<Mismatch> mismatches;
  for (const SettingSpec& spec : settings_registry()) {
    if (!resumed_with_setting(spec)) continue;
    const nlohmann::json* v = saved_value(saved, spec.key);
    if (!v) continue;
    Settings parsed;  // the saved value in the table's text form (as this command's is)
    try {
      parsed.set(spec.key, json_text(*v), SettingSource::Toml);
    } catch (const Error&) {  // a value this version no longer takes: the command's own stands
      continue;
    }
    const std::string was = parsed.text(spec.key, true), now = st.text(spec.key, true);
    if (explicit_source(st.source(spec.key))) {
      if (pinned_on_resume(spec.key) && !same_value(spec.key, was, now))
        mismatches.push_back({spec.key, spec.flag, now, was});
    } else if (was != Settings().text(spec.key, true)) {
      st.set(spec.key, was, SettingSource::Toml);
    }
  }
  // The preset's values are the saved ones above; another preset would change them.
  const std::string saved_preset = saved.contains("preset") && saved["preset"].is_object()
                                       ? saved["preset"].value("name", std::string("none"))
                                       : std::string("none");
  if (explicit_source(st.source("training.preset")) && st.get_string("training.preset") != saved_preset)
    mismatches.push_back({"training.preset", "--preset", st.get_string("training.preset"), saved_preset});
  st.set("training.preset", "none", SettingSource::Default);
  if (mismatches.empty()) return;
  std::string list;
  nlohmann::json details = nlohmann::json::array();
  for (const auto& m : mismatches) {
    list += fmt::format("{}{} {} (the run was trained with {} {})", list.empty() ? "" : "; ", m.flag,
                        m.requested.empty() ? "\"\"" : m.requested, m.flag, m.saved.empty() ? "\"\"" : m.saved);
    details.push_back({{"setting", m.key}, {"requested", m.requested}, {"saved", m.saved}});
  }
  throw Error(ErrorCode::CONFIG_RESUME_MISMATCH,
              fmt::format("[train] --resume {}: {}. Resuming with another value would not continue the same "
                          "training, so nothing was changed (the checkpoint is fine)",
                          run_dir, list),
              {{"path", run_dir}, {"mismatches", details}})
      .with_suggestion(fmt::format("Drop {} to resume with the run's own value{}, or start a new run (drop --resume) "
                                   "to train with the new one{}.",
                                   mismatches.size() == 1 ? mismatches[0].flag : "those flags",
                                   mismatches.size() == 1 ? "" : "s", mismatches.size() == 1 ? "" : "s"));
}

nlohmann::json resume_with_saved_settings(Settings& st) {
  const std::string resume = st.get_string("training.resume");
  if (resume.empty()) return nullptr;
  const auto run_dir = find_resume_run_dir(resume, st.get_string("training.output"));
  if (!run_dir) return nullptr;  // the trainer says that nothing is there
  const std::string file = (fs::path(*run_dir) / "settings.json").string();
  std::error_code ec;
  nlohmann::json saved;
  if (fs::is_regular_file(file, ec)) saved = parse_json_bounded(read_file(file), file, "train");
  if (resume == "latest") st.set("training.resume", *run_dir);
  if (!saved.is_object()) return nullptr;  // a run from before settings.json: the flags as given
  apply_resumed_settings(st, saved, *run_dir);
  return saved.contains("preset") ? saved["preset"] : nlohmann::json(nullptr);
}

}  // namespace bp
