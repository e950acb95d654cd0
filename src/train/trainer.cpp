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
#include "core/record_file.h"
#include "core/threads.h"
#include "export/gguf_lora.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/held_weights.h"
#include "model/layer_hook.h"
#include "model/loader.h"
#include "model/merge.h"
#include "model/peft.h"
#include "ops/cpu_kernels.h"
#include "ops/device_compute.h"
#include "ops/dispatch.h"
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
#include "train/trainer_state.h"

namespace bp {

namespace fs = std::filesystem;

nlohmann::json TrainSummary::to_json() const {
  auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  return {{"run_id", run_id},
          {"output_dir", output_dir},
          {"final_artifact", final_artifact},
          {"final_gguf_adapter", final_gguf_adapter},
          {"steps", steps_done},
          {"tokens", tokens},
          {"seconds", seconds},
          {"final_loss", final_loss},
          {"initial_eval_loss", opt(initial_eval_loss)},
          {"final_eval_loss", opt(final_eval_loss)},
          {"best_eval_loss", opt(best_eval_loss)},
          {"peak_memory_bytes", peak_memory_bytes},
          {"planned_memory_bytes", planned_memory_bytes},
          {"base_dtype", base_dtype},
          {"matmul_dtype", matmul_dtype},
          {"oom_recoveries", oom_recoveries},
          {"skipped_steps", skipped_steps},
          {"micro_batch_size", micro_batch_size},
          {"grad_accum", grad_accum},
          {"gradient_checkpointing", gradient_checkpointing},
          {"world_size", world_size},
          {"comm_seconds", comm_seconds},  // the steps' time in collectives (0 in one process)
          {"comm_bytes", comm_bytes},
          {"records_lost", records_lost},  // records of the run files that could not be written (a full disk)
          {"records_lost_files", records_lost_files},
          {"method", method},
          {"initial_eval_metrics", initial_eval_metrics},
          {"final_eval_metrics", final_eval_metrics}};
}

Trainer::Trainer(TrainOptions options, TrainCallbacks callbacks) : s_(std::make_unique<State>()) {
  s_->opt = std::move(options);
  s_->cb = std::move(callbacks);
}
// The run's device memory goes with the trainer: its tensors with the state, then the GEMM workspace
// the device's allocator held for the run's GEMMs (ops/device_compute.h), so a later run in the
// same process starts from what was in use before this one.
Trainer::~Trainer() {
  Allocator* alloc = s_->alloc;
  s_.reset();
  if (alloc) ops::release_device_gemm_workspace(*alloc);
}
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
        if (adapter.layers[l].m(t).defined() != init.layers[l].m(t).defined())
          throw Error(ErrorCode::CONFIG_INVALID,
                      fmt::format("[train] the adapter in {} is {}a DoRA adapter, this run trains {}", dir,
                                  init.config.use_dora ? "" : "not ", adapter.config.use_dora ? "DoRA" : "plain LoRA"));
        if (adapter.layers[l].m(t).defined()) adapter.layers[l].m(t).copy_from(init.layers[l].m(t));
      }
  // Mixture-of-Experts: the experts' stacked A, B (DoRA: magnitudes) and the routers' A and B.
  auto copy = [&](Tensor& to, const Tensor& from, size_t l, const char* what) {
    if (!to.defined()) return;
    if (!from.defined() || from.shape() != to.shape())
      throw Error(ErrorCode::CONFIG_INVALID,
                  fmt::format("[train] the adapter in {} does not adapt layer {}'s {} as this run does", dir, l, what));
    to.copy_from(from);
  };
  for (size_t l = 0; l < adapter.layers.size(); ++l) {
    LoraLayer& to = adapter.layers[l];
    const LoraLayer& from = init.layers[l];
    for (size_t p = 0; p < 3; ++p) {
      copy(to.expert_A[p], from.expert_A[p], l, "experts");
      copy(to.expert_B[p], from.expert_B[p], l, "experts");
      copy(to.expert_M[p], from.expert_M[p], l, "experts' DoRA magnitudes");
    }
    copy(to.router_A, from.router_A, l, "router");
    copy(to.router_B, from.router_B, l, "router");
  }
}

// ---- the run ----------------------------------------------------------------------------------

