// The training loop. See trainer.h for the contract and the output layout.
#include "train/trainer.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/allocator.h"
#include "core/device_info.h"
#include "core/interrupt.h"
#include "core/log.h"
#include "core/threads.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/held_weights.h"
#include "model/loader.h"
#include "model/merge.h"
#include "model/peft.h"
#include "ops/optim.h"
#include "text/data_cursor.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/oom_recovery.h"
#include "train/optimizer.h"
#include "train/resume.h"
#include "train/run_history.h"
#include "train/train_data.h"
#include "train/train_plan.h"

namespace bp {

namespace fs = std::filesystem;

nlohmann::json TrainSummary::to_json() const {
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  return {{"run_id", run_id},
          {"output_dir", output_dir},
          {"final_artifact", final_artifact},
          {"steps", steps_done},
          {"tokens", tokens},
          {"seconds", seconds},
          {"final_loss", final_loss},
          {"initial_eval_loss", opt(initial_eval_loss)},
          {"final_eval_loss", opt(final_eval_loss)},
          {"best_eval_loss", opt(best_eval_loss)},
          {"peak_memory_bytes", peak_memory_bytes},
          {"oom_recoveries", oom_recoveries},
          {"skipped_steps", skipped_steps},
          {"micro_batch_size", micro_batch_size},
          {"grad_accum", grad_accum},
          {"gradient_checkpointing", gradient_checkpointing}};
}

struct Trainer::State {
  TrainOptions opt;
  TrainCallbacks cb;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<LoraAdapter> adapter;
  TrainData data;
  AdamW adamw;
  std::unique_ptr<DataCursor> cursor;
  std::unique_ptr<OomRecovery> oom;
  std::unique_ptr<CheckpointStore> checkpoints;
  std::unique_ptr<SafetyMonitor> safety;
  TrainSummary summary;
  int64_t total_steps = 0;
  int64_t step = 0;  // optimizer steps done
  std::string best_checkpoint;
  std::ofstream metrics;
  int consecutive_nonfinite = 0;
  int64_t fault_oom_left = 0;
  Allocator* alloc = nullptr;
  std::string tok_dir;  // tokenizer files (copied next to a full model)
  std::optional<CheckpointInfo> resume_from;
  std::vector<TrainableParam> params;
  std::vector<Tensor*> grads;
  std::chrono::steady_clock::time_point t0;

  // Setup, in order (Trainer::run_impl).
  void open_run();
  void load_data();
  void build_model();
  void plan_memory();
  void resume();
  // The step and what runs on its schedule.
  struct Batch {
    CursorState start;  // the cursor before the step: a monitor stop saves the last finished step
    std::vector<int64_t> ids;
    int64_t n_labels = 0, n_tokens = 0;
  };
  Batch next_batch();
  double forward_backward(const Batch& batch);
  void report_oom(const OomEvent& ev);
  bool clip_and_check(const Batch& batch, StepRecord& rec);
  void update(const StepRecord& rec);
  void log_step(const Batch& batch, const StepRecord& rec);
  void after_step();
  std::optional<double> evaluate();
  std::string save_checkpoint(std::optional<double> eval_loss);
  void finish();
  void save_final_artifact();
  // Fault injection for tests (the fault_* options), at these points of the loop only.
  enum class FaultPoint { Start, MicroBatch, Backward, Eval, Checkpointed };
  void inject_fault(FaultPoint where);

