// Multi-run training: the orchestration described in multi_run.h. Each run is an ordinary
// Trainer run in its own folder; this file cuts the data, merges, gates and commits.
#include "train/multi_run.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_read.h"
#include "core/log.h"
#include "core/settings.h"
#include "io/atomic_file.h"
#include "model/loader.h"
#include "model/peft.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

// Fisher–Yates with splitmix64, so the order does not depend on the standard library.
void shuffle_rows(std::vector<std::string>& rows, uint64_t seed) {
  for (size_t i = rows.size(); i > 1; --i) std::swap(rows[i - 1], rows[splitmix64(seed + i) % i]);
}

std::vector<std::string> read_jsonl_rows(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error(ErrorCode::INPUT_DATASET_NOT_FOUND, fmt::format("[multi-run] cannot read {}", path));
  // The capped, regular-files-only reader every dataset goes through (core/file_read.h).
  std::istringstream f(read_file_capped(path, FileKind::Dataset, {"multi-run", ErrorCode::INPUT_DATASET_NOT_FOUND}));
  std::vector<std::string> rows;
  std::string line;
  while (std::getline(f, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) rows.push_back(line);
  if (!rows.empty() && (rows.front().front() == '[' || rows.size() == 1))
    throw Error(ErrorCode::INPUT_DATASET_INVALID,
                fmt::format("[multi-run] {} is not a JSONL file with one sample per line", path))
        .with_suggestion(
            "multi-run cuts the data into windows of rows: convert the file to JSONL (one JSON object "
            "per line), e.g. with `jq -c '.[]' FILE > FILE.jsonl`.");
  return rows;
}

void write_rows(const std::string& path, const std::vector<std::string>& rows) {
  std::string text;
  for (const auto& r : rows) text += r + "\n";
  write_file_atomic(path, text);
}

struct State {
  int64_t completed = 0;
  std::string merged_dir;           // the committed merge ("" before the first)
  std::optional<double> prev_loss;  // held-out loss of the committed merge (or of the base model)
  std::optional<double> best_loss;
  int64_t runs_since_best = 0, runs_merged = 0;
  bool stopped_early = false;
  nlohmann::json history = nlohmann::json::array();
  nlohmann::json config;

  nlohmann::json to_json() const {
    auto opt = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
    return {{"completed_runs", completed},
            {"merged_dir", merged_dir},
            {"prev_loss", opt(prev_loss)},
            {"best_loss", opt(best_loss)},
            {"runs_since_best", runs_since_best},
            {"runs_merged", runs_merged},
            {"stopped_early", stopped_early},
            {"history", history},
            {"config", config}};
  }
  static State from_json(const nlohmann::json& j, const std::string& path) {
    try {
      State s;
      s.completed = j.at("completed_runs").get<int64_t>();
      s.merged_dir = j.at("merged_dir").get<std::string>();
      if (!j.at("prev_loss").is_null()) s.prev_loss = j["prev_loss"].get<double>();
      if (!j.at("best_loss").is_null()) s.best_loss = j["best_loss"].get<double>();
      s.runs_since_best = j.at("runs_since_best").get<int64_t>();
      s.runs_merged = j.at("runs_merged").get<int64_t>();
      s.stopped_early = j.at("stopped_early").get<bool>();
      s.history = j.at("history");
      s.config = j.at("config");
      return s;
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCode::STATE_CHECKPOINT_INVALID, fmt::format("[multi-run] {} is damaged: {}", path, e.what()));
    }
  }
};

// What must not change between a multi-run and its resume.
nlohmann::json identity(const MultiRunOptions& o) {
  return {{"data", o.train.data_path},
          {"eval_data", o.train.eval_data_path},
          {"model", o.train.model_dir},
          {"runs", o.runs},
          {"samples", o.samples_per_run},
          {"replay", o.replay},
          {"lr", o.train.lr},
          {"lr_decay", o.lr_decay},
          {"seed", o.train.seed},
          {"merge", adapter_merge_mode_name(o.merge.mode)},
          {"validation", o.validation},
          {"steps", o.train.steps}};
}

