// The Trainer's data-parallel side (DESIGN.md "Distributed"; core/collective.h): N ranks, each
// holding the whole model, train one run together.
//   - Each optimizer step's sequences (the global --batch-size, from the one seeded data cursor
//     every rank runs identically) are cut into N contiguous shares, rank r taking
//     [B·r/N, B·(r+1)/N): disjoint, deterministic, together the step a single process takes.
//   - Every rank scales its gradients by 1/(label tokens of the whole global batch), as the single
//     process does, so the sum over ranks is the single process's gradient; the sum (the
//     Collective's rank-ordered all-reduce) happens once per step, after the micro-batches and
//     before clipping. Loss sums are added in rank order too, so the loss is the global one.
//   - After the all-reduce every rank holds the same gradient bits, so clipping, the NaN guard's
//     skip and the update agree by construction; a rank's own non-finite values are still made a
//     global decision (any()), as are the stop (interrupt) and OOM recovery: a rank that ran out of
//     memory changed its micro-batch (or turned gradient checkpointing on), and every rank redoes
//     the step with the smallest micro-batch any rank has (and checkpointing if any has it).
//   - Rank 0 alone writes the run folder (metrics, checkpoints after a barrier, adapter, summary);
//     the others compute the same state and write nothing.
//   - At the start the ranks compare hashes of their settings, model weights and training data and
//     refuse to train on a mismatch (CONFIG_DISTRIBUTED_MISMATCH).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <type_traits>

#include "core/collective.h"
#include "core/log.h"
#include "core/uuid.h"
#include "model/layer_hook.h"
#include "ops/collective_nccl.h"
#include "ops/optim.h"
#include "train/resume.h"
#include "train/run_history.h"
#include "train/trainer_state.h"