  void event(const std::string& level, const std::string& msg) {
    if (level == "warn")
      spdlog::warn("{}", msg);
    else if (level == "error")
      spdlog::error("{}", msg);
    else
      spdlog::info("{}", msg);
    if (cb.on_event) cb.on_event(level, msg);
    record({{"type", "event"}, {"level", level}, {"message", msg}});
  }
  void record(nlohmann::json j) {
    j["run_id"] = summary.run_id;
    // Wall-clock seconds since the epoch: rates (tokens/s in `backprop ui`) come from the gaps.
    j["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    if (metrics.is_open()) {
      metrics << j.dump() << "\n";
      metrics.flush();
    }
  }
};

Trainer::Trainer(TrainOptions options, TrainCallbacks callbacks) : s_(std::make_unique<State>()) {
  s_->opt = std::move(options);
  s_->cb = std::move(callbacks);
}
Trainer::~Trainer() = default;
Model& Trainer::model() {
  return *s_->model;
}
LoraAdapter* Trainer::adapter() {
  return s_->adapter.get();
}

// Replaces the freshly initialised A/B by an adapter's (multi-run starts each run from the merge
// so far). Its rank and targets must be the ones this run trains.
static void start_from_adapter(LoraAdapter& adapter, const std::string& dir, const ModelConfig& cfg) {
  LoraAdapter init = load_peft_adapter(dir, cfg);
  if (init.config.r != adapter.config.r || init.config.resolved_targets() != adapter.config.resolved_targets())
    throw Error(ErrorCode::CONFIG_INVALID,
                fmt::format("[train] the adapter in {} has r={} on {}, this run trains r={} on {}", dir, init.config.r,
                            fmt::join(init.config.resolved_targets(), ","), adapter.config.r,
                            fmt::join(adapter.config.resolved_targets(), ",")));
  for (size_t l = 0; l < adapter.layers.size(); ++l)
    for (LoraTarget t : kAllLoraTargets)
      if (adapter.layers[l].has(t)) {
        adapter.layers[l].a(t).copy_from(init.layers[l].a(t));
        adapter.layers[l].b(t).copy_from(init.layers[l].b(t));
      }
}

// ---- resume -----------------------------------------------------------------------------------

// Finds the checkpoint folder a --resume value names: "latest" (newest valid one under the
// output folder, or under runs/), a run id (runs/<id>), a run folder or a checkpoint folder.
static std::optional<CheckpointInfo> find_resume_checkpoint(const TrainOptions& o, std::string* run_dir,
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
  fs::path p(r);
  if (!fs::exists(p) && fs::exists(fs::path(o.output_root) / r)) p = fs::path(o.output_root) / r;
  if (fs::exists(p / "manifest.json")) {  // a checkpoint folder
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

// ---- checkpoint contents ----------------------------------------------------------------------

static NamedTensors trainable_tensors(Model& m) {
  NamedTensors out;
  for (auto& p : m.trainable_parameters()) out.emplace_back(p.name, *p.param);
  return out;
}

static void restore_trainable(Model& m, const std::string& file) {
  auto reader = SafetensorsReader::open_file(file);
  for (auto& p : m.trainable_parameters()) {
    if (!reader.contains(p.name))
      throw Error(ErrorCode::STATE_CHECKPOINT_INVALID, fmt::format("[checkpoint] {} has no tensor {}", file, p.name));
    p.param->copy_from(reader.read(p.name, p.param->shape()));
  }
}

// ---- the run ----------------------------------------------------------------------------------

// --device: this version trains on the CPU. "auto" and "cpu" run there; "cuda[:N]" stops before
// any work with the reason (no CUDA backend in the build, no usable device, or no CUDA training
// kernels yet) instead of quietly training on the CPU.
static void check_device(const std::string& device) {
  if (device.rfind("cuda", 0) != 0) return;
  const CudaStatus cs = cuda_status();
  const std::string why = !cs.compiled                  ? "this build has no CUDA backend"
                          : !cs.why_unavailable.empty() ? cs.why_unavailable
                                                        : "this version has no CUDA training kernels yet";
  throw Error(ErrorCode::DEP_GPU_NOT_AVAILABLE, fmt::format("[train] --device {}: {}", device, why),
              {{"device", device}, {"cuda_compiled", cs.compiled}})
      .with_suggestion("Train on the CPU: --device cpu (or auto, the default).");
}

// run_impl with the run's status.json kept (train/run_history.h): running from the moment the
// output folder exists, then finished, interrupted or failed with the error code.
TrainSummary Trainer::run() {
  auto end_status = [this](const char* status, const std::string& code, const std::string& message) {
    if (s_->summary.output_dir.empty() || s_->opt.eval_only) return;
    try {
      write_run_status_end(s_->summary.output_dir, status, code, message);
    } catch (const std::exception& e) {  // never hide the run's own outcome behind this one
      spdlog::warn("could not update {}/status.json: {}", s_->summary.output_dir, e.what());
    }
  };
  try {
    TrainSummary sum = run_impl();
    end_status("finished", "", "");
    return sum;
  } catch (const Error& e) {
    end_status(e.code() == ErrorCode::RUNTIME_TRAINING_ABORTED ? "interrupted" : "failed", e.info().name, e.what());
    throw;
  } catch (const std::exception& e) {
    end_status("failed", "RUNTIME_INTERNAL", e.what());
    throw;
  }
}

// One optimizer step, as llm.c's train_gpt2.c shows it: next batch, forward/backward, clip and
// check, update (the schedule gives the step's learning rate), log; evaluation and checkpoints on
// their schedule. Setup, resume, evaluation, saving and finishing are the functions below.
TrainSummary Trainer::run_impl() {
  State& s = *s_;
  s.t0 = std::chrono::steady_clock::now();
  check_device(s.opt.device);
  if (!s.opt.model_dir.empty()) check_model_dir(s.opt.model_dir);  // explains hub names before the tokenizer is read
  set_num_threads(s.opt.threads);
  s.inject_fault(State::FaultPoint::Start);
  s.alloc = &cpu_allocator();
  s.open_run();
  s.load_data();
  s.build_model();
  s.plan_memory();
  s.adamw.init(s.model->trainable_parameters());
  if (s.resume_from) {
    s.resume();
  } else {
    s.summary.initial_eval_loss = s.evaluate();
    if (s.summary.initial_eval_loss) {
      s.record({{"type", "eval"}, {"step", 0}, {"eval_loss", *s.summary.initial_eval_loss}});
      s.event("info", fmt::format("eval loss before training: {:.4f}", *s.summary.initial_eval_loss));
    }
  }
  if (s.opt.eval_only) {
    s.summary.final_eval_loss = s.summary.best_eval_loss = s.summary.initial_eval_loss;
    s.alloc->set_limit(kNoLimit);
    return s.summary;
  }

  install_interrupt_handler();
  struct ClearInterrupt {
    ~ClearInterrupt() { clear_interrupt(); }
  } clear_on_exit;
  s.alloc->reset_peak();
  s.params = s.model->trainable_parameters();
  for (auto& p : s.params) s.grads.push_back(p.grad);
  s.fault_oom_left = s.opt.fault_oom_repeat;

  while (s.step < s.total_steps) {
    const State::Batch batch = s.next_batch();
    StepRecord rec;
    rec.step = s.step + 1;
    rec.tokens = batch.n_tokens;
    rec.sample_ids = batch.ids;
    const double loss_sum = s.forward_backward(batch);
    rec.loss = batch.n_labels ? loss_sum / static_cast<double>(batch.n_labels) : 0.0;
    rec.lr = lr_at_step(s.opt.lr_scheduler, s.opt.lr, s.step, s.opt.warmup_steps, s.total_steps);
    if (s.clip_and_check(batch, rec)) s.update(rec);
    s.log_step(batch, rec);
    s.after_step();
  }
  s.finish();
  return s.summary;
}

// ---- setup ------------------------------------------------------------------------------------

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
    log::begin_run(resume_from->trainer_state.value("run_id", std::string()));
  } else {
    log::begin_run();
  }
  summary.run_id = log::run_id();
  if (o.output_dir.empty()) o.output_dir = (fs::path(o.output_root) / summary.run_id).string();
  ensure_writable_dir(o.output_dir, "the run's output folder (--output)");
  summary.output_dir = o.output_dir;
  if (resume_from)  // the steps after the checkpoint are trained (and recorded) again
    truncate_metrics_after_step((fs::path(o.output_dir) / "metrics.jsonl").string(),
                                resume_from->trainer_state.at("step").get<int64_t>());
  if (!o.eval_only) write_run_status_running(o.output_dir);
  metrics.open((fs::path(o.output_dir) / "metrics.jsonl").string(), std::ios::app);
  if (!o.resolved_settings.is_null())
    write_file_atomic((fs::path(o.output_dir) / "settings.json").string(), o.resolved_settings.dump(2));
  checkpoints = std::make_unique<CheckpointStore>((fs::path(o.output_dir) / "checkpoints").string());
  for (const auto& m : checkpoints->recover_interrupted_writes()) event("info", m);
}

void Trainer::State::load_data() {
  TrainOptions& o = opt;
  tok_dir = !o.tokenizer_dir.empty() ? o.tokenizer_dir
            : !o.model_dir.empty()   ? o.model_dir
                                     : fs::path(o.init_from_config).parent_path().string();
  tokenizer = Tokenizer::from_dir(tok_dir);
  data = build_train_data(o, *tokenizer);
  event("info", "chat template: " + data.chat_template.describe());
  if (!o.resolved_settings.is_null()) {  // the run's saved settings name the template used (issue 15)
    o.resolved_settings["chat_template_used"] = {{"source", data.chat_template.kind_name()},
                                                 {"origin", data.chat_template.origin}};
    write_file_atomic((fs::path(o.output_dir) / "settings.json").string(), o.resolved_settings.dump(2));
  }
  for (const auto& w : data.warnings) event("warn", w);
  if (o.max_bad_rows > 0 && data.rows_skipped > o.max_bad_rows)
    throw Error(ErrorCode::INPUT_DATASET_INVALID,
                fmt::format("[train] {} of {} rows of {} are bad, more than --max-errors {}", data.rows_skipped,
                            data.rows_total, o.data_path, o.max_bad_rows),
                {{"rows_skipped", data.rows_skipped}, {"rows_total", data.rows_total}})
        .with_suggestion(fmt::format("`backprop validate {}` lists every bad row with its line number; raise "
                                     "--max-errors (0 = no limit) to train on the good rows anyway.",
                                     o.data_path));
  if (data.train.empty())
    throw Error(ErrorCode::INPUT_DATASET_INVALID,
                fmt::format("[train] {} has no usable training samples ({} rows, {} skipped)", o.data_path,
                            data.rows_total, data.rows_skipped));
}

void Trainer::State::build_model() {
  const TrainOptions& o = opt;
  ModelOptions mopt;
  mopt.mode = o.mode;
  mopt.gradient_checkpointing = o.gradient_checkpointing.value_or(true);
  std::vector<std::string> held_notes;
  const std::optional<DType> base = o.mode == TrainMode::Full ? DType::F32 : parse_base_dtype(o.base_dtype);
  ModelWeights weights = !o.init_from_config.empty()
                             ? init_random_weights(ModelConfig::from_file(o.init_from_config), o.seed)
                             : load_model(o.model_dir, base, &held_notes);
  for (const auto& n : held_notes) event("info", "frozen weights: " + n);
  model = std::make_unique<Model>(std::move(weights), mopt);
  if (o.mode == TrainMode::Lora) {
    adapter = std::make_unique<LoraAdapter>(init_lora(model->config(), o.lora, o.seed));
    if (!o.init_adapter.empty()) start_from_adapter(*adapter, o.init_adapter, model->config());
    adapter->base_model_name_or_path = o.base_model_name.empty() ? o.model_dir : o.base_model_name;
    model->attach_lora(*adapter);
  }
  model->set_training(true);
}

// The schedule (steps, data order), the safety monitor (train/safety_monitor.h; --max-memory auto
// on the CPU = its memory budget) and the memory plan: the micro-batch is picked before step 1
// (this fails when one sequence cannot fit).
void Trainer::State::plan_memory() {
  TrainOptions& o = opt;
  const int64_t steps_per_epoch =
      std::max<int64_t>(1, (static_cast<int64_t>(data.train.size()) + o.batch_size - 1) / o.batch_size);
  total_steps = o.steps > 0 ? o.steps : steps_per_epoch * std::max<int64_t>(1, o.epochs);
  cursor = std::make_unique<DataCursor>(static_cast<int64_t>(data.train.size()), o.seed, o.shuffle);
  safety = std::make_unique<SafetyMonitor>(o.monitor, [this](const nlohmann::json& r) {
    event(r.at("level").get<std::string>(), r.at("message").get<std::string>());
    record(r);
  });
  if (o.max_memory_auto) o.max_memory_bytes = safety->memory_budget_bytes(alloc->stats().bytes_in_use);
  alloc->set_limit(o.max_memory_bytes);
  TrainPlan plan = plan_training(o, *model, data, *alloc);
  event("info", plan.description);
  model->set_gradient_checkpointing(plan.gradient_checkpointing);
  oom = std::make_unique<OomRecovery>(o.batch_size, plan.micro_batch_size, o.oom_recovery, *alloc);
  if (!o.gradient_checkpointing && !plan.gradient_checkpointing)
    oom->set_relief([this]() -> std::string {  // auto turned it off: the first OOM turns it back on
      if (model->options().gradient_checkpointing) return {};
      model->set_gradient_checkpointing(true);
      return "gradient checkpointing turned on (auto)";
    });
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
  event("info", fmt::format("resumed from {} at step {} of {}", resume_from->path, step, total_steps));
}

// ---- the step -----------------------------------------------------------------------------------

Trainer::State::Batch Trainer::State::next_batch() {
  Batch b;
  b.start = cursor->state();
  b.ids = cursor->next(opt.batch_size);
  for (int64_t id : b.ids) {
    b.n_labels += sample_label_tokens(data.train[static_cast<size_t>(id)]);
    b.n_tokens += static_cast<int64_t>(data.train[static_cast<size_t>(id)].ids.size());
  }
  return b;
}

// Accumulates the step's gradients over micro-batches, inside OOM recovery (train/oom_recovery.h):
// an OOM drops the partial gradients and redoes the step with the same samples. The safety monitor
// looks in before each micro-batch; a stop there saves the last finished step. Returns the summed
// loss.
double Trainer::State::forward_backward(const Batch& batch) {
  const std::vector<int64_t>& ids = batch.ids;
  const float grad_scale = batch.n_labels ? 1.0f / static_cast<float>(batch.n_labels) : 0.0f;
  double loss_sum = 0;
  model->zero_grads();
  oom->run_step(
      static_cast<int64_t>(ids.size()),
      [&](int64_t b, int64_t e) {
        safety->between_micro_batches(
            step + 1, opt.oom_recovery && (oom->micro_seqs() > 1 || !model->options().gradient_checkpointing), [&] {
              cursor = std::make_unique<DataCursor>(static_cast<int64_t>(data.train.size()), opt.seed, opt.shuffle,
                                                    batch.start);
              save_checkpoint(std::nullopt);
            });
        inject_fault(FaultPoint::MicroBatch);
        std::vector<const Sample*> micro;
        for (int64_t i = b; i < e; ++i) micro.push_back(&data.train[static_cast<size_t>(ids[static_cast<size_t>(i)])]);
        uint64_t dropout_seed = opt.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) * 1000003ull +
                                static_cast<uint64_t>(ids[static_cast<size_t>(b)]);
        loss_sum += model->forward_backward(make_batch(micro), grad_scale, dropout_seed).loss_sum;
      },
      [&] {
        alloc->fail_after_allocations(0);
        model->zero_grads();
        loss_sum = 0;
      },
      [&](const OomEvent& ev) { report_oom(ev); });
  return loss_sum;
}