class MultiRun {
 public:
  MultiRun(const MultiRunOptions& o, const MultiRunCallbacks& cb) : o_(o), cb_(cb), out_(o.output_dir) {}
  MultiRunSummary run();

 private:
  void prepare_data();
  std::vector<std::string> window(int64_t i) const;
  std::string init_adapter_for(int64_t i);
  TrainSummary train_run(int64_t i);
  double heldout_loss(const std::string& adapter_dir, int64_t i);
  nlohmann::json decide(int64_t i, const TrainSummary& ts);
  void commit() { write_file_atomic((out_ / "multirun_state.json").string(), st_.to_json().dump(2)); }

  MultiRunOptions o_;
  MultiRunCallbacks cb_;
  fs::path out_;
  State st_;
  std::vector<std::string> pool_;
  std::string holdout_path_;
  ModelConfig model_cfg_;
};

void MultiRun::prepare_data() {
  std::vector<std::string> rows = read_jsonl_rows(o_.train.data_path);
  shuffle_rows(rows, o_.train.seed);
  size_t n_hold = 0;
  if (!o_.train.eval_data_path.empty()) {
    holdout_path_ = o_.train.eval_data_path;
  } else if (o_.validation > 0) {
    n_hold = std::max<size_t>(1, static_cast<size_t>(std::llround(o_.validation * static_cast<double>(rows.size()))));
    holdout_path_ = (out_ / "holdout.jsonl").string();
    write_rows(holdout_path_, std::vector<std::string>(rows.begin(), rows.begin() + static_cast<ptrdiff_t>(n_hold)));
  }
  pool_.assign(rows.begin() + static_cast<ptrdiff_t>(n_hold), rows.end());
  if (o_.samples_per_run == 0) o_.samples_per_run = std::max<int64_t>(1, static_cast<int64_t>(pool_.size()) / o_.runs);
  if (o_.samples_per_run > static_cast<int64_t>(pool_.size()))
    throw Error(ErrorCode::CONFIG_INVALID,
                fmt::format("[multi-run] --samples {} is more than the {} training rows left after the {} held-out "
                            "ones ({} rows in {})",
                            o_.samples_per_run, pool_.size(), n_hold, rows.size(), o_.train.data_path))
        .with_suggestion(fmt::format("Lower --samples to at most {}, pass more data, or turn validation off "
                                     "(--validation-split 0, or give --eval-data).",
                                     pool_.size()));
}

std::vector<std::string> MultiRun::window(int64_t i) const {
  const size_t k = static_cast<size_t>(o_.samples_per_run), n = pool_.size();
  std::vector<std::string> rows;
  const size_t start = (static_cast<size_t>(i - 1) * k) % n;
  for (size_t j = 0; j < k; ++j) rows.push_back(pool_[(start + j) % n]);
  const size_t seen = std::min(n, static_cast<size_t>(i - 1) * k);  // rows earlier windows covered
  const size_t n_replay = seen ? static_cast<size_t>(std::llround(o_.replay * static_cast<double>(k))) : 0;
  for (size_t j = 0; j < n_replay; ++j)
    rows.push_back(
        pool_[(start + n - 1 - splitmix64(o_.train.seed ^ (static_cast<uint64_t>(i) << 32) ^ j) % seen) % n]);
  return rows;
}

// The adapter run i starts from: the committed merge, with A's rows orthonormalised for slao.
std::string MultiRun::init_adapter_for(int64_t i) {
  if (st_.merged_dir.empty()) return "";
  if (o_.merge.mode != AdapterMergeMode::Slao) return st_.merged_dir;
  LoraAdapter a = load_peft_adapter(st_.merged_dir, model_cfg_);
  orthonormalize_rows(a);
  std::string dir = (out_ / fmt::format("run-{}", i) / "init").string();
  save_peft_adapter(a, dir);
  return dir;
}

