// Resume: finding the checkpoint, checking it, restoring trainable weights, trimming metrics (resume.h).
#include "train/resume.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/file_lines.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

namespace bp {

namespace fs = std::filesystem;

const char* train_mode_name(TrainMode mode) {
  switch (mode) {
    case TrainMode::Lora: return "lora";
    case TrainMode::Full: return "full";
    case TrainMode::Frozen: return "frozen";
  }
  return "?";
}

namespace {

enum class FieldKind { Int, Number, String, Object };

struct StateField {
  const char* name;
  FieldKind kind;
  bool required;
  bool nullable;
};

// Every trainer_state.json field Trainer::run reads, with the JSON type it needs.
constexpr StateField kStateFields[] = {
    {"step", FieldKind::Int, true, false},
    {"optimizer_step", FieldKind::Int, true, false},
    {"micro_batch_size", FieldKind::Int, true, false},
    {"cursor", FieldKind::Object, true, false},
    {"run_id", FieldKind::String, false, false},
    {"best_eval_loss", FieldKind::Number, false, true},
    {"best_checkpoint", FieldKind::String, false, false},
    {"oom_recoveries", FieldKind::Int, false, false},
    {"skipped_steps", FieldKind::Int, false, false},
    {"tokens", FieldKind::Int, false, false},
    {"mode", FieldKind::String, false, false},
    {"train_samples", FieldKind::Int, false, false},
    {"lora", FieldKind::Object, false, false},
};

bool has_kind(const nlohmann::json& v, FieldKind k) {
  switch (k) {
    case FieldKind::Int: return v.is_number_integer();
    case FieldKind::Number: return v.is_number();
    case FieldKind::String: return v.is_string();
    case FieldKind::Object: return v.is_object();
  }
  return false;
}

const char* kind_name(FieldKind k) {
  switch (k) {
    case FieldKind::Int: return "an integer";
    case FieldKind::Number: return "a number";
    case FieldKind::String: return "a string";
    case FieldKind::Object: return "an object";
  }
  return "?";
}

Error invalid(const std::string& dir, const std::string& why) {
  return Error(ErrorCode::STATE_CHECKPOINT_INVALID, fmt::format("[checkpoint] {} cannot be resumed: {}", dir, why),
               {{"path", dir}});
}

void check_state_fields(const CheckpointInfo& c) {
  const nlohmann::json& st = c.trainer_state;
  if (!st.is_object()) throw invalid(c.path, "trainer_state.json is not a JSON object");
  for (const auto& f : kStateFields) {
    auto it = st.find(f.name);
    if (it == st.end()) {
      if (f.required) throw invalid(c.path, fmt::format("trainer_state.json has no {}", f.name));
      continue;
    }
    if (!(f.nullable && it->is_null()) && !has_kind(*it, f.kind))
      throw invalid(c.path, fmt::format("trainer_state.json: {} is {}, not {}", f.name, it->dump(), kind_name(f.kind)));
  }
  if (st["step"].get<int64_t>() < 0 || st["micro_batch_size"].get<int64_t>() < 1)
    throw invalid(c.path, fmt::format("trainer_state.json: step {} / micro_batch_size {} out of range",
                                      st["step"].dump(), st["micro_batch_size"].dump()));
}

}  // namespace

void check_resumable_checkpoint(const CheckpointInfo& c, TrainMode mode) {
  check_state_fields(c);
  const std::string file = (fs::path(c.path) / "trainable.safetensors").string();
  SafetensorsReader reader = [&] {
    try {
      return SafetensorsReader::open_file(file);
    } catch (const Error& e) {
      throw invalid(c.path, e.what());
    }
  }();
  const auto names = reader.names();
  // Checkpoints from before "mode" was recorded: LoRA ones hold only lora_A / lora_B tensors.
  std::string saved_mode = c.trainer_state.value("mode", std::string());
  if (saved_mode.empty() && !names.empty())
    saved_mode = names.front().find(".lora_") != std::string::npos ? "lora" : "full";
  if (!saved_mode.empty() && saved_mode != train_mode_name(mode))
    throw Error(ErrorCode::CONFIG_RESUME_MISMATCH,
                fmt::format("[train] {} was trained with --mode {}, this run asks for --mode {}: the modes differ "
                            "(the checkpoint is fine)",
                            c.path, saved_mode, train_mode_name(mode)),
                {{"path", c.path}, {"checkpoint_mode", saved_mode}, {"requested_mode", train_mode_name(mode)}})
        .with_suggestion(fmt::format("Resume it with --mode {}, or start a new run (drop --resume) to train with "
                                     "--mode {}.",
                                     saved_mode, train_mode_name(mode)));
  for (const auto& name : names) {
    Tensor t = reader.read(name);
    const float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(p[i]))
        throw invalid(c.path,
                      fmt::format("trainable weight {} holds a non-finite value ({}) at element {}", name, p[i], i));
  }
}