// --device: where the model, its gradients, the optimizer state and the activations live. "cpu"
// trains on the CPU; "cuda" / "cuda:0" on the CUDA device when it has kernels (the CUDA dispatch
// table, ops/dispatch.h) and memory: a real card (cuda_status()) or a simulated one a test
// installed (core/allocator.h). Otherwise the run stops before any work with the reason, instead
// of quietly training on the CPU. One device: cuda:N with N > 0 is refused. "auto" (the default)
// is cuda:0 when both exist, else the CPU.
static Device training_device(const std::string& device) {
  const CudaStatus cs = cuda_status();
  const bool has_kernels = ops::kernels(DeviceType::CUDA).count > 0;
  const bool has_card = device_memory_installed(DeviceType::CUDA) || cs.usable();
  if (device == "auto") return has_kernels && has_card ? Device{DeviceType::CUDA, 0} : Device{};
  if (device.rfind("cuda", 0) != 0) return Device{};
  const bool index_ok = device == "cuda" || device == "cuda:0";
  if (has_kernels && has_card && index_ok) return Device{DeviceType::CUDA, 0};
  const std::string why = !index_ok                     ? "this version trains on one GPU, device 0 (cuda or cuda:0)"
                          : !has_kernels                ? "this build has no CUDA backend"
                          : !cs.why_unavailable.empty() ? cs.why_unavailable
                                                        : "no usable CUDA device";
  throw Error(ErrorCode::DEP_GPU_NOT_AVAILABLE, fmt::format("[train] --device {}: {}", device, why),
              {{"device", device}, {"cuda_compiled", cs.compiled}})
      .with_suggestion("Train on the CPU: --device cpu (or auto, the default).");
}

// A sticky CUDA error (RUNTIME_GPU_KERNEL_FAULT) leaves nothing on the device to save: the error
// names the newest checkpoint already on disk, the one --resume latest continues from.
static Error with_last_checkpoint(const Error& e, const CheckpointStore* store) {
  std::string where = "no checkpoint was saved before it (--save-every N saves one every N steps)";
  try {
    if (const auto last = store ? store->latest_valid() : std::nullopt)
      where = fmt::format("the last saved checkpoint is {} (step {}): continue from it with --resume latest",
                          last->path, last->step);
  } catch (const std::exception& ex) {
    where = fmt::format("the checkpoints could not be listed: {}", ex.what());
  }
  Error out(e.code(), fmt::format("{}; {}", e.what(), where), e.details());
  if (!e.suggestion().empty()) out.with_suggestion(e.suggestion());
  return out;
}

// run_impl with the run's status.json kept (train/run_history.h): running from the moment the
// output folder exists, then finished, interrupted or failed with the error code.
TrainSummary Trainer::run() {
  auto end_status = [this](const char* status, const std::string& code, const std::string& message) {
    // A run refused before it wrote anything (a resume that does not fit) leaves status.json alone.
    if (!s_->run_files_started || s_->opt.eval_only) return;
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
    // The device or another rank is lost: say what is saved.
    if (e.code() == ErrorCode::RUNTIME_GPU_KERNEL_FAULT || e.code() == ErrorCode::RUNTIME_DISTRIBUTED_RANK_LOST) {
      Error named = with_last_checkpoint(e, s_->checkpoints.get());
      end_status("failed", named.info().name, named.what());
      s_->mark_run_of_lost_writer(named);
      throw named;
    }
    end_status(e.code() == ErrorCode::RUNTIME_TRAINING_ABORTED ? "interrupted" : "failed", e.info().name, e.what());
    throw;
  } catch (const std::exception& e) {
    end_status("failed", "RUNTIME_INTERNAL", e.what());
    throw;
  }
}