TrainSummary MultiRun::train_run(int64_t i) {
  fs::path dir = out_ / fmt::format("run-{}", i);
  TrainOptions t = o_.train;
  t.output_dir = dir.string();
  t.data_path = (dir / "train.jsonl").string();
  t.eval_data_path = holdout_path_;
  t.lr = o_.train.lr * std::pow(o_.lr_decay, static_cast<double>(i - 1));
  t.seed = o_.train.seed + static_cast<uint64_t>(i - 1);
  fs::create_directories(dir);
  const bool started = fs::exists(dir / "checkpoints") && !fs::is_empty(dir / "checkpoints");
  if (started) {
    t.resume = "latest";         // the same files as before the crash are still there
    t.refinish_finished = true;  // finished but not committed: its summary is made again for the decision
  } else {
    t.resume.clear();
    write_rows(t.data_path, window(i));
  }
  t.init_adapter = started && fs::exists(dir / "init") ? (dir / "init").string() : init_adapter_for(i);
  if (cb_.on_run_start) cb_.on_run_start(i, t);
  Trainer trainer(t, cb_.train);
  return trainer.run();
}

double MultiRun::heldout_loss(const std::string& adapter_dir, int64_t i) {
  TrainOptions t = o_.train;
  t.output_dir = (out_ / fmt::format("run-{}", i) / "gate").string();
  t.data_path = (out_ / fmt::format("run-{}", i) / "train.jsonl").string();
  t.eval_data_path = holdout_path_;
  t.resume.clear();
  t.init_adapter = adapter_dir;
  t.eval_only = true;
  t.quiet = true;
  Trainer trainer(t);
  auto s = trainer.run();
  if (!s.initial_eval_loss)
    throw Error(ErrorCode::INPUT_DATASET_INVALID,
                fmt::format("[multi-run] the held-out set {} has no usable samples", holdout_path_));
  return *s.initial_eval_loss;
}

nlohmann::json MultiRun::decide(int64_t i, const TrainSummary& ts) {
  LoraAdapter fresh = load_peft_adapter(ts.final_artifact, model_cfg_);
  nlohmann::json d = {{"run", i}, {"train_loss", ts.final_loss}, {"adapter", ts.final_artifact}};
  if (!st_.prev_loss && ts.initial_eval_loss) st_.prev_loss = ts.initial_eval_loss;  // the base model's
  std::optional<LoraAdapter> merged;
  if (!st_.merged_dir.empty()) {
    merged = load_peft_adapter(st_.merged_dir, model_cfg_);
    const double cos = adapter_b_cosine(fresh, *merged);
    d["b_cosine"] = cos;
    if (cos < o_.drift_threshold) {
      d["decision"] = "side_branch";
      d["reason"] =
          fmt::format("cosine {:.4f} of B against the merge is below --drift-threshold {}", cos, o_.drift_threshold);
      return d;
    }
  }
  LoraAdapter candidate = merged ? std::move(*merged) : clone_adapter(fresh);
  d["lambda"] = merged ? merge_adapter(candidate, fresh, i, o_.merge) : 1.0;
  if (o_.fault_inject == fmt::format("nan_merge:{}", i))
    for (auto& layer : candidate.layers)
      for (LoraTarget t : kAllLoraTargets)
        if (layer.has(t)) layer.b(t).data<float>()[0] = std::nanf("");
  const std::string dir = (out_ / "merged" / fmt::format("run-{}", i)).string();
  save_peft_adapter(candidate, dir);
  if (o_.fault_inject == fmt::format("crash_merge:{}", i)) {
    spdlog::warn("[fault] crash injected after writing merge {}", i);
    log::flush();
    ::kill(::getpid(), SIGKILL);
  }
  if (!adapter_is_finite(candidate)) {
    d["decision"] = "diverged";
    st_.history.push_back(d);
    commit();
    throw Error(
        ErrorCode::RUNTIME_SLAO_MERGE_DIVERGED,
        fmt::format("[multi-run] merging run {} ({}) gave non-finite values; the merge before it is kept in {}", i,
                    adapter_merge_mode_name(o_.merge.mode), st_.merged_dir.empty() ? "(none)" : st_.merged_dir));
  }
  const double loss = heldout_loss(dir, i);
  d["heldout_loss"] = loss;
  if (st_.prev_loss && loss > *st_.prev_loss + o_.eval_tolerance) {
    d["decision"] = "undone";
    d["code"] = "RUNTIME_EVAL_GATE_REGRESSED";
    d["reason"] = fmt::format("held-out loss {:.4f} is more than {} above the previous {:.4f}", loss, o_.eval_tolerance,
                              *st_.prev_loss);
    return d;
  }
  d["decision"] = "merged";
  st_.merged_dir = dir;
  st_.prev_loss = loss;
  ++st_.runs_merged;
  return d;
}

