// The preference methods' part of the Trainer (issue 38; train/preference.h has the losses):
// the reference log-probabilities (adapter off, or computed once before step 1 and kept in the
// run's checkpoints), KTO's reference point, one micro-batch's forward/backward through
// Model::forward_backward_sequences, and evaluation with TRL's metrics.
//
// A micro-batch holds whole examples: a pair is its chosen and its rejected sequence, packed one
// after the other (no attention across them), so OOM recovery's halving never splits a pair.
#include <fmt/format.h>

#include <filesystem>

#include "io/safetensors.h"
#include "train/trainer_state.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

constexpr const char* kReferenceFile = "reference_logps.safetensors";

// The sequences the model runs for `examples`: each pair as its chosen then its rejected
// sequence (two plain samples), anything else as it is.
std::vector<Sample> sequences_of(const std::vector<const Sample*>& examples) {
  std::vector<Sample> seqs;
  seqs.reserve(examples.size() * 2);
  auto add = [&](const Sample& e, const std::vector<int32_t>& ids, const std::vector<uint8_t>& mask) {
    Sample s;
    s.ids = ids;
    s.loss_mask = mask;
    s.id = e.id;
    s.source_line = e.source_line;
    seqs.push_back(std::move(s));
  };
  for (const Sample* e : examples) {
    add(*e, e->ids, e->loss_mask);
    if (e->is_pair()) add(*e, e->rejected_ids, e->rejected_loss_mask);
  }
  return seqs;
}

Batch batch_of(const std::vector<Sample>& seqs) {
  std::vector<const Sample*> p;
  for (const auto& s : seqs) p.push_back(&s);
  return make_batch(p);
}

// KTO's mismatched sequence for pool[i] (TRL's KL pairs): its prompt with the completion of the
// next example of the pool, at most max_len tokens. The pairing is fixed by the data, not by the
// step's batch, so a precomputed reference can hold its log-probability too.
Sample kl_sample(const std::vector<Sample>& pool, size_t i, int64_t max_len) {
  const Sample& a = pool[i];
  const Sample& b = pool[(i + 1) % pool.size()];
  Sample s;
  s.id = a.id;
  s.source_line = a.source_line;
  const auto pa = static_cast<size_t>(std::min<int64_t>(a.prompt_len, static_cast<int64_t>(a.ids.size())));
  const auto pb = static_cast<size_t>(std::min<int64_t>(b.prompt_len, static_cast<int64_t>(b.ids.size())));
  s.ids.assign(a.ids.begin(), a.ids.begin() + static_cast<std::ptrdiff_t>(pa));
  s.loss_mask.assign(pa, 0);
  s.ids.insert(s.ids.end(), b.ids.begin() + static_cast<std::ptrdiff_t>(pb), b.ids.end());
  s.loss_mask.insert(s.loss_mask.end(), b.loss_mask.begin() + static_cast<std::ptrdiff_t>(pb), b.loss_mask.end());
  const auto cap = static_cast<size_t>(std::max<int64_t>(max_len, static_cast<int64_t>(pa) + 2));
  if (s.ids.size() > cap) {
    s.ids.resize(cap);
    s.loss_mask.resize(cap);
  }
  return s;
}

// The adapter is off for the lifetime of this object (the LoRA reference), on again after.
struct AdapterOff {
  Model& m;
  explicit AdapterOff(Model& model) : m(model) { m.set_lora_enabled(false); }
  ~AdapterOff() { m.set_lora_enabled(true); }
  AdapterOff(const AdapterOff&) = delete;
  AdapterOff& operator=(const AdapterOff&) = delete;
};

// Each sequence's π, rounded to f32 as the references are kept (RefLogps, checkpoints): policy and
// reference are then the same numbers where the models agree (step 0: rewards exactly 0, not the
// sign of a rounding difference).
std::vector<double> logps_of(const Model::SequenceLosses& l) {
  std::vector<double> out(l.loss_sum.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(-l.loss_sum[i]);
  return out;
}

}  // namespace

bool Trainer::State::reference_precomputed() const {
  return method_needs_reference(opt.method) && opt.pref.reference == ReferenceSource::Precomputed;
}