// One optimizer step, as llm.c's train_gpt2.c shows it: next batch, forward/backward, clip and
// check, update (the schedule gives the step's learning rate), log; evaluation and checkpoints on
// their schedule. Setup and evaluation are the functions below; opening the run, resuming, saving and
// finishing are in trainer_checkpoints.cpp.
TrainSummary Trainer::run_impl() {
  State& s = *s_;
  s.t0 = std::chrono::steady_clock::now();
  assign_rank_gpu(s.opt.device);  // one GPU per rank (trainer_distributed.cpp), before CUDA starts
  s.device = training_device(s.opt.device);
  if (!s.opt.model_dir.empty()) check_model_dir(s.opt.model_dir);  // explains hub names before the tokenizer is read
  set_num_threads(s.opt.threads);
  s.inject_fault(State::FaultPoint::Start);
  s.alloc = &allocator_for(s.device);
  s.summary.method = train_method_name(s.opt.method);
  s.opt.pref.reference = resolve_reference(s.opt);
  s.start_distributed();  // one rank, or this rank of mpirun / srun (trainer_distributed.cpp)
  s.open_run();
  s.load_data();
  s.build_model();
  s.plan_memory();
  s.init_optimizer();  // whole, or this rank's ZeRO-1 share (trainer_distributed.cpp)
  s.check_ranks_agree();
  if (s.resume_from) {
    s.check_resume();
    s.start_run_files();
    s.resume();
  } else {
    s.precompute_reference();
    s.summary.initial_eval_loss = s.evaluate();
    if (s.summary.initial_eval_loss) {
      s.record(s.eval_record(0, *s.summary.initial_eval_loss));
      s.summary.initial_eval_metrics = s.eval_metrics_json();
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
  s.start_overlap();       // training.overlap_communication (trainer_distributed.cpp)
  struct ClearLayerHook {  // the hook (model/layer_hook.h) is this thread's: gone with the run
    ~ClearLayerHook() { set_layer_backward_hook(nullptr); }
  } clear_layer_hook;
  s.fault_oom_left = s.opt.fault_oom_repeat;

  while (s.step < s.total_steps) {
    s.step_comm_start = comm_totals();  // what the step's collectives cost (log_step)
    s.step_start = std::chrono::steady_clock::now();
    const State::Batch batch = s.next_batch();
    StepRecord rec;
    rec.step = s.step + 1;
    rec.tokens = batch.n_tokens;
    rec.sample_ids = batch.ids;
    const double loss_sum = s.forward_backward_all_ranks(batch);
    if (method_is_preference(s.opt.method)) {
      rec.loss = loss_sum;  // already the step's mean (train/preference.h)
      nlohmann::json m = nlohmann::json::object();
      s.pref.step_metrics.write(m, "");
      for (auto& [k, v] : m.items()) rec.metrics.emplace_back(k, v.get<double>());
    } else {
      rec.loss = batch.n_labels ? loss_sum / static_cast<double>(batch.n_labels) : 0.0;
    }
    if (s.model->config().is_moe() && s.aux_micro_batches > 0)  // the load-balancing loss, mean of the micro-batches'
      rec.metrics.emplace_back("aux_loss", s.aux_loss_sum / static_cast<double>(s.aux_micro_batches));
    rec.lr = lr_at_step(s.opt.lr_scheduler, s.opt.lr, s.step, s.opt.warmup_steps, s.total_steps);
    if (s.clip_and_check(batch, rec)) s.update(rec);
    s.log_step(batch, rec);
    s.after_step();
  }
  s.finish();
  return s.summary;
}

// ---- setup ------------------------------------------------------------------------------------

void Trainer::State::load_data() {
  TrainOptions& o = opt;
  tok_dir = !o.tokenizer_dir.empty() ? o.tokenizer_dir
            : !o.model_dir.empty()   ? o.model_dir
                                     : fs::path(o.init_from_config).parent_path().string();
  tokenizer = Tokenizer::from_dir(tok_dir);
  parse_task_metrics();
  data = build_train_data(o, *tokenizer);
  event("info", "chat template: " + data.chat_template.describe());
  if (run_files_started) write_run_settings();  // now with the template used
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
  prepare_task_metrics();
}

namespace {
Error refuse_eval_metric(const std::string& why) {
  return Error(ErrorCode::CONFIG_INVALID_SETTING, "[train] --eval-metric " + why);
}
}  // namespace

// --eval-metric: greedy answers to held-out conversations need an SFT run (checked with the names
// before the data is read), held-out rows and rows with an assistant answer (after): each refused
// before the model is built.
void Trainer::State::parse_task_metrics() {
  if (opt.eval_metrics.empty()) return;
  if (method_is_preference(opt.method))
    throw refuse_eval_metric(
        fmt::format("scores greedy answers of an SFT run; --method {} logs its own eval metrics "
                    "(eval_rewards/accuracies, ...)",
                    train_method_name(opt.method)));
  task_metrics = parse_eval_metrics({opt.eval_metrics});
}

void Trainer::State::prepare_task_metrics() {
  if (task_metrics.empty()) return;
  auto refuse = refuse_eval_metric;
  if (data.eval_conversations.empty())
    throw refuse("needs held-out rows: set --holdout above 0 or give --eval-data")
        .with_suggestion("With --holdout 0.1 a tenth of the rows are held out; --eval-data FILE uses a file.");
  std::vector<Conversation> convs;
  for (const Conversation& c : data.eval_conversations) {
    if (static_cast<int64_t>(convs.size()) == opt.eval_metric_examples) break;
    if (c.empty())
      throw refuse(
          fmt::format("compares answers with each held-out row's last assistant turn, and the rows of {} "
                      "are plain text",
                      opt.eval_data_path.empty() ? opt.data_path : opt.eval_data_path));
    convs.push_back(c);
  }
  task_examples = task_examples_from_conversations(convs);
}

void Trainer::State::evaluate_task_metrics() {
  const EvalValues v = evaluate_metrics(*model, *tokenizer, *data.eval_template, task_examples, task_metrics,
                                        {.max_new_tokens = opt.eval_max_new_tokens, .max_examples = 0});
  task_values = nlohmann::json::object();
  for (size_t k = 0; k < task_metrics.size(); ++k)
    task_values["eval_" + task_metrics[k].label()] = metric_estimate(task_metrics[k], v, k, 0, 0).value;
}

const nlohmann::json& Trainer::State::eval_metrics_json() const {
  return method_is_preference(opt.method) ? pref.eval_metrics : task_values;
}

void Trainer::State::build_model() {
  const TrainOptions& o = opt;
  ModelOptions mopt;
  mopt.mode = o.mode;
  mopt.gradient_checkpointing = o.gradient_checkpointing.value_or(true);
  mopt.router_aux_loss_coef = static_cast<float>(o.router_aux_loss_coef);
  std::vector<std::string> held_notes;
  const std::optional<DType> base =
      o.mode == TrainMode::Full ? DType::F32
                                : resolve_base_dtype(o.base_dtype, device.type, !gguf_base_file(o.model_dir).empty());
  ModelWeights weights = !o.init_from_config.empty()
                             ? init_random_weights(ModelConfig::from_file(o.init_from_config), o.seed)
                             : load_model(o.model_dir, base, &held_notes);
  if (!o.init_from_config.empty() && base && *base != DType::F32)  // random weights (benchmarks) held as asked
    held_notes = hold_weights(weights, *base);
  for (const auto& n : held_notes) event("info", "frozen weights: " + n);
  summary.base_dtype = describe_held_weights(weights, o.mode == TrainMode::Full ? "f32" : o.base_dtype);
  model = std::make_unique<Model>(std::move(weights), mopt);
  warn_beyond_context();
  const DType matmul = matmul_dtype();
  if (device.type != DeviceType::CPU) {  // loaded (and held in their type) on the host, then copied over
    bool frozen_narrow = false;          // some GEMM runs on bf16 inputs (ops/device_compute.h)
    for (auto& [name, t] : model->named_weights()) {
      // The CUDA kernels read f32, bf16, f16 and every block type (backend/cuda/dequant.cuh).
      const DType held = t->dtype();
      frozen_narrow = frozen_narrow || held != DType::F32;
      if (!ops::cuda_reads_held_type(held))
        throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                    fmt::format("[train] --device {}: frozen weights held as {} ({}) have no CUDA kernels yet",
                                opt.device, dtype_name(held), name))
            .with_suggestion("Hold them as bf16 or f32 (--base-dtype bf16), or train on the CPU (--device cpu).");
      *t = t->to(device);
    }
    model->allocate_grads();  // full mode: the gradients beside the weights
    event("info", fmt::format("training on {} ({})", device.name(),
                              ops::cuda_compute_description(frozen_narrow, matmul == DType::BF16)));
    if (const auto wide = frozen_weights_outside_f16(model->weights()); !wide.empty())  // f16 cards only
      event("warn", describe_f16_fallback(wide));
  } else {  // which engine and dtype each GEMM kind runs in (backend/cpu/gemm_engine.h)
    bool frozen_bf16 = matmul == DType::BF16;  // the bf16 GEMM copies take the same path
    for (auto& [name, t] : model->named_weights()) frozen_bf16 = frozen_bf16 || t->dtype() == DType::BF16;
    event("info", fmt::format("training on the CPU ({})", ops::cpu_gemm_description(frozen_bf16)));
  }
  model->set_matmul_dtype(matmul);  // the bf16 GEMM copies, made where the weights now live
  summary.matmul_dtype = dtype_name(matmul);
  if (matmul == DType::BF16)
    event("info", fmt::format("full fine-tuning GEMMs on bf16 copies of the f32 weights (--matmul-dtype {}): "
                              "masters, gradients and AdamW state stay f32{}",
                              o.matmul_dtype,
                              device.type == DeviceType::CPU ? "; on the CPU this is slower than f32 GEMMs" : ""));
  if (o.mode == TrainMode::Lora) {
    adapter = std::make_unique<LoraAdapter>(init_lora(model->config(), o.lora, o.seed));
    init_dora_magnitudes(*adapter, model->weights());  // DoRA: m = the base rows' norms
    if (o.lora.pissa() && method_needs_reference(o.method))
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  "[train] --init-lora-weights pissa with a method that compares to a reference (dpo, kto): the "
                  "reference is the model with the adapter off, which under PiSSA is the residual, not the base")
          .with_suggestion("Use the default --init-lora-weights true with dpo and kto, or orpo/simpo with pissa.");
    if (o.lora.pissa() && !o.init_adapter.empty())
      throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                  "[train] --init-lora-weights pissa starts A and B from the base's singular vectors; it cannot "
                  "also start from an adapter (multi-run, --init-adapter)");
    // PiSSA: A, B from the SVD (the fast one from the seed: a resume redoes it), the base replaced by the residual
    init_pissa(*adapter, model->weights(), o.seed);
    if (!o.init_adapter.empty()) start_from_adapter(*adapter, o.init_adapter, model->config());
    if (device.type != DeviceType::CPU)  // initialised on the host (seeded), trained on the device
      copy_adapter_tensors(*adapter, [&](const Tensor& t) { return t.to(device); });
    adapter->base_model_name_or_path = o.base_model_name.empty() ? o.model_dir : o.base_model_name;
    model->attach_lora(*adapter);
  }
  model->set_training(true);
}