void Trainer::State::report_oom(const OomEvent& ev) {
  ++summary.oom_recoveries;
  record({{"type", "oom_recovery"},
          {"step", step + 1},
          {"code", ev.kind == OomKind::Adjacent ? "RUNTIME_OOM_ADJACENT" : "RUNTIME_GPU_OOM"},
          {"micro_batch_before", ev.micro_seqs_before},
          {"micro_batch_after", ev.micro_seqs_after},
          {"grad_accum_after", ev.accum_after},
          {"relief", ev.relief},
          {"bytes_in_use", ev.memory.bytes_in_use},
          {"message", ev.message}});
  const char* tag = ev.kind == OomKind::Adjacent ? "[RUNTIME_OOM_ADJACENT] " : "";
  if (!ev.relief.empty())
    event("warn", fmt::format("{}out of memory at step {}: {}, micro-batch stays {} sequences; redoing "
                              "the step with the same samples",
                              tag, step + 1, ev.relief, ev.micro_seqs_after));
  else
    event("warn", fmt::format("{}out of memory at step {}: micro-batch {} -> {} sequences, gradient "
                              "accumulation {}; redoing the step with the same samples",
                              tag, step + 1, ev.micro_seqs_before, ev.micro_seqs_after, ev.accum_after));
}

// Clips the gradients and checks loss and gradient norm. A non-finite one skips the update (false);
// too many in a row stop the run naming the dataset rows.
bool Trainer::State::clip_and_check(const Batch& batch, StepRecord& rec) {
  inject_fault(FaultPoint::Backward);
  rec.grad_norm = opt.max_grad_norm > 0 ? clip_grad_norm(grads, opt.max_grad_norm)
                                        : global_grad_norm(std::vector<const Tensor*>(grads.begin(), grads.end()));
  if (std::isfinite(rec.loss) && std::isfinite(rec.grad_norm)) {
    consecutive_nonfinite = 0;
    return true;
  }
  rec.skipped = true;
  ++summary.skipped_steps;
  ++consecutive_nonfinite;
  std::vector<int64_t> rows;
  for (int64_t id : batch.ids) rows.push_back(data.train[static_cast<size_t>(id)].source_line);
  record({{"type", "nonfinite"},
          {"step", rec.step},
          {"loss", std::isfinite(rec.loss) ? rec.loss : -1.0},
          {"grad_norm_finite", std::isfinite(rec.grad_norm)},
          {"dataset_rows", rows}});
  event("warn", fmt::format("non-finite {} at step {}: update skipped (dataset rows {})",
                            std::isfinite(rec.loss) ? "gradient norm" : "loss", rec.step, fmt::join(rows, ", ")));
  if (consecutive_nonfinite >= opt.nan_max_consecutive)
    throw Error(ErrorCode::RUNTIME_TRAINING_FAILED,
                fmt::format("[train] {} consecutive steps with non-finite loss or gradients (last at step {}, "
                            "dataset rows {})",
                            consecutive_nonfinite, rec.step, fmt::join(rows, ", ")),
                {{"step", rec.step}, {"dataset_rows", rows}})
        .with_suggestion(fmt::format("Lower the learning rate (now {}), keep --max-grad-norm on, and look at the "
                                     "data at the dataset rows named; resume with --resume latest.",
                                     opt.lr));
  return false;
}