// π of each sequence of `seqs`, forward only with dropout off; with the adapter switched off
// when `adapter_off` (the LoRA reference).
std::vector<double> Trainer::State::forward_logps(const std::vector<Sample>& seqs, bool adapter_off) {
  std::optional<AdapterOff> off;
  if (adapter_off) off.emplace(*model);
  struct RestoreTraining {
    Model& m;
    bool was;
    ~RestoreTraining() { m.set_training(was); }
  } restore{*model, model->training()};
  model->set_training(false);
  return logps_of(model->sequence_losses(batch_of(seqs)));
}

// π under the reference: the model without its adapter (adapter-off) or the model as the run
// starts (precomputed: only ever called before step 1, when the weights are the starting ones; a
// LoRA run's new adapter has B = 0, so that is the base too, and with --init-adapter it is the
// model with that adapter).
std::vector<double> Trainer::State::reference_logps(const std::vector<Sample>& seqs) {
  return forward_logps(seqs, opt.pref.reference == ReferenceSource::AdapterOff || opt.pref.reference_is_base);
}

// The reference values of pool[i] for i in `idx`: chosen, rejected (pairs) and KL (KTO), from
// the precomputed table or computed (computed_references).
std::vector<RefLogps> Trainer::State::references(const std::vector<Sample>& pool, const std::vector<int64_t>& idx,
                                                 bool eval) {
  if (!method_needs_reference(opt.method)) return std::vector<RefLogps>(idx.size());
  if (!reference_precomputed()) return computed_references(pool, idx);
  const auto& table = eval ? pref.eval_ref : pref.train_ref;
  std::vector<RefLogps> out;
  for (int64_t i : idx) out.push_back(table.at(static_cast<size_t>(i)));
  return out;
}

// A pass of the reference (reference_logps) over pool[idx]'s sequences, and for KTO their KL
// sequences.
std::vector<RefLogps> Trainer::State::computed_references(const std::vector<Sample>& pool,
                                                          const std::vector<int64_t>& idx) {
  std::vector<RefLogps> out(idx.size());
  std::vector<const Sample*> ex;
  for (int64_t i : idx) ex.push_back(&pool[static_cast<size_t>(i)]);
  const std::vector<double> lp = reference_logps(sequences_of(ex));
  size_t at = 0;
  for (size_t k = 0; k < idx.size(); ++k) {
    out[k].c = static_cast<float>(lp[at++]);
    if (ex[k]->is_pair()) out[k].r = static_cast<float>(lp[at++]);
  }
  if (opt.method == TrainMethod::Kto) {
    const std::vector<double> kl_lp = reference_logps(kl_samples(pool, idx));
    for (size_t k = 0; k < idx.size(); ++k) out[k].kl = static_cast<float>(kl_lp[k]);
  }
  return out;
}

std::vector<Sample> Trainer::State::kl_samples(const std::vector<Sample>& pool, const std::vector<int64_t>& idx) const {
  std::vector<Sample> kl;
  for (int64_t i : idx) kl.push_back(kl_sample(pool, static_cast<size_t>(i), opt.max_seq_length));
  return kl;
}

// KTO's z over the examples pool[idx]: max(0, mean(π_KL − ref_KL)), no gradient (TRL's KL pass).
// Only the KL sequences run here; the examples' own references come with their micro-batch.
// Data-parallel (`across_ranks`: idx is this rank's share of the step), every rank runs its own
// share's KL sequences and the values are all-gathered in rank order, so each rank's z is the one
// mean over the whole step (the shares are contiguous: the same sum, term by term, as one process).
double Trainer::State::kto_z(const std::vector<Sample>& pool, const std::vector<int64_t>& idx, bool eval,
                             bool across_ranks) {
  const int64_t mb = std::max<int64_t>(1, oom->micro_seqs());
  std::vector<double> policy, ref;
  for (size_t b = 0; b < idx.size(); b += static_cast<size_t>(mb)) {
    const std::vector<int64_t> part(idx.begin() + static_cast<std::ptrdiff_t>(b),
                                    idx.begin() + static_cast<std::ptrdiff_t>(std::min(idx.size(), b + mb)));
    const std::vector<Sample> kl = kl_samples(pool, part);
    for (double v : forward_logps(kl, false)) policy.push_back(v);
    if (reference_precomputed()) {
      const auto& table = eval ? pref.eval_ref : pref.train_ref;
      for (int64_t i : part) ref.push_back(table.at(static_cast<size_t>(i)).kl);
    } else {
      for (double v : reference_logps(kl)) ref.push_back(v);
    }
  }
  if (across_ranks && comm->world() > 1) {
    policy = comm->all_gather_concat(policy);
    ref = comm->all_gather_concat(ref);
  }
  return kto_reference_point(policy, ref);
}