// Samples longer than the model's context (max_position_embeddings) train positions its makers never
// did (RoPE runs on, as in transformers, which warns the same way): said once, with the cure.
void Trainer::State::warn_beyond_context() {
  int64_t longest = 0;
  for (const std::vector<Sample>* set : {&data.train, &data.eval})
    for (const Sample& smp : *set) longest = std::max<int64_t>(longest, static_cast<int64_t>(smp.ids.size()));
  const int64_t ctx = model->config().max_position_embeddings;
  if (ctx > 0 && longest > ctx)
    event("warn", fmt::format("the longest sample has {} tokens, more than the model's context of {} "
                              "(max_position_embeddings): positions past {} were never trained and may "
                              "behave badly; --max-seq-length {} cuts samples there",
                              longest, ctx, ctx, ctx));
}

// training.matmul_dtype for this run (train_options.h resolve_matmul_dtype).
DType Trainer::State::matmul_dtype() const {
  const bool f16_card = device.type == DeviceType::CUDA && ops::cuda_frozen_gemms_in_f16();
  return resolve_matmul_dtype(opt.matmul_dtype, opt.mode, device.type, f16_card, device.name());
}

// The schedule (steps, data order), the safety monitor (train/safety_monitor.h; --max-memory auto
// on the CPU = its memory budget) and the memory plan: the micro-batch is picked before step 1
// (this fails when one sequence cannot fit).
void Trainer::State::plan_memory() {
  TrainOptions& o = opt;
  total_steps = total_optimizer_steps(o, static_cast<int64_t>(data.train.size()));
  cursor = std::make_unique<DataCursor>(static_cast<int64_t>(data.train.size()), o.seed, o.shuffle);
  safety = std::make_unique<SafetyMonitor>(o.monitor, [this](const nlohmann::json& r) {
    event(r.at("level").get<std::string>(), r.at("message").get<std::string>());
    record(r);
  });
  if (comm->world() > 1)  // temperatures decided by every rank together (forward_backward_all_ranks)
    safety->set_rank_gather([this](int64_t v) { return comm->all_gather(v); });
  // --max-memory auto: the machine's RAM budget on the CPU; on a card, what it can give now: its
  // free memory (cudaMemGetInfo) minus a headroom, plus what the allocator already holds (in use and
  // cached), enforced so the plan picks a micro-batch that fits before step 1 instead of the first
  // step running out. The headroom (monitor.memory_headroom; auto = 5% of the free memory) is for
  // what the plan cannot see: kernels and cuBLASLt's own memory loaded on first use, the free
  // part of the caching allocator's partly used segments (2 or 20 MiB each), and the driver's
  // rounding of each cudaMalloc.
  if (o.max_memory_auto) {
    const MemoryStats ms = alloc->stats();
    const size_t card_free = alloc->device_free_bytes();
    if (device.type == DeviceType::CPU) {
      o.max_memory_bytes = safety->memory_budget_bytes(ms.bytes_in_use);
    } else if (card_free == kNoLimit) {
      o.max_memory_bytes = kNoLimit;
    } else {
      const size_t headroom =
          o.monitor.memory_headroom_bytes >= 0 ? static_cast<size_t>(o.monitor.memory_headroom_bytes) : card_free / 20;
      const size_t held = ms.bytes_in_use + ms.bytes_cached;
      o.max_memory_bytes = held + (card_free > headroom ? card_free - headroom : 0);
      event("info", fmt::format("--max-memory auto on the card: {} ({} free, minus {} headroom, plus {} already held)",
                                format_bytes(o.max_memory_bytes), format_bytes(card_free), format_bytes(headroom),
                                format_bytes(held)));
    }
  }
  alloc->set_limit(o.max_memory_bytes);
  TrainPlan plan = plan_training(o, *model, data, *alloc);
  event("info", plan.description);
  summary.planned_memory_bytes = plan.plan.total();
  model->set_gradient_checkpointing(plan.gradient_checkpointing);
  oom = std::make_unique<OomRecovery>(local_batch_size(), plan.micro_batch_size, o.oom_recovery, *alloc);
  if (!o.gradient_checkpointing && !plan.gradient_checkpointing)
    oom->set_relief([this]() -> std::string {  // auto turned it off: the first OOM turns it back on
      if (model->options().gradient_checkpointing) return {};
      model->set_gradient_checkpointing(true);
      return "gradient checkpointing turned on (auto)";
    });
}