MultiRunSummary MultiRun::run() {
  if (o_.runs < 1) throw Error(ErrorCode::CONFIG_INVALID, "[multi-run] --runs must be at least 1");
  if (o_.train.mode != TrainMode::Lora)
    throw Error(ErrorCode::CONFIG_INVALID, "[multi-run] merges LoRA adapters: --mode full is not supported");
  fs::create_directories(out_);
  const fs::path state_path = out_ / "multirun_state.json";
  const bool has_state = fs::exists(state_path);
  if (has_state && !o_.resume)
    throw Error(ErrorCode::CONFIG_INVALID, fmt::format("[multi-run] {} already holds a multi-run", out_.string()))
        .with_suggestion("Pass --resume latest to continue it, or choose another --output.");
  model_cfg_ = load_model_config(o_.train.model_dir);
  prepare_data();
  st_.config = identity(o_);
  if (has_state) {
    const nlohmann::json j = parse_json_bounded(read_file(state_path.string()), state_path.string(), "multi-run");
    if (j.is_discarded())
      throw Error(ErrorCode::STATE_CHECKPOINT_INVALID,
                  fmt::format("[multi-run] {} is damaged: not valid JSON", state_path.string()));
    State saved = State::from_json(j, state_path.string());
    if (saved.config != st_.config)
      throw Error(ErrorCode::CONFIG_INVALID,
                  fmt::format("[multi-run] cannot resume {}: it was started with other settings ({} vs now {})",
                              out_.string(), saved.config.dump(), st_.config.dump()));
    st_ = std::move(saved);
    spdlog::info("[multi-run] resuming after run {} of {}", st_.completed, o_.runs);
  }
  while (st_.completed < o_.runs && !st_.stopped_early) {
    const int64_t i = st_.completed + 1;
    TrainSummary ts = train_run(i);
    nlohmann::json d = decide(i, ts);
    if (d.contains("heldout_loss") && d["decision"] == "merged" &&
        (!st_.best_loss || d["heldout_loss"].get<double>() < *st_.best_loss)) {
      st_.best_loss = d["heldout_loss"].get<double>();
      st_.runs_since_best = 0;
    } else {
      ++st_.runs_since_best;
    }
    if (o_.patience > 0 && st_.runs_since_best >= o_.patience && i < o_.runs) {
      st_.stopped_early = true;
      d["early_stop"] =
          fmt::format("no better held-out loss in {} run(s) (--patience {})", st_.runs_since_best, o_.patience);
    }
    st_.history.push_back(d);
    st_.completed = i;
    commit();
    if (cb_.on_decision) cb_.on_decision(d);
  }
  MultiRunSummary sum;
  sum.output_dir = out_.string();
  sum.runs_done = st_.completed;
  sum.runs_merged = st_.runs_merged;
  sum.best_heldout_loss = st_.best_loss;
  sum.stopped_early = st_.stopped_early;
  sum.history = st_.history;
  if (!st_.merged_dir.empty()) {
    sum.final_adapter = (out_ / "adapter").string();
    save_peft_adapter(load_peft_adapter(st_.merged_dir, model_cfg_), sum.final_adapter);
    // The chat template every run trained with (each Trainer records it): export ships it (issue 15).
    for (int64_t i = st_.completed; i >= 1; --i) {
      const fs::path recorded = out_ / fmt::format("run-{}", i) / "chat_template.jinja";
      if (!fs::exists(recorded)) continue;
      fs::copy_file(recorded, out_ / "adapter" / "chat_template.jinja", fs::copy_options::overwrite_existing);
      break;
    }
  }
  write_file_atomic((out_ / "history.json").string(), sum.to_json().dump(2));
  return sum;
}

}  // namespace