void Trainer::State::update(const StepRecord& rec) {
  AdamWConfig acfg;
  acfg.lr = static_cast<float>(rec.lr);
  acfg.weight_decay = static_cast<float>(opt.weight_decay);
  adamw.step(params, acfg);
}

void Trainer::State::log_step(const Batch& batch, const StepRecord& rec) {
  ++step;
  summary.tokens += batch.n_tokens;
  summary.steps_done = step;
  summary.final_loss = rec.loss;
  summary.history.push_back(rec);
  record({{"type", "step"},
          {"step", rec.step},
          {"loss", rec.skipped ? nlohmann::json(nullptr) : nlohmann::json(rec.loss)},
          {"grad_norm", std::isfinite(rec.grad_norm) ? nlohmann::json(rec.grad_norm) : nlohmann::json(nullptr)},
          {"lr", rec.lr},
          {"tokens", rec.tokens},
          {"micro_batch_size", oom->micro_seqs()},
          {"grad_accum", oom->accumulation()},
          {"bytes_in_use", alloc->stats().bytes_in_use},
          {"bytes_peak", alloc->stats().bytes_peak},
          {"samples", batch.ids}});
  if (cb.on_step) cb.on_step(rec, summary, total_steps);
}

// Evaluation and checkpoints on their schedule; an interrupt saves a checkpoint and stops.
void Trainer::State::after_step() {
  std::optional<double> eval_loss;
  const bool last = step == total_steps;
  if (opt.eval_every > 0 && step % opt.eval_every == 0 && !last) {
    eval_loss = evaluate();
    if (eval_loss) record({{"type", "eval"}, {"step", step}, {"eval_loss", *eval_loss}});
  }
  const bool stopping =
      interrupt_requested() || (opt.stop_after_step_for_tests > 0 && step == opt.stop_after_step_for_tests);
  if ((opt.save_every > 0 && step % opt.save_every == 0) || stopping) save_checkpoint(eval_loss);
  inject_fault(FaultPoint::Checkpointed);
  if (stopping)
    throw Error(ErrorCode::RUNTIME_TRAINING_ABORTED,
                fmt::format("[train] interrupted by signal {} after step {} of {}; checkpoint saved in {}",
                            interrupt_signal(), step, total_steps, checkpoints->root()));
}