// ---- the step -----------------------------------------------------------------------------------

Trainer::State::Batch Trainer::State::next_batch() {
  Batch b;
  b.start = cursor->state();
  b.ids = cursor->next(opt.batch_size);
  b.local_ids = local_share(b.ids);
  for (int64_t id : b.ids) {
    b.n_labels += sample_label_tokens(data.train[static_cast<size_t>(id)]);
    b.n_tokens += sample_tokens(data.train[static_cast<size_t>(id)]);
  }
  return b;
}

// Accumulates the step's gradients over micro-batches, inside OOM recovery (train/oom_recovery.h):
// an OOM drops the partial gradients and redoes the step with the same samples. The safety monitor
// looks in before each micro-batch; a stop there saves the last finished step. Returns the summed
// loss.
double Trainer::State::forward_backward(const Batch& batch) {
  const std::vector<int64_t>& ids = batch.local_ids;
  const float grad_scale = batch.n_labels ? 1.0f / static_cast<float>(batch.n_labels) : 0.0f;
  const bool preference = method_is_preference(opt.method);
  PreferenceStep ps;
  if (preference) ps = begin_preference_step(batch);
  double loss_sum = 0;
  aux_loss_sum = 0;
  aux_micro_batches = 0;
  int64_t last_example = -1;  // the first example of the micro-batch being run (preference methods)
  model->zero_grads();
  try {
    oom->run_step(
        static_cast<int64_t>(ids.size()),
        [&](int64_t b, int64_t e) {
          safety->between_micro_batches(
              step + 1, opt.oom_recovery && (oom->micro_seqs() > 1 || !model->options().gradient_checkpointing),
              [&] { save_last_finished_step(batch); });
          if (overlap && e == static_cast<int64_t>(ids.size())) overlap->arm();  // the step's last micro-batch
          inject_fault(FaultPoint::MicroBatch);
          comm->check_peers();  // a rank gone during a long step is noticed before the all-reduce
          uint64_t dropout_seed = opt.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) * 1000003ull +
                                  static_cast<uint64_t>(ids[static_cast<size_t>(b)]);
          if (preference) {
            last_example = ids[static_cast<size_t>(b)];
            preference_micro_batch(std::vector<int64_t>(ids.begin() + b, ids.begin() + e), ps, dropout_seed);
            return;
          }
          std::vector<const Sample*> micro;
          for (int64_t i = b; i < e; ++i)
            micro.push_back(&data.train[static_cast<size_t>(ids[static_cast<size_t>(i)])]);
          loss_sum += model->forward_backward(make_batch(micro), grad_scale, dropout_seed).loss_sum;
          aux_loss_sum += model->last_aux_loss();
          ++aux_micro_batches;
        },
        [&] {
          if (overlap) overlap->abandon();  // the round's remaining collectives still run (grad_overlap.h)
          alloc->fail_after_allocations(0);
          model->zero_grads();
          loss_sum = 0;
          aux_loss_sum = 0;
          aux_micro_batches = 0;
          ps.loss = 0;
          ps.metrics = PreferenceMetrics{};
        },
        [&](const OomEvent& ev) { report_oom(ev); });
  } catch (const Error& e) {
    // One example alone does not fit: say which (its row and sizes), never truncate it silently.
    if (!preference || e.code() != ErrorCode::RUNTIME_OOM_RECOVERY_EXHAUSTED || last_example < 0) throw;
    const Sample& s = data.train[static_cast<size_t>(last_example)];
    throw Error(e.code(),
                fmt::format("{}; the example that does not fit alone is line {} of {} ({} tokens{})", e.what(),
                            s.source_line, opt.data_path, s.ids.size(),
                            s.is_pair() ? fmt::format(" chosen, {} rejected, in one micro-batch", s.rejected_ids.size())
                                        : std::string()),
                e.details())
        .with_suggestion(
            "Lower --max-seq-length (a pair's two sequences are trained together), turn on "
            "--gradient-checkpointing, or leave that row out of the data.");
  }
  if (!preference) return loss_sum;
  pref.step_metrics = ps.metrics;
  return ps.loss;
}