namespace bp {

namespace {

// A 64-bit hash of bytes, 8 at a time (not cryptographic: it tells copies apart, fast enough to run
// over every weight at the start of a run).
struct Hash64 {
  uint64_t h = 0x243F6A8885A308D3ull;
  void add(const void* data, size_t n) {
    if (n == 0) {  // an empty vector's data() may be null
      mix(0);
      return;
    }
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix(w);
    }
    uint64_t tail = 0;
    if (n > i) std::memcpy(&tail, p + i, n - i);
    mix(tail ^ (static_cast<uint64_t>(n) << 56));
  }
  void add(const std::string& s) { add(s.data(), s.size()); }
  void mix(uint64_t w) {
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
};

void hash_tensor(Hash64& h, const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return;
  const Tensor host = t.device().type == DeviceType::CPU ? t : t.to(Device{});
  h.add(host.raw(), host.nbytes());
}

// Settings that may differ between ranks without changing the training: paths (another node may
// mount the model and data elsewhere: their contents are hashed instead), threads, and how the
// ranks talk.
bool rank_local_setting(const std::string& section, const std::string& key) {
  static const char* const kLocal[] = {"model.path",
                                       "data.path",
                                       "data.eval_path",
                                       "training.output",
                                       "training.resume",
                                       "training.threads",
                                       "training.mpi_library",
                                       "training.nccl_library",
                                       "training.init_adapter",
                                       "training.distributed_timeout",
                                       "training.max_memory",
                                       "training.nproc"};
  const std::string full = section + "." + key;
  return std::any_of(std::begin(kLocal), std::end(kLocal), [&](const char* k) { return full == k; });
}

}  // namespace

// One rank per GPU: a CUDA run (--device cuda or auto) of several ranks whose launcher says this
// process's local rank, with CUDA_VISIBLE_DEVICES unset, sees the GPU of its local rank as device 0.
// Before anything starts CUDA (the runtime reads the variable once); only when the host has that
// many NVIDIA GPUs (/proc/driver/nvidia/gpus, read without starting CUDA): otherwise the ranks share
// device 0 as before.
void assign_rank_gpu(const std::string& device) {
  const LaunchInfo li = launch_from_environment();
  if (li.world <= 1 || li.local_rank < 0 || std::getenv("CUDA_VISIBLE_DEVICES")) return;
  if (device != "auto" && device.rfind("cuda", 0) != 0) return;
  std::error_code ec;
  int gpus = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++gpus;
  if (li.local_rank < gpus) ::setenv("CUDA_VISIBLE_DEVICES", std::to_string(li.local_rank).c_str(), 0);
}

// Before the run folder is opened: which rank this is, and what a data-parallel run cannot do yet.
void Trainer::State::start_distributed() {
  comm = &process_collective(opt.distributed, opt.mpi_library);
  summary.world_size = comm->world();
  if (comm->world() > 1 && device.type == DeviceType::CUDA && opt.nccl_library != "none") {
    // One rank per GPU: the gradients summed GPU to GPU over NCCL (ops/collective_nccl.h).
    try {
      device_comm = make_nccl_collective(*comm, device, opt.nccl_library);
      comm = device_comm.get();
    } catch (const Error& e) {
      if (!opt.nccl_library.empty() || e.code() != ErrorCode::DEP_DISTRIBUTED_UNAVAILABLE) throw;
      event("warn", fmt::format("{}: the gradients go through the host over MPI instead (slower; "
                                "training.nccl_library none says so without this warning)",
                                e.what()));
    }
  }
  writer = comm->rank() == 0;
  opt.optimizer_shards = comm->world() > 1 && opt.shard_optimizer.value_or(true) ? comm->world() : 1;
  if (comm->world() == 1) return;
  const int w = comm->world();
  if (opt.batch_size < w)
    throw Error(ErrorCode::CONFIG_DISTRIBUTED_MISMATCH,
                fmt::format("[train] --batch-size {} is smaller than the {} ranks: every rank needs at least one "
                            "sequence of each step",
                            opt.batch_size, w),
                {{"batch_size", opt.batch_size}, {"world", w}})
        .with_suggestion(fmt::format("Use --batch-size {} or more (the global batch: it means the same at any rank "
                                     "count), or fewer ranks.",
                                     w));
  if (opt.eval_only)
    throw Error(ErrorCode::CONFIG_DISTRIBUTED_MISMATCH, "[train] an evaluation-only run is not data-parallel")
        .with_suggestion("Run it in one process.");
}

// AdamW's state: whole, or with ZeRO-1 (--shard-optimizer, on by default over several ranks) this
// rank's 1/N of it (train/optimizer.h); the memory plan counted the same share.
void Trainer::State::init_optimizer() {
  const std::vector<TrainableParam> ps = model->trainable_parameters();
  if (opt.optimizer_shards <= 1) {
    adamw.init(ps);
    return;
  }
  adamw.init_sharded(ps, *comm);
  int64_t total = 0;
  for (const auto& p : ps) total += p.param->numel();
  event("info", fmt::format("ZeRO-1: AdamW's m and v are split over {} ranks; rank {} holds {} of their {} values ({})",
                            comm->world(), comm->rank(), adamw.state_values(), 2 * total,
                            format_bytes(static_cast<size_t>(adamw.state_values()) * sizeof(float))));
}

// training.overlap_communication: the gradients reduced on a communication thread during the last
// micro-batch's backward (train/grad_overlap.h). Host collectives only (a CPU run); the MPI library
// must let that thread call it (MPI_THREAD_SERIALIZED). auto = off: not reliably faster on the 2-core
// machine measured (docs/benchmarks.md), where the thread takes cycles from the ranks' compute.
void Trainer::State::start_overlap() {
  if (opt.fault_layer_delay_ms > 0 || (comm->world() > 1 && opt.overlap_communication.value_or(false)))
    set_layer_backward_hook([this](int64_t l) {
      if (overlap) overlap->layer_done(l);
      if (opt.fault_layer_delay_ms > 0 && l < model->config().num_layers)
        std::this_thread::sleep_for(std::chrono::milliseconds(opt.fault_layer_delay_ms));
    });
  if (comm->world() == 1 || !opt.overlap_communication.value_or(false)) return;
  if (device.type != DeviceType::CPU)
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[train] --overlap-communication true overlaps the host collectives with a CPU run's "
                            "backward; this run trains on {}, whose gradients are reduced after the backward",
                            device.name()))
        .with_suggestion("Leave --overlap-communication at auto (or false) on a CUDA device.");
  if (!comm->threads_may_communicate())
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                "[train] --overlap-communication true needs an MPI that lets another thread call it "
                "(MPI_THREAD_SERIALIZED); this one does not")
        .with_suggestion("Use an MPI built with thread support (Open MPI is), or --overlap-communication false.");
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  overlap = std::make_unique<GradientOverlap>(*comm, grads, names, model->config().num_layers, !adamw.sharded());
  event("info",
        "overlap: each layer's gradients are reduced on a communication thread while the layers below "
        "compute the step's last backward");
}