void truncate_metrics_after_step(const std::string& path, int64_t step) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return;
  std::ifstream in(path, std::ios::binary);
  std::string kept, line;
  bool changed = false;
  while (std::getline(in, line)) {
    const bool complete = !in.eof();  // the last line without '\n' was torn by a kill
    auto j = nlohmann::json::parse(line, nullptr, false);
    const bool later = !j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
                       j["step"].get<int64_t>() > step;
    if (!complete || j.is_discarded() || later) {
      changed = true;
      continue;
    }
    kept += line;
    kept += '\n';
  }
  if (changed) write_file_atomic(path, kept);
}

std::optional<double> step_zero_eval_loss(const std::string& path) {
  std::optional<double> found;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return found;  // a link to /dev/zero is not read (core/file_read.h)
  try {
    for_each_line_capped(path, FileKind::Dataset, {"train"}, [&](std::string_view line) {
      if (found || line.find("\"eval\"") == std::string_view::npos) return;  // most lines are steps: no parse
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.value("type", std::string()) == "eval" && j.contains("step") && j["step"] == 0 &&
          j.contains("eval_loss") && j["eval_loss"].is_number())
        found = j["eval_loss"].get<double>();
    });
  } catch (const Error&) {  // unreadable or over the cap: the summary goes without it
  }
  return found;
}

std::string resume_path(const std::string& resume, const std::string& output_root) {
  std::error_code ec;
  const fs::path under_root = fs::path(output_root) / resume;
  return !fs::exists(resume, ec) && fs::exists(under_root, ec) ? under_root.string() : resume;
}

bool is_checkpoint_folder(const std::string& path) {
  std::error_code ec;
  return fs::exists(fs::path(path) / "manifest.json", ec);
}

// Finds the checkpoint folder a --resume value names: "latest" (newest valid one under the
// output folder, or under runs/), a run id (runs/<id>), a run folder or a checkpoint folder.
std::optional<CheckpointInfo> find_resume_checkpoint(const TrainOptions& o, std::string* run_dir,
                                                     const std::function<void(const std::string&)>& warn) {
  auto check = [&](const CheckpointInfo& c) { check_resumable_checkpoint(c, o.mode); };
  auto newest_in_run = [&](const std::string& dir) -> std::optional<CheckpointInfo> {
    CheckpointStore store((fs::path(dir) / "checkpoints").string());
    for (const auto& m : store.recover_interrupted_writes()) warn(m);
    return store.latest_valid(
        [&](const std::string& p, const Error& e) {
          warn(fmt::format("skipping damaged checkpoint {}: {}", p, e.what()));
        },
        check);
  };
  const std::string& r = o.resume;
  if (r == "latest") {
    if (!o.output_dir.empty()) {
      *run_dir = o.output_dir;
      return newest_in_run(o.output_dir);
    }
    std::vector<fs::path> runs;
    std::error_code ec;
    if (fs::is_directory(o.output_root, ec))
      for (const auto& e : fs::directory_iterator(o.output_root, ec))
        if (e.is_directory()) runs.push_back(e.path());
    std::sort(runs.begin(), runs.end(),
              [](const fs::path& a, const fs::path& b) { return fs::last_write_time(a) > fs::last_write_time(b); });
    for (const auto& d : runs)
      if (auto c = newest_in_run(d.string())) {
        *run_dir = d.string();
        return c;
      }
    return std::nullopt;
  }
  const fs::path p = resume_path(r, o.output_root);
  if (is_checkpoint_folder(p.string())) {
    *run_dir = p.parent_path().parent_path().string();
    int64_t step = 0;
    nlohmann::json st = CheckpointStore::verify(p.string());
    step = st.value("step", int64_t{0});
    CheckpointInfo info{p.string(), step, st};
    check(info);
    return info;
  }
  if (fs::is_directory(p)) {
    *run_dir = p.string();
    return newest_in_run(p.string());
  }
  return std::nullopt;
}

NamedTensors trainable_tensors(Model& m) {
  NamedTensors out;
  for (auto& p : m.trainable_parameters()) out.emplace_back(p.name, host_readable(*p.param));
  return out;
}