// The safety monitor's stop, in the middle of a step: the checkpoint of the step before it (the
// data cursor back at the step's start). Data-parallel, every rank stays until rank 0 has written
// it (as after an interrupt).
void Trainer::State::save_last_finished_step(const Batch& batch) {
  cursor = std::make_unique<DataCursor>(static_cast<int64_t>(data.train.size()), opt.seed, opt.shuffle, batch.start);
  save_checkpoint(std::nullopt);
  if (comm->world() > 1) comm->barrier(opt.distributed_timeout_s);
}

void Trainer::State::report_oom(const OomEvent& ev) {
  ++summary.oom_recoveries;
  record({{"type", "oom_recovery"},
          {"step", step + 1},
          {"code", ev.kind == OomKind::Adjacent
                       ? "RUNTIME_OOM_ADJACENT"
                       : error_info(out_of_memory_code(alloc->device().type == DeviceType::CPU)).name},
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
  rec.grad_norm = gradient_norm();  // over the ranks' shards when data-parallel (trainer_distributed.cpp)
  if (opt.max_grad_norm > 0) clip_to_norm(grads, opt.max_grad_norm, rec.grad_norm);
  if (!on_any_rank(!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm))) {
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
  adamw.step(params, acfg);  // rewrites the bf16 GEMM copies too (params' gemm_copy)
}

void Trainer::State::log_step(const Batch& batch, const StepRecord& rec) {
  ++step;
  summary.tokens += batch.n_tokens;
  summary.steps_done = step;
  summary.final_loss = rec.loss;
  summary.history.push_back(rec);
  nlohmann::json step_record = {
      {"type", "step"},
      {"step", rec.step},
      {"loss", rec.skipped ? nlohmann::json(nullptr) : nlohmann::json(rec.loss)},
      {"grad_norm", std::isfinite(rec.grad_norm) ? nlohmann::json(rec.grad_norm) : nlohmann::json(nullptr)},
      {"lr", rec.lr},
      {"tokens", rec.tokens},
      {"micro_batch_size", oom->micro_seqs()},
      {"grad_accum", oom->accumulation()},
      {"bytes_in_use", alloc->stats().bytes_in_use},
      {"bytes_peak", alloc->stats().bytes_peak},
      {"samples", batch.ids}};
  for (const auto& [k, v] : rec.metrics) step_record[k] = v;
  if (comm->world() > 1) {
    // The step's time in collectives (core/collective.h CommTotals): all of them, the gradients'
    // reduction, ZeRO-1's parameter all-gather (the rest: the small agreements), and the payload
    // bytes this rank sent. One process has no collectives and records none of these.
    const CommTotals c = comm_totals() - step_comm_start;
    const auto g = static_cast<int>(CommKind::Gradients), p = static_cast<int>(CommKind::Parameters);
    step_record["step_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    step_record["comm_s"] = c.total_seconds();
    step_record["comm_bytes"] = c.total_bytes();
    step_record["comm_gradient_s"] = c.seconds[g];
    step_record["comm_gradient_bytes"] = c.bytes[g];
    step_record["comm_parameter_s"] = c.seconds[p];
    step_record["comm_parameter_bytes"] = c.bytes[p];
    if (overlap && !overlap->backward.empty()) {
      // The overlap's profile: seconds since the last micro-batch began, each layer's backward and
      // each reduction ([layer, begin, end]; layer -1: what no layer owns), the time they overlapped
      // and the time the step waited for the reductions after the backward.
      auto rows = [](const std::vector<GradientOverlap::Interval>& v) {
        nlohmann::json a = nlohmann::json::array();
        for (const auto& i : v) a.push_back({i.layer, i.begin, i.end});
        return a;
      };
      step_record["comm_overlap_s"] = overlap->overlap_s();
      step_record["comm_wait_s"] = overlap->wait_s;
      step_record["overlap_profile"] = {{"backward", rows(overlap->backward)},
                                        {"reductions", rows(overlap->reductions)}};
    }
    summary.comm_seconds += c.total_seconds();
    summary.comm_bytes += c.total_bytes();
  }
  record(std::move(step_record));
  if (cb.on_step) cb.on_step(rec, summary, total_steps);
}

// What stopped the run, for its message: the signal, or (data-parallel) another rank's.
static std::string interrupt_cause() {
  const int sig = interrupt_signal();
  if (sig == SIGUSR1)
    return fmt::format("signal {} (SIGUSR1: the launcher's stop, which mpirun forwards to every rank)", sig);
  return sig ? fmt::format("signal {}", sig) : std::string("a signal another rank received");
}

// Evaluation and checkpoints on their schedule; an interrupt saves a checkpoint and stops.
void Trainer::State::after_step() {
  std::optional<double> eval_loss;
  const bool last = step == total_steps;
  if (opt.eval_every > 0 && step % opt.eval_every == 0 && !last) {
    eval_loss = evaluate();
    if (eval_loss) record(eval_record(step, *eval_loss));
  }
  const bool stopping = on_any_rank(interrupt_requested() ||
                                    (opt.stop_after_step_for_tests > 0 && step == opt.stop_after_step_for_tests));
  if ((opt.save_every > 0 && step % opt.save_every == 0) || stopping) save_checkpoint(eval_loss);
  inject_fault(FaultPoint::Checkpointed);
  // Every rank stops only once rank 0 has written the checkpoint: a rank that exits first makes the
  // launcher end the others, rank 0 in the middle of its write among them.
  if (stopping && comm->world() > 1) comm->barrier(opt.distributed_timeout_s);
  if (stopping)
    throw Error(ErrorCode::RUNTIME_TRAINING_ABORTED,
                fmt::format("[train] interrupted by {} after step {} of {}; checkpoint saved in {}", interrupt_cause(),
                            step, total_steps, checkpoints->root()));
}

// ---- evaluate (saving and finishing: trainer_checkpoints.cpp) ------------------------------------

// Mean loss over the held-out samples, dropout off; training mode comes back even when it throws.
std::optional<double> Trainer::State::evaluate() {
  if (data.eval.empty()) return std::nullopt;
  struct RestoreTraining {
    Model& m;
    ~RestoreTraining() { m.set_training(true); }
  } restore{*model};
  model->set_training(false);
  if (method_is_preference(opt.method)) return preference_evaluate();
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
  if (!task_metrics.empty()) evaluate_task_metrics();
  return count ? std::optional<double>(loss_sum / static_cast<double>(count)) : std::nullopt;
}

nlohmann::json Trainer::State::eval_record(int64_t at_step, double eval_loss) const {
  nlohmann::json j = {{"type", "eval"}, {"step", at_step}, {"eval_loss", eval_loss}};
  for (auto& [k, v] : eval_metrics_json().items()) j[k] = v;
  return j;
}

// ---- fault injection (tests) ------------------------------------------------------------------

// The one hook of the fault_* options (training.fault_inject_* settings): what each point injects.
void Trainer::State::inject_fault(FaultPoint where) {
  const TrainOptions& o = opt;
  switch (where) {
    case FaultPoint::Start:  // crash points and a disk budget for the checkpoint writers
      if (!o.fault_crash_at.empty()) io_faults().crash_at = o.fault_crash_at;
      if (o.fault_enospc_after_bytes >= 0) io_faults().enospc_after_bytes = o.fault_enospc_after_bytes;
      if (o.fault_records_enospc_after_bytes >= 0)  // and one for the run's records (core/record_file.h)
        record_write_faults() = {o.fault_records_enospc_after_bytes, o.fault_records_failing_writes, ENOSPC};
      break;
    case FaultPoint::MicroBatch:  // OOM: the micro-batch's first allocation fails
      if (step == o.fault_oom_step && fault_oom_left > 0 && (o.fault_rank < 0 || o.fault_rank == comm->rank())) {
        --fault_oom_left;
        alloc->fail_after_allocations(1);
      }
      break;
    case FaultPoint::Backward:  // a NaN gradient, in the first value this rank holds summed (ZeRO-1: its chunk)
      if (std::find(o.fault_nan_steps.begin(), o.fault_nan_steps.end(), step + 1) != o.fault_nan_steps.end() &&
          !grads.empty() && grads[0]->numel() > 0 && (o.fault_rank < 0 || o.fault_rank == comm->rank())) {
        const bool shard = adamw.sharded() && !adamw.owned_runs().empty();
        Tensor* t = shard ? grads[adamw.owned_runs()[0].param] : grads[0];
        Tensor g = host_readable(*t);  // through a copy when the gradients live on a device
        g.data<float>()[shard ? adamw.owned_runs()[0].offset : 0] = std::numeric_limits<float>::quiet_NaN();
        if (t->device().type != DeviceType::CPU) t->copy_from(g);
      }
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
      if (o.fault_hang_after_step > 0 && step == o.fault_hang_after_step &&
          (o.fault_rank < 0 || o.fault_rank == comm->rank())) {  // a hung rank: an interrupt or a kill ends it
        spdlog::warn("[fault] rank {} hangs after step {}", comm->rank(), step);
        log::flush();
        while (!interrupt_requested()) ::usleep(10000);
      }
      break;
  }
}

}  // namespace bp