// The run id: rank 0's (a new run) or the resumed checkpoint's, the same on every rank.
std::string Trainer::State::shared_run_id(const std::string& resumed_id) const {
  if (comm->world() == 1) return resumed_id;
  return comm->broadcast(resumed_id.empty() ? uuid4() : resumed_id, 0);
}

// This rank's sequences of a step whose global batch is `ids`.
std::vector<int64_t> Trainer::State::local_share(const std::vector<int64_t>& ids) const {
  const size_t n = ids.size(), w = static_cast<size_t>(comm->world()), r = static_cast<size_t>(comm->rank());
  return std::vector<int64_t>(ids.begin() + static_cast<std::ptrdiff_t>(n * r / w),
                              ids.begin() + static_cast<std::ptrdiff_t>(n * (r + 1) / w));
}

// The largest share a rank gets of a step (OOM recovery's batch: micro-batches never exceed it).
int64_t Trainer::State::local_batch_size() const {
  const int64_t w = comm->world();
  return (opt.batch_size + w - 1) / w;
}

// Settings, model weights (and the adapter as initialised) and training data hashed and compared
// across ranks; a mismatch names what differs on which ranks. Then a barrier (bounded).
void Trainer::State::check_ranks_agree() {
  if (comm->world() == 1) return;
  Hash64 hs, hw, hd;
  nlohmann::json settings = nlohmann::json::object();
  if (opt.resolved_settings.is_object())
    for (const char* section : {"model", "lora", "training", "data"})
      if (opt.resolved_settings.contains(section) && opt.resolved_settings[section].is_object())
        for (auto& [k, v] : opt.resolved_settings[section].items())
          if (!rank_local_setting(section, k)) settings[section][k] = v;
  settings["_options"] = {opt.batch_size,     opt.seed,          opt.steps,  opt.lr, train_mode_name(opt.mode),
                          opt.max_seq_length, opt.max_grad_norm, opt.shuffle};
  hs.add(settings.dump());
  for (auto& [name, t] : model->named_weights()) {
    hw.add(name);
    hash_tensor(hw, *t);
  }
  for (auto& p : model->trainable_parameters()) {
    hw.add(p.name);
    hash_tensor(hw, *p.param);
  }
  for (const std::vector<Sample>* set : {&data.train, &data.eval}) {
    const int64_t n = static_cast<int64_t>(set->size());
    hd.add(&n, sizeof n);
    for (const Sample& smp : *set) {
      hd.add(smp.ids.data(), smp.ids.size() * sizeof(int32_t));
      hd.add(smp.loss_mask.data(), smp.loss_mask.size());
      hd.add(smp.rejected_ids.data(), smp.rejected_ids.size() * sizeof(int32_t));  // preference rows
      hd.add(smp.rejected_loss_mask.data(), smp.rejected_loss_mask.size());
      const int64_t label_prompt[] = {static_cast<int64_t>(smp.label), static_cast<int64_t>(smp.prompt_len)};
      hd.add(label_prompt, sizeof label_prompt);
    }
  }
  const std::pair<const char*, uint64_t> parts[] = {
      {"settings", hs.h}, {"model weights", hw.h}, {"training data", hd.h}};
  std::vector<std::string> differ;
  for (const auto& [what, h] : parts) {
    const std::vector<int64_t> all = comm->all_gather(static_cast<int64_t>(h));
    std::vector<int> ranks;
    for (size_t r = 1; r < all.size(); ++r)
      if (all[r] != all[0]) ranks.push_back(static_cast<int>(r));
    if (!ranks.empty())
      differ.push_back(fmt::format("{} (rank{} {} differ{} from rank 0)", what, ranks.size() > 1 ? "s" : "",
                                   fmt::join(ranks, ", "), ranks.size() > 1 ? "" : "s"));
  }
  if (!differ.empty())
    throw Error(ErrorCode::CONFIG_DISTRIBUTED_MISMATCH,
                fmt::format("[train] the {} ranks of this run do not train the same thing: {}", comm->world(),
                            fmt::join(differ, "; ")),
                {{"world", comm->world()}, {"rank", comm->rank()}, {"differs", differ}});
  comm->barrier(opt.distributed_timeout_s);
  event("info", fmt::format("data-parallel over {} ranks ({}): each takes {} of the {} sequences of a step; "
                            "settings, weights and data agree on every rank",
                            comm->world(), comm->description(),
                            opt.batch_size % comm->world() == 0 ? std::to_string(opt.batch_size / comm->world())
                                                                : fmt::format("up to {}", local_batch_size()),
                            opt.batch_size));
}