// What a LoRA checkpoint's tensors say: its rank (lora_A is [r, in]) and the projections it adapts.
static std::string describe_lora_tensors(const SafetensorsReader& reader, const nlohmann::json& state) {
  std::set<std::string> targets;
  int64_t r = -1;
  for (const auto& n : reader.names()) {
    const auto at = n.find(".lora_A");
    if (at == std::string::npos) continue;
    const auto dot = n.rfind('.', at - 1);
    targets.insert(n.substr(dot + 1, at - dot - 1));
    if (r < 0 && !reader.entry(n).shape.empty()) r = reader.entry(n).shape[0];
  }
  std::string out = fmt::format("r={} on {}", r, fmt::join(targets, ","));
  if (state.contains("lora") && state["lora"].is_object()) {
    const auto& l = state["lora"];
    if (l.contains("alpha")) out += fmt::format(", alpha={}", l["alpha"].dump());
    if (l.contains("use_rslora")) out += fmt::format(", rslora={}", l["use_rslora"].dump());
  }
  return out;
}

nlohmann::json lora_state_json(const LoraConfig& lora) {
  return {{"r", lora.r},
          {"alpha", lora.alpha},
          {"use_rslora", lora.use_rslora},
          {"target_modules", lora.resolved_targets()}};
}

void check_trainable_matches(const CheckpointInfo& c, Model& m, const TrainOptions& o) {
  const std::string file = (fs::path(c.path) / "trainable.safetensors").string();
  const SafetensorsReader reader = SafetensorsReader::open_file(file);
  std::string differs;  // the first difference, for the message
  size_t matched = 0;
  for (auto& p : m.trainable_parameters()) {
    if (!reader.contains(p.name)) {
      differs = fmt::format("the checkpoint has no {}", p.name);
      break;
    }
    const auto& shape = reader.entry(p.name).shape;
    if (shape != p.param->shape().vec()) {
      differs = fmt::format("{} is [{}] in the checkpoint, {} in this run", p.name, fmt::join(shape, ", "),
                            p.param->shape().str());
      break;
    }
    ++matched;
  }
  if (differs.empty() && matched != reader.names().size())
    differs =
        fmt::format("the checkpoint holds {} trainable tensors, this run trains {}", reader.names().size(), matched);
  // alpha and rsLoRA leave no trace in the shapes: the checkpoint records them (older ones do not).
  const nlohmann::json saved_lora = c.trainer_state.value("lora", nlohmann::json());
  if (differs.empty() && o.mode == TrainMode::Lora && saved_lora.is_object()) {
    const nlohmann::json now = lora_state_json(o.lora);
    for (const char* k : {"alpha", "use_rslora"})
      if (saved_lora.contains(k) && saved_lora[k] != now[k]) differs = fmt::format("its {} differs", k);
  }
  if (differs.empty()) return;
  const bool lora = o.mode == TrainMode::Lora;
  const std::string asked =
      lora ? fmt::format("r={} on {}, alpha={}, rslora={}", o.lora.r, fmt::join(o.lora.resolved_targets(), ","),
                         nlohmann::json(o.lora.alpha).dump(), o.lora.use_rslora)
           : std::string("--mode full");
  throw Error(ErrorCode::CONFIG_RESUME_MISMATCH,
              fmt::format("[train] {} cannot continue as this run: it holds {}, this run asks for {} ({}). Resuming "
                          "would replace the trained weights, so nothing was changed (the checkpoint is fine)",
                          c.path,
                          lora ? "a LoRA adapter with " + describe_lora_tensors(reader, c.trainer_state)
                               : "other trainable tensors",
                          asked, differs),
              {{"path", c.path}})
      .with_suggestion(lora ? "Drop --lora-r / --lora-alpha / --target-modules / --use-rslora to resume with the "
                              "run's own LoRA shape, or start a new run (drop --resume) to train with the new one."
                            : "Resume with the run's own settings, or start a new run (drop --resume).");
}

void restore_trainable(Model& m, const std::string& file) {
  auto reader = SafetensorsReader::open_file(file);
  for (auto& p : m.trainable_parameters()) {
    if (!reader.contains(p.name))
      throw Error(ErrorCode::STATE_CHECKPOINT_INVALID, fmt::format("[checkpoint] {} has no tensor {}", file, p.name));
    p.param->copy_from(reader.read(p.name, p.param->shape()));
  }
  m.refresh_gemm_copies();  // derived from the masters just restored
}

}  // namespace bp
