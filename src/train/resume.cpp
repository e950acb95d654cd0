// Resume checks and metrics trimming (see resume.h).
#include "train/resume.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

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
    throw Error(ErrorCode::CONFIG_INVALID,
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

}  // namespace bp