// forward_backward on every rank's share, with OOM recovery agreed across the ranks, then the
// gradients summed over the ranks (the one all-reduce of the step). Returns the global loss sum.
double Trainer::State::forward_backward_all_ranks(const Batch& batch) {
  if (comm->world() == 1) return forward_backward(batch);
  // The safety monitor's temperature decisions, agreed at the step boundary: a rank too hot pauses
  // (or stops) every rank, never computes on alone while the others wait in the all-reduce.
  safety->step_boundary(step + 1, [&] { save_last_finished_step(batch); });
  for (;;) {
    const int64_t micro_before = oom->micro_seqs();
    const bool gc_before = model->options().gradient_checkpointing;
    if (overlap) overlap->begin_step();
    const double local = forward_backward(batch);
    // With the overlap, the gradients were reduced during the last micro-batch's backward, unless an
    // OOM spoiled that round on some rank: then every rank redoes the step (as after an OOM).
    const bool reduced = overlap && overlap->finish();
    const bool all_reduced = overlap && !on_any_rank(!reduced);
    const std::vector<int64_t> micro = comm->all_gather(oom->micro_seqs());
    const std::vector<int64_t> gc = comm->all_gather(int64_t{model->options().gradient_checkpointing ? 1 : 0});
    const int64_t agreed_micro = *std::min_element(micro.begin(), micro.end());
    const bool agreed_gc = std::any_of(gc.begin(), gc.end(), [](int64_t v) { return v != 0; });
    bool agree = true;
    std::vector<int> recovered;  // ranks that changed their micro-batch or checkpointing this step
    for (size_t r = 0; r < micro.size(); ++r) {
      agree = agree && micro[r] == agreed_micro && (gc[r] != 0) == agreed_gc;
      if (micro[r] != micro_before || (gc[r] != 0) != gc_before) recovered.push_back(static_cast<int>(r));
    }
    if (overlap && !all_reduced) agree = false;
    if (agree) {
      // ZeRO-1: each rank receives only its chunks' sum (the optimizer updates those and
      // all-gathers the parameters); unsharded, every rank the whole sum.
      // all_reduced: done under the backward (grad_overlap.h), the same sums, the same bits.
      if (!all_reduced) {
        const CommScope scope(CommKind::Gradients);  // the step records' comm_gradient_s / _bytes
        if (adamw.sharded())
          comm->reduce_scatter_sum(grads);
        else
          comm->all_reduce_sum(grads);
      }
      if (method_is_preference(opt.method)) merge_preference_metrics();
      return comm->sum_in_rank_order(local);
    }
    // Some rank ran out of memory: every rank redoes the step the same way.
    const bool mine = std::find(recovered.begin(), recovered.end(), comm->rank()) != recovered.end();
    if (!mine) ++summary.oom_recoveries;  // the rank that recovered counted it in report_oom
    oom->set_micro_seqs(agreed_micro);
    if (agreed_gc) model->set_gradient_checkpointing(true);
    event("warn", fmt::format("rank{} {} ran out of memory at step {}: every rank redoes the step with micro-batch "
                              "{}{}",
                              recovered.size() > 1 ? "s" : "", fmt::join(recovered, ", "), step + 1, agreed_micro,
                              agreed_gc ? " and gradient checkpointing on" : ""));
    record({{"type", "oom_recovery_agreed"},
            {"step", step + 1},
            {"ranks", recovered},
            {"micro_batch_after", agreed_micro},
            {"gradient_checkpointing", agreed_gc}});
  }
}