nlohmann::json MultiRunSummary::to_json() const {
  return {{"output_dir", output_dir},
          {"final_adapter", final_adapter},
          {"runs_done", runs_done},
          {"runs_merged", runs_merged},
          {"best_heldout_loss", best_heldout_loss ? nlohmann::json(*best_heldout_loss) : nlohmann::json(nullptr)},
          {"stopped_early", stopped_early},
          {"history", history}};
}

MultiRunOptions MultiRunOptions::from_settings(const Settings& s, TrainOptions train) {
  MultiRunOptions o;
  o.train = std::move(train);
  // --output names the multi-run's folder; left at its default, runs/multi-run.
  o.output_dir =
      s.source("training.output") == SettingSource::Default ? "runs/multi-run" : s.get_string("training.output");
  o.runs = s.get_int("multirun.runs");
  o.samples_per_run = s.get_int("multirun.samples");
  o.replay = s.get_float("multirun.replay");
  o.lr_decay = s.get_float("multirun.lr_decay");
  o.merge.mode = parse_adapter_merge_mode(s.get_string("multirun.merge_mode"));
  o.merge.ties_trim = s.get_float("multirun.ties_trim");
  o.merge.dare_drop = s.get_float("multirun.dare_drop");
  o.merge.seed = o.train.seed;
  o.drift_threshold = s.get_float("multirun.drift_threshold");
  o.eval_tolerance = s.get_float("multirun.eval_tolerance");
  o.patience = s.get_int("multirun.patience");
  o.validation = s.get_float("multirun.validation_split");
  o.resume = !s.get_string("training.resume").empty();
  o.fault_inject = s.get_string("multirun.fault_inject");
  // Run 1 starts from the base and runs 2.. from the merge so far: an adapter of the user's would
  // be replaced by the first run's, so it is refused rather than silently dropped.
  if (!o.train.init_adapter.empty())
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[multi-run] --init-adapter {} cannot be used: run 1 starts from the base model and "
                            "every later run from the merge of the runs before it",
                            o.train.init_adapter))
        .with_suggestion(
            "Merge the adapter into the model first (backprop export ADAPTER --format merged --output DIR) and "
            "give that folder as --model.");
  if (o.train.lora.pissa())  // runs 2.. start from the merge so far, not from the base's singular vectors
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                "[multi-run] --init-lora-weights pissa cannot be used: every run after the first starts from the "
                "merge of the runs before it");
  if (o.train.lora.use_dora)  // the adapter merges (train/adapter_merge.h) combine A and B only
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                "[multi-run] --use-dora cannot be used: the merges between runs combine lora_A and lora_B, not "
                "DoRA's magnitudes");
  o.train.pref.reference_is_base = true;  // DPO/KTO: one reference, the base, for every run and gate
  return o;
}

MultiRunSummary run_multi(const MultiRunOptions& opt, const MultiRunCallbacks& cb) {
  return MultiRun(opt, cb).run();
}

}  // namespace bp
