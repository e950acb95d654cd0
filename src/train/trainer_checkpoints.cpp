// The run folder's side of the Trainer (trainer_state.h): opening the run (resume target, run id,
// status.json, settings.json), resuming from a checkpoint, writing checkpoints, and finishing
// (final eval and checkpoint, adapter/ or model/, summary.json). trainer.cpp has the step.
#include <fcntl.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>

#include "core/log.h"
#include "export/gguf_lora.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/merge.h"
#include "model/peft.h"
#include "text/chat_template_source.h"
#include "train/resume.h"
#include "train/run_history.h"
#include "train/trainer_state.h"

namespace bp {

namespace fs = std::filesystem;

// A plain-text run on a model without a template rendered nothing with ChatML and records nothing.
void record_chat_template(const std::string& dir, const TrainData& data) {
  if (data.chat_template.kind == ChatTemplateSource::Kind::ChatMLDefault && data.format == "text") return;
  save_chat_template(dir, chat_template_text(data.chat_template));
}

// The resume target first (it decides the run id and the output folder), then the run folder.
void Trainer::State::open_run() {
  TrainOptions& o = opt;
  if (!o.resume.empty()) {
    std::string run_dir;
    resume_from = find_resume_checkpoint(o, &run_dir, [&](const std::string& m) { spdlog::warn("{}", m); });
    if (!resume_from)
      throw Error(ErrorCode::INPUT_RESUME_NOT_FOUND,
                  fmt::format("[train] --resume {}: no valid checkpoint found{}", o.resume,
                              o.output_dir.empty() ? " under " + o.output_root : " under " + o.output_dir));
    if (o.output_dir.empty()) o.output_dir = run_dir;
    log::begin_run(shared_run_id(resume_from->trainer_state.value("run_id", std::string())));
  } else {
    log::begin_run(shared_run_id(""));  // one rank: a new id; several: rank 0's
  }
  summary.run_id = log::run_id();
  if (o.output_dir.empty()) o.output_dir = (fs::path(o.output_root) / summary.run_id).string();
  if (writer) ensure_writable_dir(o.output_dir, "the run's output folder (--output)");  // rank 0 writes the run
  summary.output_dir = o.output_dir;
  checkpoints = std::make_unique<CheckpointStore>((fs::path(o.output_dir) / "checkpoints").string());
  if (!resume_from) start_run_files();
}

// From here on the run folder changes: the records of steps after the resumed checkpoint go (they
// are trained and recorded again), the status says running, settings.json is this run's.
void Trainer::State::start_run_files() {
  TrainOptions& o = opt;
  if (!writer) return;
  if (resume_from)
    truncate_metrics_after_step((fs::path(o.output_dir) / "metrics.jsonl").string(),
                                resume_from->trainer_state.at("step").get<int64_t>());
  if (!o.eval_only) write_run_status_running(o.output_dir);
  const std::string metrics_path = (fs::path(o.output_dir) / "metrics.jsonl").string();
  const int fd = ::open(metrics_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(ErrorCode::INPUT_VALIDATION_FAILED,
                fmt::format("[train] cannot open {} for the run's records: {}", metrics_path, std::strerror(errno)),
                {{"path", metrics_path}});
  metrics.attach(fd, metrics_path, "metrics file");
  // Said once (stderr and the log files); the records wait in memory and are written when they can.
  metrics.set_on_failure([this](const std::string& m) {
    spdlog::warn("{}", m);
    if (cb.on_event) cb.on_event("warn", m);
  });
  run_files_started = true;
  for (auto& r : pending_records) metrics.write(r.dump() + "\n");
  pending_records.clear();
  write_run_settings();
  for (const auto& m : checkpoints->recover_interrupted_writes()) event("info", m);
}

void Trainer::State::write_run_settings() {
  TrainOptions& o = opt;
  if (o.resolved_settings.is_null()) return;
  const bool data_read = tokenizer != nullptr;
  if (data_read)  // the run's saved settings name the template used (issue 15)
    o.resolved_settings["chat_template_used"] = {{"source", data.chat_template.kind_name()},
                                                 {"origin", data.chat_template.origin}};
  write_file_atomic((fs::path(o.output_dir) / "settings.json").string(), o.resolved_settings.dump(2));
  if (data_read) record_chat_template(o.output_dir, data);  // a checkpoint exported before the run ends finds it
}

// A resume that cannot continue this run is refused here, before start_run_files touches the run
// folder: tensors of another shape (check_trainable_matches), a dataset the saved position does not
// fit, a run already finished at the steps asked for.
void Trainer::State::check_resume() {
  const auto& st = resume_from->trainer_state;
  const int64_t at = st.at("step").get<int64_t>();
  check_trainable_matches(*resume_from, *model, opt);
  const CursorState pos = CursorState::from_json(st.at("cursor"));  // malformed: the checkpoint is damaged
  const int64_t n = static_cast<int64_t>(data.train.size());
  // Checkpoints record how many samples an epoch had (older ones do not: then only the position).
  const int64_t saved_n = st.value("train_samples", int64_t{-1});
  if (pos.index > n || (saved_n >= 0 && saved_n != n))
    throw Error(ErrorCode::CONFIG_RESUME_MISMATCH,
                fmt::format("[train] {} stopped at sample {} of epoch {}{}, but {} now gives {} training samples: the "
                            "data (or --holdout) is not what the run was trained on (the checkpoint is fine)",
                            resume_from->path, pos.index, pos.epoch,
                            saved_n >= 0 ? fmt::format(" of {}", saved_n) : std::string(), opt.data_path, n),
                {{"path", resume_from->path}, {"cursor_index", pos.index}, {"train_samples", n}})
        .with_suggestion(
            "Resume with the dataset the run was trained on, or start a new run (drop --resume) to "
            "train on this one.");
  const std::string steps_hint =
      fmt::format("Pass --steps larger than {} to train it further, or start a new run (drop --resume).", at);
  if (at > total_steps)
    throw Error(ErrorCode::CONFIG_RESUME_MISMATCH,
                fmt::format("[train] {} is at step {}, past the {} steps this run asks for (the checkpoint is fine)",
                            resume_from->path, at, total_steps),
                {{"path", resume_from->path}, {"step", at}, {"total_steps", total_steps}})
        .with_suggestion(steps_hint);
  if (at == total_steps && !opt.refinish_finished) {  // a run killed while finishing still finishes
    std::error_code ec;
    const fs::path status = fs::path(opt.output_dir) / "status.json";
    nlohmann::json j = fs::is_regular_file(status, ec)
                           ? nlohmann::json::parse(read_file(status.string()), nullptr, false)
                           : nlohmann::json();
    if (j.is_object() && j.value("status", std::string()) == "finished")
      throw Error(ErrorCode::CONFIG_RESUME_MISMATCH,
                  fmt::format("[train] the run in {} already finished at step {} of {}: there is nothing to resume",
                              opt.output_dir, at, total_steps),
                  {{"path", resume_from->path}, {"step", at}, {"total_steps", total_steps}})
          .with_suggestion(steps_hint);
  }
}

void Trainer::State::resume() {
  const auto& st = resume_from->trainer_state;
  restore_trainable(*model, (fs::path(resume_from->path) / "trainable.safetensors").string());
  auto opt_reader = SafetensorsReader::open_file((fs::path(resume_from->path) / "optimizer.safetensors").string());
  std::vector<std::pair<std::string, Tensor>> state;
  for (const auto& n : opt_reader.names()) state.emplace_back(n, opt_reader.read(n));
  adamw.load_state(state, st.at("optimizer_step").get<int64_t>());
  step = st.at("step").get<int64_t>();
  cursor = std::make_unique<DataCursor>(static_cast<int64_t>(data.train.size()), opt.seed, opt.shuffle,
                                        CursorState::from_json(st.at("cursor")));
  oom->set_micro_seqs(st.at("micro_batch_size").get<int64_t>());
  if (st.contains("best_eval_loss") && !st["best_eval_loss"].is_null())
    summary.best_eval_loss = st["best_eval_loss"].get<double>();
  best_checkpoint = st.value("best_checkpoint", std::string());
  summary.oom_recoveries = st.value("oom_recoveries", int64_t{0});
  summary.skipped_steps = st.value("skipped_steps", int64_t{0});
  summary.tokens = st.value("tokens", int64_t{0});
  summary.initial_eval_loss = step_zero_eval_loss((fs::path(opt.output_dir) / "metrics.jsonl").string());
  load_reference(resume_from->path);
  event("info", fmt::format("resumed from {} at step {} of {}", resume_from->path, step, total_steps));
}

// The safety monitor checks the disk first (train/safety_monitor.h).
std::string Trainer::State::save_checkpoint(std::optional<double> eval_loss) {
  if (comm->world() > 1) comm->barrier(opt.distributed_timeout_s);  // every rank finished the step
  if (!writer) {  // rank 0 writes it; the others keep the bookkeeping the same
    // ZeRO-1: this rank's share of m and v, streamed to rank 0 as it writes optimizer.safetensors.
    if (adamw.sharded()) adamw.stream_state(0, nullptr);
    if (eval_loss && (!summary.best_eval_loss || *eval_loss <= *summary.best_eval_loss))
      summary.best_eval_loss = *eval_loss;
    return {};
  }
  safety->before_checkpoint(checkpoints->root(), checkpoint_bytes_estimate(*model), step);
  auto json_or_null = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  nlohmann::json st = {{"step", step},
                       {"optimizer_step", adamw.steps_taken()},
                       {"micro_batch_size", oom->micro_seqs()},
                       {"grad_accum", oom->accumulation()},
                       {"cursor", cursor->state().to_json()},
                       {"train_samples", static_cast<int64_t>(data.train.size())},
                       {"run_id", summary.run_id},
                       {"seed", opt.seed},
                       {"mode", train_mode_name(opt.mode)},
                       {"tokens", summary.tokens},
                       {"oom_recoveries", summary.oom_recoveries},
                       {"skipped_steps", summary.skipped_steps},
                       {"eval_loss", json_or_null(eval_loss)},
                       {"best_eval_loss", json_or_null(summary.best_eval_loss)},
                       {"best_checkpoint", best_checkpoint}};
  if (opt.mode == TrainMode::Lora) st["lora"] = lora_state_json(opt.lora);
  nlohmann::json losses = nlohmann::json::array();
  for (const auto& h : summary.history) losses.push_back({{"step", h.step}, {"loss", h.loss}});
  st["loss_history"] = losses;
  Model& m = *model;
  std::vector<CheckpointFile> files = {
      {"trainable.safetensors", [&](const std::string& p) { write_safetensors(p, trainable_tensors(m)); }},
      {"optimizer.safetensors", [&](const std::string& p) {
         if (adamw.sharded()) {  // every rank's share, segment by segment: never the whole state at once
           std::vector<SafetensorsSpec> specs;
           for (auto& [n, shape] : adamw.state_layout()) specs.push_back({n, DType::F32, shape});
           write_safetensors_streamed(
               p, specs, [&](const std::function<void(const void*, size_t)>& write) { adamw.stream_state(0, &write); });
           return;
         }
         NamedTensors t;
         for (auto& [n, v] : adamw.state_tensors()) t.emplace_back(n, host_readable(v));
         write_safetensors(p, t);
       }}};
  for (auto& [name, writer] : reference_files()) files.push_back({name, writer});
  if (method_is_preference(opt.method)) st["method"] = train_method_name(opt.method);
  std::string path = checkpoints->write(step, files, st);
  if (eval_loss && (!summary.best_eval_loss || *eval_loss <= *summary.best_eval_loss)) {
    summary.best_eval_loss = *eval_loss;
    best_checkpoint = path;
  }
  checkpoints->prune(opt.keep_checkpoints, best_checkpoint);
  record({{"type", "checkpoint"}, {"step", step}, {"path", path}});
  return path;
}

// The final evaluation and checkpoint, the artifact (adapter/ or model/) and summary.json.
void Trainer::State::finish() {
  summary.final_eval_loss = evaluate();
  if (summary.final_eval_loss) {
    record(eval_record(step, *summary.final_eval_loss));
    summary.final_eval_metrics = eval_metrics_json();
    if (!summary.best_eval_loss || *summary.final_eval_loss < *summary.best_eval_loss)
      summary.best_eval_loss = summary.final_eval_loss;
  }
  save_checkpoint(summary.final_eval_loss);
  if (writer) save_final_artifact();
  summary.micro_batch_size = oom->micro_seqs();
  summary.grad_accum = oom->accumulation();
  summary.gradient_checkpointing = model->options().gradient_checkpointing;
  summary.peak_memory_bytes = alloc->stats().bytes_peak;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  count_lost_records();
  if (writer) write_file_atomic((fs::path(opt.output_dir) / "summary.json").string(), summary.to_json().dump(2));
  alloc->set_limit(kNoLimit);
}

// Records that did not reach their files by now: lost ones, and those still waiting for room (the
// run ends soon after this). Said once more, with the count, on stderr.
void Trainer::State::count_lost_records() {
  metrics.flush_pending();
  std::vector<std::pair<std::string, uint64_t>> lost = log::records_lost();
  lost.emplace_back(metrics.path(), metrics.records_lost() + metrics.records_waiting());
  for (const auto& [path, n] : lost) {
    if (n == 0) continue;
    summary.records_lost += n;
    summary.records_lost_files.push_back(path);
  }
  if (summary.records_lost > 0)
    spdlog::warn("[records] {} record(s) of this run could not be written to {}: the run's records are incomplete",
                 summary.records_lost, fmt::format("{}", fmt::join(summary.records_lost_files, ", ")));
}

// The adapter and the weights as host tensors for the writers (io/ reads host memory only): the
// trained ones themselves on the CPU, copies when the model trains on a device.
static LoraAdapter adapter_on_host(const LoraAdapter& adapter) {
  LoraAdapter out = adapter;
  copy_adapter_tensors(out, [](const Tensor& t) { return host_readable(t); });
  return out;
}
static ModelWeights weights_on_host(Model& model) {
  if (model.device().type == DeviceType::CPU) return model.weights();
  Model copy(model.weights(), ModelOptions{TrainMode::Frozen});  // shares the tensors: only names them
  for (auto& [name, t] : copy.named_weights()) *t = t->to(Device{});
  return copy.weights();
}

void Trainer::State::save_final_artifact() {
  if (opt.mode != TrainMode::Lora) {
    std::string dir = (fs::path(opt.output_dir) / "model").string();
    SaveModelOptions so;
    so.copy_files_from = tok_dir;
    save_hf_model(weights_on_host(*model), dir, so);
    record_chat_template(dir, data);
    summary.final_artifact = dir;
    return;
  }
  std::string dir = (fs::path(opt.output_dir) / "adapter").string();
  const LoraAdapter host_adapter = adapter_on_host(*adapter);
  bool untouched = true;  // every lora_B still as it started (zero; PiSSA: B0): the adapter is the identity
  for (const auto& layer : host_adapter.layers)
    for (int t = 0; t < kNumLoraTargets && untouched; ++t)
      if (layer.enabled[static_cast<size_t>(t)]) {
        const Tensor& b = layer.B[static_cast<size_t>(t)];
        const Tensor& b0 = layer.B0[static_cast<size_t>(t)];
        const float* p = b.data<float>();
        const float* p0 = b0.defined() ? b0.data<float>() : nullptr;
        for (int64_t i = 0; i < b.numel(); ++i)
          if (p[i] != (p0 ? p0[i] : 0.0f)) {
            untouched = false;
            break;
          }
      }
  if (untouched)
    event("warn", fmt::format("the adapter saved to {} was never trained (no successful update): it leaves the "
                              "base model unchanged",
                              dir));
  save_peft_adapter(host_adapter, dir);
  record_chat_template(dir, data);
  summary.final_artifact = dir;
  if (!gguf_base_file(opt.model_dir).empty()) {  // a GGUF base: also the adapter llama.cpp and Ollama load
    const std::string gguf = (fs::path(opt.output_dir) / kGGUFAdapterFile).string();
    try {
      export_gguf_lora(host_adapter, model->weights().config, GGMLType::F32, gguf);
      summary.final_gguf_adapter = gguf;
    } catch (const Error& e) {  // the PEFT adapter is saved: the run stands, the GGUF can be made later
      event("warn", fmt::format("the GGUF LoRA adapter {} was not written ({}); make it later with `backprop export "
                                "{} --format gguf-lora`",
                                gguf, e.what(), opt.output_dir));
    }
  }
}

}  // namespace bp