// ---- evaluate, save, finish ---------------------------------------------------------------------

// Mean loss over the held-out samples, dropout off; training mode comes back even when it throws.
std::optional<double> Trainer::State::evaluate() {
  if (data.eval.empty()) return std::nullopt;
  struct RestoreTraining {
    Model& m;
    ~RestoreTraining() { m.set_training(true); }
  } restore{*model};
  model->set_training(false);
  double loss_sum = 0;
  int64_t count = 0;
  const int64_t mb = std::max<int64_t>(1, oom->micro_seqs());
  for (size_t b = 0; b < data.eval.size(); b += static_cast<size_t>(mb)) {
    std::vector<const Sample*> batch;
    for (size_t i = b; i < std::min(data.eval.size(), b + static_cast<size_t>(mb)); ++i) batch.push_back(&data.eval[i]);
    inject_fault(FaultPoint::Eval);
    auto r = model->forward_loss(make_batch(batch));
    loss_sum += r.loss_sum;
    count += r.n_counted;
  }
  return count ? std::optional<double>(loss_sum / static_cast<double>(count)) : std::nullopt;
}

// The safety monitor checks the disk first (train/safety_monitor.h).
std::string Trainer::State::save_checkpoint(std::optional<double> eval_loss) {
  safety->before_checkpoint(checkpoints->root(), checkpoint_bytes_estimate(*model), step);
  auto json_or_null = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  nlohmann::json st = {{"step", step},
                       {"optimizer_step", adamw.steps_taken()},
                       {"micro_batch_size", oom->micro_seqs()},
                       {"grad_accum", oom->accumulation()},
                       {"cursor", cursor->state().to_json()},
                       {"run_id", summary.run_id},
                       {"seed", opt.seed},
                       {"mode", train_mode_name(opt.mode)},
                       {"tokens", summary.tokens},
                       {"oom_recoveries", summary.oom_recoveries},
                       {"skipped_steps", summary.skipped_steps},
                       {"eval_loss", json_or_null(eval_loss)},
                       {"best_eval_loss", json_or_null(summary.best_eval_loss)},
                       {"best_checkpoint", best_checkpoint}};
  nlohmann::json losses = nlohmann::json::array();
  for (const auto& h : summary.history) losses.push_back({{"step", h.step}, {"loss", h.loss}});
  st["loss_history"] = losses;
  Model& m = *model;
  std::string path = checkpoints->write(
      step,
      {{"trainable.safetensors", [&](const std::string& p) { write_safetensors(p, trainable_tensors(m)); }},
       {"optimizer.safetensors",
        [&](const std::string& p) {
          NamedTensors t;
          for (auto& [n, v] : adamw.state_tensors()) t.emplace_back(n, v);
          write_safetensors(p, t);
        }}},
      st);
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
    record({{"type", "eval"}, {"step", step}, {"eval_loss", *summary.final_eval_loss}});
    if (!summary.best_eval_loss || *summary.final_eval_loss < *summary.best_eval_loss)
      summary.best_eval_loss = summary.final_eval_loss;
  }
  save_checkpoint(summary.final_eval_loss);
  save_final_artifact();
  summary.micro_batch_size = oom->micro_seqs();
  summary.grad_accum = oom->accumulation();
  summary.gradient_checkpointing = model->options().gradient_checkpointing;
  summary.peak_memory_bytes = alloc->stats().bytes_peak;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_file_atomic((fs::path(opt.output_dir) / "summary.json").string(), summary.to_json().dump(2));
  alloc->set_limit(kNoLimit);
}

