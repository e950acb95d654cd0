// Input resolution for `backprop export` (see export_input.h).
#include "export/export_input.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/file_read.h"
#include "io/atomic_file.h"
#include "model/loader.h"
#include "text/chat_template_source.h"
#include "train/checkpoint.h"

namespace bp {

namespace fs = std::filesystem;

struct ExportInput::Staging {
  fs::path dir;
  ~Staging() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

bool is_adapter_dir(const fs::path& p) {
  return fs::is_regular_file(p / "adapter_config.json");
}
bool is_model_dir(const fs::path& p) {
  return fs::is_regular_file(p / "config.json");
}

bool looks_like_run(const fs::path& p) {
  return fs::is_directory(p / "checkpoints") || fs::is_regular_file(p / "summary.json") ||
         fs::is_regular_file(p / "metrics.jsonl");
}

namespace {

bool is_checkpoint_dir(const fs::path& p) {
  return fs::is_regular_file(p / "manifest.json") && fs::is_regular_file(p / "trainer_state.json");
}

// The runs directly inside `dir` (the folder given to `train --output`), newest first.
std::vector<fs::path> runs_inside(const fs::path& dir) {
  std::vector<std::pair<fs::file_time_type, fs::path>> runs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec) && looks_like_run(e.path())) runs.emplace_back(fs::last_write_time(e.path(), ec), e.path());
  std::sort(runs.begin(), runs.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<fs::path> out;
  for (auto& r : runs) out.push_back(std::move(r.second));
  return out;
}

// checkpoints/checkpoint-N of a LoRA run, seen as an adapter folder: the run's adapter_config.json
// and a link to the checkpoint's trainable.safetensors (PEFT tensor names) in a temporary folder.
ExportInput stage_checkpoint(const fs::path& p) {
  CheckpointStore::verify(p.string());  // STATE_CHECKPOINT_INVALID when damaged
  const fs::path run = p.parent_path().parent_path();
  ExportInput in;
  in.staging = std::make_shared<ExportInput::Staging>();
  in.staging->dir = fs::temp_directory_path() / fmt::format("bp-export-{}-{}", ::getpid(), p.filename().string());
  fs::create_directories(in.staging->dir);
  fs::copy_file(run / "adapter" / "adapter_config.json", in.staging->dir / "adapter_config.json");
  fs::create_symlink(p / "trainable.safetensors", in.staging->dir / "adapter_model.safetensors");
  in.kind = ExportInputKind::Adapter;
  in.dir = in.staging->dir;
  in.run_dir = run;
  in.shown = p.string();
  in.out_root = run / "export" / p.filename();
  in.merged_default = run / ("merged-" + p.filename().string());
  return in;
}

// Everything but a checkpoint: an adapter or model folder, or a run holding one.
ExportInput resolve_folder(const fs::path& p) {
  ExportInput in;
  if (is_adapter_dir(p) || is_model_dir(p)) {
    in.kind = is_adapter_dir(p) ? ExportInputKind::Adapter : ExportInputKind::Model;
    in.dir = p;
    if (looks_like_run(p.parent_path())) in.run_dir = p.parent_path();
  } else if (is_adapter_dir(p / "adapter") || is_model_dir(p / "model")) {
    in.kind = is_adapter_dir(p / "adapter") ? ExportInputKind::Adapter : ExportInputKind::Model;
    in.dir = p / (in.kind == ExportInputKind::Adapter ? "adapter" : "model");
    in.run_dir = p;
  } else if (is_checkpoint_dir(p)) {
    throw Error(
        ErrorCode::INPUT_VALIDATION_FAILED,
        fmt::format("[export] {} is a training checkpoint (trainer state, not an export source); export the "
                    "run folder {} (its final adapter/ or model/), or finish the run with `backprop train "
                    "--resume {}` first",
                    p.string(), p.parent_path().parent_path().string(), p.parent_path().parent_path().string()));
  } else if (looks_like_run(p)) {
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] the run folder {} has neither adapter/ nor model/: the run did not finish; "
                            "resume it with `backprop train --resume {}`",
                            p.string(), p.string()));
  } else {
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] {} is not a run folder, a folder of runs (train --output), a PEFT adapter "
                            "folder (adapter_config.json) or a model folder (config.json)",
                            p.string()));
  }
  in.shown = in.dir.string();
  if (!in.run_dir.empty()) {
    in.out_root = in.run_dir / "export";
    in.merged_default = in.run_dir / "merged";
  } else {
    in.out_root = in.dir.parent_path() / (in.dir.filename().string() + "-export");
    in.merged_default = in.out_root / "merged";
  }
  return in;
}

}  // namespace