// Before step 1 of a new run (precomputed reference): every training and held-out example's
// reference values, rounded to f32 as they are stored, so a resumed run reads back exactly what
// the run used.
void Trainer::State::precompute_reference() {
  if (!reference_precomputed()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t mb = std::max<int64_t>(1, oom->micro_seqs());
  // Data-parallel, rank r computes the examples [n·r/N, n·(r+1)/N) and the ranks all-gather the
  // table (rank order = example order), so every rank holds all of it and rank 0 checkpoints it.
  const size_t w = static_cast<size_t>(comm->world()), me = static_cast<size_t>(comm->rank());
  auto fill = [&](const std::vector<Sample>& pool, std::vector<RefLogps>& table) {
    const size_t first = pool.size() * me / w, end = pool.size() * (me + 1) / w;
    std::vector<float> mine;
    for (size_t b = first; b < end; b += static_cast<size_t>(mb)) {
      std::vector<int64_t> idx;
      for (size_t i = b; i < std::min(end, b + static_cast<size_t>(mb)); ++i) idx.push_back(static_cast<int64_t>(i));
      for (const RefLogps& r : computed_references(pool, idx)) mine.insert(mine.end(), {r.c, r.r, r.kl});
    }
    const std::vector<float> all = comm->all_gather_concat(mine);
    table.clear();
    for (size_t i = 0; i + 2 < all.size(); i += 3) table.push_back({all[i], all[i + 1], all[i + 2]});
  };
  fill(data.train, pref.train_ref);
  fill(data.eval, pref.eval_ref);
  event("info", fmt::format("reference log-probabilities of {} training and {} held-out examples computed in {:.1f} s",
                            data.train.size(), data.eval.size(),
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
}

namespace {
Tensor column(const std::vector<RefLogps>& t, float RefLogps::*f) {
  std::vector<float> v;
  for (const auto& r : t) v.push_back(r.*f);
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}
}  // namespace

void Trainer::State::write_reference(const std::string& path) const {
  NamedTensors t;
  for (const auto& [name, table] :
       {std::pair<std::string, const std::vector<RefLogps>*>{"train", &pref.train_ref}, {"eval", &pref.eval_ref}}) {
    if (table->empty()) continue;
    t.emplace_back(name + ".chosen", column(*table, &RefLogps::c));
    t.emplace_back(name + ".rejected", column(*table, &RefLogps::r));
    t.emplace_back(name + ".kl", column(*table, &RefLogps::kl));
  }
  write_safetensors(path, t);
}

void Trainer::State::load_reference(const std::string& checkpoint_dir) {
  if (!reference_precomputed()) return;
  const std::string path = (fs::path(checkpoint_dir) / kReferenceFile).string();
  if (!fs::exists(path))
    throw Error(ErrorCode::CONFIG_RESUME_MISMATCH,
                fmt::format("[train] {} has no {}: it was not written by a run with a precomputed reference",
                            checkpoint_dir, kReferenceFile));
  auto reader = SafetensorsReader::open_file(path);
  auto load = [&](const std::string& name, const std::vector<Sample>& pool, std::vector<RefLogps>& table) {
    table.assign(pool.size(), RefLogps{});
    if (pool.empty()) return;
    const Tensor c = reader.read(name + ".chosen"), r = reader.read(name + ".rejected"), kl = reader.read(name + ".kl");
    if (c.numel() != static_cast<int64_t>(pool.size()))
      throw Error(ErrorCode::CONFIG_RESUME_MISMATCH,
                  fmt::format("[train] {} holds the reference of {} {} examples, the data has {}", path, c.numel(),
                              name, pool.size()));
    for (size_t i = 0; i < pool.size(); ++i) table[i] = {c.data<float>()[i], r.data<float>()[i], kl.data<float>()[i]};
  };
  load("train", data.train, pref.train_ref);
  load("eval", data.eval, pref.eval_ref);
}

std::vector<std::pair<std::string, std::function<void(const std::string&)>>> Trainer::State::reference_files() const {
  if (!reference_precomputed()) return {};
  return {{kReferenceFile, [this](const std::string& p) { write_reference(p); }}};
}

Trainer::State::PreferenceStep Trainer::State::begin_preference_step(const Batch& batch) {
  PreferenceStep ps;
  ps.norms.examples = static_cast<int64_t>(batch.ids.size());
  for (int64_t id : batch.ids) ps.norms.chosen_tokens += label_tokens(data.train[static_cast<size_t>(id)].loss_mask);
  if (opt.method == TrainMethod::Kto) ps.norms.kto_z = kto_z(data.train, batch.local_ids, false, true);
  return ps;
}

// The loss terms of `examples` (pool[idx]) from their sequences' π and their references: adds
// each term's loss and metrics to `ps` and returns dL/d(loss_sum) for every sequence.
std::vector<float> Trainer::State::preference_terms(const std::vector<const Sample*>& examples,
                                                    const std::vector<double>& logp, const std::vector<RefLogps>& refs,
                                                    const std::vector<int64_t>& counts, PreferenceStep& ps) {
  std::vector<float> g(logp.size(), 0.0f);
  size_t at = 0;
  for (size_t k = 0; k < examples.size(); ++k) {
    const Sample& s = *examples[k];
    PreferenceExample e;
    e.logp_c = logp[at];
    e.n_c = counts[at];
    e.ref_c = refs[k].c;
    e.desirable = s.label != 0;
    const size_t ic = at++;
    size_t ir = ic;
    if (s.is_pair()) {
      ir = at++;
      e.logp_r = logp[ir];
      e.n_r = counts[ir];
      e.ref_r = refs[k].r;
    }
    const PreferenceTerm t = preference_term(opt.method, opt.pref, e, ps.norms);
    ps.loss += t.loss;
    ps.metrics.add(e, t);
    g[ic] = static_cast<float>(-t.dlogp_c);  // loss_sum = −π
    if (s.is_pair()) g[ir] = static_cast<float>(-t.dlogp_r);
  }
  return g;
}

void Trainer::State::preference_micro_batch(const std::vector<int64_t>& idx, PreferenceStep& ps,
                                            uint64_t dropout_seed) {
  std::vector<const Sample*> ex;
  for (int64_t i : idx) ex.push_back(&data.train[static_cast<size_t>(i)]);
  const std::vector<RefLogps> refs = references(data.train, idx, false);
  model->forward_backward_sequences(
      batch_of(sequences_of(ex)),
      [&](const Model::SequenceLosses& l) { return preference_terms(ex, logps_of(l), refs, l.n_counted, ps); },
      dropout_seed);
}

// The method's loss over the held-out examples (dropout off) and TRL's eval_ metrics in
// pref.eval_metrics.
std::optional<double> Trainer::State::preference_evaluate() {
  if (data.eval.empty()) return std::nullopt;
  PreferenceStep ps;
  std::vector<int64_t> all(data.eval.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  ps.norms.examples = static_cast<int64_t>(all.size());
  for (const Sample& s : data.eval) ps.norms.chosen_tokens += label_tokens(s.loss_mask);
  if (opt.method == TrainMethod::Kto) ps.norms.kto_z = kto_z(data.eval, all, true, false);
  const int64_t mb = std::max<int64_t>(1, oom->micro_seqs());
  for (size_t b = 0; b < all.size(); b += static_cast<size_t>(mb)) {
    inject_fault(FaultPoint::Eval);
    const std::vector<int64_t> idx(all.begin() + static_cast<std::ptrdiff_t>(b),
                                   all.begin() + static_cast<std::ptrdiff_t>(std::min(all.size(), b + mb)));
    std::vector<const Sample*> ex;
    for (int64_t i : idx) ex.push_back(&data.eval[static_cast<size_t>(i)]);
    const std::vector<RefLogps> refs = references(data.eval, idx, true);
    const Model::SequenceLosses l = model->sequence_losses(batch_of(sequences_of(ex)));
    preference_terms(ex, logps_of(l), refs, l.n_counted, ps);
  }
  pref.eval_metrics = nlohmann::json::object();
  ps.metrics.write(pref.eval_metrics, "eval_");
  if (opt.method == TrainMethod::Kto) pref.eval_metrics["eval_kl"] = ps.norms.kto_z;
  return ps.loss;
}

}  // namespace bp