void Trainer::State::save_final_artifact() {
  if (opt.mode != TrainMode::Lora) {
    std::string dir = (fs::path(opt.output_dir) / "model").string();
    SaveModelOptions so;
    so.copy_files_from = tok_dir;
    save_hf_model(model->weights(), dir, so);
    summary.final_artifact = dir;
    return;
  }
  std::string dir = (fs::path(opt.output_dir) / "adapter").string();
  bool untouched = true;  // every lora_B still zero: the adapter is the identity
  for (const auto& layer : adapter->layers)
    for (int t = 0; t < kNumLoraTargets && untouched; ++t)
      if (layer.enabled[static_cast<size_t>(t)]) {
        const Tensor& b = layer.B[static_cast<size_t>(t)];
        const float* p = b.data<float>();
        for (int64_t i = 0; i < b.numel(); ++i)
          if (p[i] != 0.0f) {
            untouched = false;
            break;
          }
      }
  if (untouched)
    event("warn", fmt::format("the adapter saved to {} was never trained (no successful update): it leaves the "
                              "base model unchanged",
                              dir));
  save_peft_adapter(*adapter, dir);
  summary.final_artifact = dir;
}

// ---- fault injection (tests) ------------------------------------------------------------------

// The one hook of the fault_* options (training.fault_inject_* settings): what each point injects.
void Trainer::State::inject_fault(FaultPoint where) {
  const TrainOptions& o = opt;
  switch (where) {
    case FaultPoint::Start:  // crash points and a disk budget for the checkpoint writers
      if (!o.fault_crash_at.empty()) io_faults().crash_at = o.fault_crash_at;
      if (o.fault_enospc_after_bytes >= 0) io_faults().enospc_after_bytes = o.fault_enospc_after_bytes;
      break;
    case FaultPoint::MicroBatch:  // OOM: the micro-batch's first allocation fails
      if (step == o.fault_oom_step && fault_oom_left > 0) {
        --fault_oom_left;
        alloc->fail_after_allocations(1);
      }
      break;
    case FaultPoint::Backward:  // a NaN gradient
      if (std::find(o.fault_nan_steps.begin(), o.fault_nan_steps.end(), step + 1) != o.fault_nan_steps.end() &&
          !grads.empty() && grads[0]->numel() > 0)
        grads[0]->data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
      break;
    case FaultPoint::Eval:
      if (o.fault_eval_throw_at >= 0 && step == o.fault_eval_throw_at)
        throw Error(ErrorCode::RUNTIME_TRAINING_FAILED, "[train] injected failure inside evaluation");
      break;
    case FaultPoint::Checkpointed:  // a crash after the step (and its checkpoint)
      if (o.fault_crash_after_step > 0 && step == o.fault_crash_after_step) {
        spdlog::warn("[fault] crash injected after step {}", step);
        log::flush();
        ::kill(::getpid(), SIGKILL);
      }
      break;
  }
}

}  // namespace bp