ExportInput resolve_export_input(const std::string& arg, const std::string& runs_root) {
  if (arg.empty())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                "[export] pass the run folder, PEFT adapter folder or model folder to export");
  std::error_code ec;
  std::string note;
  fs::path named = arg;
  if (!fs::exists(named, ec) && !runs_root.empty() && arg.find('/') == std::string::npos &&
      fs::is_directory(fs::path(runs_root) / arg, ec)) {  // a run id
    named = fs::path(runs_root) / arg;
    note = fmt::format("[export] {} is the run {}", arg, fs::absolute(named).lexically_normal().string());
  }
  if (!fs::exists(named, ec))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] {} does not exist (nor is it a run id under {})", arg, runs_root));
  if (!fs::is_directory(named, ec))
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[export] {} is a file; pass a run folder, a PEFT adapter folder (adapter_config.json) "
                            "or a model folder (config.json)",
                            arg));
  fs::path p = fs::absolute(named).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/" -> "dir"
  const bool holds_export =
      is_adapter_dir(p) || is_model_dir(p) || is_adapter_dir(p / "adapter") || is_model_dir(p / "model");
  if (!holds_export && is_checkpoint_dir(p) && fs::is_regular_file(p / "trainable.safetensors") &&
      is_adapter_dir(p.parent_path().parent_path() / "adapter"))
    return stage_checkpoint(p);
  if (!holds_export && !is_checkpoint_dir(p) && !looks_like_run(p))
    if (const std::vector<fs::path> runs = runs_inside(p); !runs.empty()) {  // the folder given to --output
      note = runs.size() == 1 ? fmt::format("[export] {} holds one run: exporting {}", arg, runs[0].string())
                              : fmt::format("[export] {} holds {} runs: exporting the newest, {}", arg, runs.size(),
                                            runs[0].string());
      p = runs[0];
    }
  ExportInput in = resolve_folder(p);
  in.note = note;
  return in;
}

fs::path resolve_base_model(const ExportInput& in, const std::string& model_path,
                            const std::function<std::string(const std::string&)>& resolve) {
  if (!model_path.empty()) {
    const std::string dir = resolve ? resolve(model_path) : model_path;
    check_model_dir(dir);
    return fs::absolute(dir).lexically_normal();
  }
  const fs::path cfg_path = in.dir / "adapter_config.json";
  std::string base;
  const nlohmann::json j = parse_json_bounded(read_file(cfg_path.string()), cfg_path.string(), "export");
  if (j.is_discarded())
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED, fmt::format("[export] {} is not valid JSON", cfg_path.string()));
  if (auto it = j.find("base_model_name_or_path"); it != j.end() && it->is_string()) base = it->get<std::string>();
  if (base.empty())
    throw Error(ErrorCode::DEP_MODEL_LOAD_FAILED,
                fmt::format("[export] {} names no base model (base_model_name_or_path is empty)", cfg_path.string()))
        .with_suggestion("Pass the base model folder the adapter was trained on with --model PATH.");
  for (const fs::path& c : {fs::path(base), in.dir / base})
    if (is_model_dir(c)) return fs::absolute(c).lexically_normal();
  if (resolve && looks_like_hub_name(base)) return fs::path(resolve(base));  // cache, else download
  Error e(ErrorCode::DEP_MODEL_LOAD_FAILED,
          fmt::format("[export] the base model '{}' named in {} was not found (tried it relative to the working "
                      "folder and to {}); pass the base model folder with --model PATH",
                      base, cfg_path.string(), in.dir.string()),
          {{"base_model_name_or_path", base}});
  e.with_suggestion("Pass the base model folder (or its hub name org/name) the adapter was trained on with --model.");
  throw e;
}

std::string derive_ollama_model_name(const ExportInput& in) {
  std::string src = (in.run_dir.empty() ? in.dir : in.run_dir).filename().string();
  std::string name;
  for (char c : src) {
    const auto u = static_cast<unsigned char>(c);
    name += (std::isalnum(u) || c == '_' || c == '.' || c == '-') ? static_cast<char>(std::tolower(u)) : '-';
  }
  while (!name.empty() && !std::isalnum(static_cast<unsigned char>(name.front()))) name.erase(0, 1);
  if (name.size() > 60) name.resize(60);
  return name.empty() ? "backprop-model" : name;
}

ChatTemplateSource adapter_chat_template_source(const Tokenizer& tok, const std::string& adapter_dir) {
  if (!adapter_dir.empty()) {
    const std::filesystem::path adapter = std::filesystem::absolute(adapter_dir).lexically_normal();
    if (auto s = read_recorded_chat_template(adapter.string())) return *s;
    if (looks_like_run(adapter.parent_path()))
      if (auto s = read_recorded_chat_template(adapter.parent_path().string())) return *s;
  }
  return tok.chat_template_source();
}

ChatTemplate adapter_chat_template(const Tokenizer& tok, const std::string& adapter_dir) {
  const std::string bos = tok.bos_id() >= 0 ? tok.id_to_token(tok.bos_id()) : "";
  const std::string eos = tok.eos_ids().empty() ? "" : tok.id_to_token(tok.eos_ids().front());
  return ChatTemplate(adapter_chat_template_source(tok, adapter_dir), bos, eos);
}

}  // namespace bp