// The global gradient norm. One process: over the whole gradient. Over several ranks: the squares
// summed chunk by chunk of the reduction's layout (train/optimizer.h rank_runs: rank q's chunks),
// the chunks' sums added in rank order. With ZeRO-1 a rank holds only its own chunks summed, so
// it computes that sum and the ranks all-gather them (one double each); unsharded, every rank
// computes every chunk's sum itself: the same numbers, so sharded and unsharded runs clip alike,
// bit for bit.
double Trainer::State::gradient_norm() {
  if (comm->world() == 1) return global_grad_norm(std::vector<const Tensor*>(grads.begin(), grads.end()));
  std::vector<int64_t> sizes;
  for (const Tensor* g : grads) sizes.push_back(g->numel());
  auto chunk_sum = [&](int q) {
    std::vector<Tensor> views;
    for (const FlatRun& r : rank_runs(sizes, q, comm->world()))
      views.push_back(grads[r.param]->reshape(Shape{grads[r.param]->numel()}).rows(r.offset, r.offset + r.count));
    std::vector<const Tensor*> ptrs;
    for (const Tensor& v : views) ptrs.push_back(&v);
    return sum_of_squares(ptrs);
  };
  std::vector<double> sums;
  if (adamw.sharded()) {
    sums = comm->all_gather(chunk_sum(comm->rank()));
  } else {
    for (int q = 0; q < comm->world(); ++q) sums.push_back(chunk_sum(q));
  }
  double total = sums[0];
  for (size_t q = 1; q < sums.size(); ++q) total += sums[q];
  return std::sqrt(total);
}

// Rank 0 itself was lost (killed, crashed): it cannot end the run's status.json, which would say
// "running" for ever. Rank 1, the lowest survivor, marks it failed with the code instead, once
// rank 0 had started it (the file exists: the run folder is shared).
void Trainer::State::mark_run_of_lost_writer(const Error& lost) {
  if (writer || !comm || comm->rank() != 1 || lost.details().value("lost_rank", -1) != 0) return;
  const std::filesystem::path status = std::filesystem::path(summary.output_dir) / "status.json";
  std::error_code ec;
  if (summary.output_dir.empty() || !std::filesystem::exists(status, ec)) return;
  try {
    write_run_status_end(summary.output_dir, "failed", lost.info().name, lost.what());
  } catch (const std::exception& e) {  // never hide the run's own outcome behind this one
    spdlog::warn("could not update {}: {}", status.string(), e.what());
  }
}

// A preference step's TRL metrics (rewards, accuracies, log-probabilities) over the whole global
// batch: each rank's sums over its share, added in rank order. Only logged: the loss and the
// gradients are summed elsewhere.
void Trainer::State::merge_preference_metrics() {
  static_assert(std::is_trivially_copyable_v<PreferenceMetrics>);
  std::vector<PreferenceMetrics> all(static_cast<size_t>(comm->world()));
  comm->all_gather_bytes(&pref.step_metrics, sizeof(PreferenceMetrics), all.data());
  PreferenceMetrics sum = all[0];
  for (size_t r = 1; r < all.size(); ++r) sum.merge(all[r]);
  pref.step_metrics = sum;
}

// A decision every rank must take the same way: true when it is true on any rank.
bool Trainer::State::on_any_rank(bool value) {
  return comm->world() == 1 ? value : comm->any(value);
}

}  // namespace bp
