// The safety monitor's policy. See safety_monitor.h for what it watches and when it acts.
#include "train/safety_monitor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>

#include "core/allocator.h"
#include "core/settings.h"
#include "io/atomic_file.h"
#include "model/transformer.h"
#include "train/train_options.h"

namespace bp {

namespace {

class SystemReadingSource : public ReadingSource {
 public:
  SystemReadingSource(std::string root, const std::string& nvml_library)
      : root_(std::move(root)), nvml_(nvml_library) {}
  MonitorReadings read() override {
    MonitorReadings r;
    r.memory = read_memory(root_);
    r.temperatures = read_cpu_temperatures(root_);
    r.gpus = nvml_.read();
    for (const auto& g : r.gpus)
      r.temperatures.push_back({"gpu" + std::to_string(g.index), g.celsius, g.slowdown_c, g.shutdown_c});
    if (nvml_.status() == Nvml::Status::Broken) r.gpu_error = nvml_.why();
    return r;
  }
  uint64_t free_disk_bytes(const std::string& dir) override { return bp::free_disk_bytes(dir); }

 private:
  std::string root_;
  Nvml nvml_;
};

// Readings from `inner`, free disk space from a test's function.
class DiskOverride : public ReadingSource {
 public:
  DiskOverride(std::unique_ptr<ReadingSource> inner, std::function<uint64_t(const std::string&)> free_bytes)
      : inner_(std::move(inner)), free_bytes_(std::move(free_bytes)) {}
  MonitorReadings read() override { return inner_->read(); }
  uint64_t free_disk_bytes(const std::string& dir) override { return free_bytes_(dir); }

 private:
  std::unique_ptr<ReadingSource> inner_;
  std::function<uint64_t(const std::string&)> free_bytes_;
};

class SteadyClock : public MonitorClock {
 public:
  double now_s() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void sleep_s(double s) override {
    if (s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(s));
  }
};

nlohmann::json temperatures_json(const MonitorReadings& r) {
  nlohmann::json t = nlohmann::json::object();
  for (const auto& x : r.temperatures) t[x.sensor] = x.celsius;
  return t;
}

}  // namespace

MonitorOptions MonitorOptions::from_settings(const Settings& s) {
  TrainOptions t;
  fill_train_options(t, s, "monitor.");
  t.monitor.validate();
  return t.monitor;
}

void MonitorOptions::validate() const {
  if (!(warning_c <= critical_c && critical_c <= emergency_c))
    throw Error(ErrorCode::CONFIG_INVALID_SETTING,
                fmt::format("[monitor] temperature levels must rise: warning {} <= critical {} <= emergency {}",
                            warning_c, critical_c, emergency_c));
}

std::unique_ptr<ReadingSource> system_reading_source(const std::string& root, const std::string& nvml_library) {
  return std::make_unique<SystemReadingSource>(root, nvml_library);
}

std::shared_ptr<MonitorClock> steady_monitor_clock() {
  return std::make_shared<SteadyClock>();
}

const char* temperature_level_name(TemperatureLevel l) {
  switch (l) {
    case TemperatureLevel::Normal: return "normal";
    case TemperatureLevel::Warning: return "warning";
    case TemperatureLevel::Critical: return "critical";
    case TemperatureLevel::Emergency: return "emergency";
  }
  return "?";
}

TemperatureLevel temperature_level(const TemperatureReading& t, const MonitorOptions& o) {
  double emergency = o.emergency_c, critical = o.critical_c;
  if (t.shutdown_c > 0) emergency = std::min(emergency, t.shutdown_c - o.margin_c);
  if (t.slowdown_c > 0) critical = std::min(critical, t.slowdown_c - o.margin_c);
  critical = std::min(critical, emergency);
  const double warning = std::min(o.warning_c, critical);
  if (t.celsius >= emergency) return TemperatureLevel::Emergency;
  if (t.celsius >= critical) return TemperatureLevel::Critical;
  if (t.celsius >= warning) return TemperatureLevel::Warning;
  return TemperatureLevel::Normal;
}

uint64_t checkpoint_bytes_estimate(const Model& model) {
  return static_cast<uint64_t>(model.num_trainable_parameters()) * sizeof(float) * 3 + (1u << 20);
}

// ---- the monitor --------------------------------------------------------------------------------

SafetyMonitor::SafetyMonitor(MonitorOptions options, Sink sink, std::unique_ptr<ReadingSource> source,
                             std::shared_ptr<MonitorClock> clock)
    : opt_(std::move(options)), sink_(std::move(sink)), source_(std::move(source)), clock_(std::move(clock)) {
  if (!opt_.enabled) return;
  if (!source_) source_ = system_reading_source(opt_.system_root, opt_.nvml_library);
  if (opt_.free_disk_bytes_for_tests)
    source_ = std::make_unique<DiskOverride>(std::move(source_), opt_.free_disk_bytes_for_tests);
  if (!clock_) clock_ = steady_monitor_clock();
  start_ = poll();
  const uint64_t avail = start_.memory.available_bytes();
  headroom_ = opt_.memory_headroom_bytes >= 0 ? static_cast<uint64_t>(opt_.memory_headroom_bytes) : avail / 10;
  memory_low_ = opt_.memory_low_bytes >= 0 ? static_cast<uint64_t>(opt_.memory_low_bytes) : headroom_ / 2;
  check_gpu_monitoring(start_);
  if (opt_.poll_period_s <= 0) opt_.synchronous = true;
  if (!opt_.synchronous) thread_ = std::thread([this] { thread_main(); });
}

SafetyMonitor::~SafetyMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SafetyMonitor::thread_main() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!quit_) {
    if (cv_.wait_for(lock, std::chrono::duration<double>(opt_.poll_period_s), [this] { return quit_; })) break;
    lock.unlock();
    poll();
    lock.lock();
  }
}

MonitorReadings SafetyMonitor::poll() {
  MonitorReadings r;
  {
    std::lock_guard<std::mutex> lock(read_mu_);
    r = source_->read();
  }
  std::lock_guard<std::mutex> lock(mu_);
  snapshot_ = r;
  ++polls_;
  return r;
}

MonitorReadings SafetyMonitor::latest() {
  if (opt_.synchronous) return poll();
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

int64_t SafetyMonitor::polls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return polls_;
}

void SafetyMonitor::emit(const std::string& event, const std::string& level, const std::string& message,
                         nlohmann::json extra) {
  nlohmann::json r = {{"type", "monitor"}, {"event", event}, {"level", level}, {"message", message}};
  if (extra.is_object())
    for (auto& [k, v] : extra.items()) r[k] = v;
  if (sink_) sink_(r);
}

size_t SafetyMonitor::memory_budget_bytes(size_t bytes_in_use) {
  if (!opt_.enabled) return kNoLimit;
  const uint64_t avail = start_.memory.available_bytes();
  if (avail == 0) return kNoLimit;  // nothing known about this machine's memory
  const uint64_t budget = bytes_in_use + (avail > headroom_ ? avail - headroom_ : 0);
  emit("memory_budget", "info",
       fmt::format(
           "[monitor] --max-memory auto: {} ({} available{}, minus {} headroom, plus {} already held)",
           format_bytes(budget), format_bytes(avail),
           start_.memory.cgroup_limited
               ? fmt::format(": MemAvailable {}, cgroup room {} of the limit {}",
                             format_bytes(start_.memory.mem_available_bytes),
                             format_bytes(start_.memory.cgroup_max_bytes -
                                          std::min(start_.memory.cgroup_max_bytes, start_.memory.cgroup_current_bytes)),
                             start_.memory.limit_text())
               : "",
           format_bytes(headroom_), format_bytes(bytes_in_use)),
       {{"bytes_budget", budget},
        {"bytes_available", avail},
        {"bytes_mem_available", start_.memory.mem_available_bytes},
        {"cgroup_limited", start_.memory.cgroup_limited},
        {"cgroup_max_bytes", start_.memory.cgroup_max_bytes},
        {"cgroup_current_bytes", start_.memory.cgroup_current_bytes},
        {"cgroup_version", start_.memory.cgroup_version},
        {"cgroup_path", start_.memory.cgroup_path},
        {"bytes_headroom", headroom_},
        {"bytes_low_threshold", memory_low_}});
  return static_cast<size_t>(budget);
}

void SafetyMonitor::between_micro_batches(int64_t step, bool can_shrink, const std::function<void()>& save_and_stop) {
  if (!opt_.enabled) return;
  MonitorReadings r = latest();
  check_gpu_monitoring(r);
  check_memory(r, step, can_shrink);
  if (!gather_) check_temperature(std::move(r), step, save_and_stop);  // data-parallel: step_boundary
}

void SafetyMonitor::check_gpu_monitoring(const MonitorReadings& r) {
  if (r.gpu_error.empty() || gpu_failure_reported_) return;
  gpu_failure_reported_ = true;
  emit("gpu_monitoring_failed", "warn",
       fmt::format("[monitor] RUNTIME_GPU_MONITORING_FAILED: {}; GPU temperatures are not watched, training goes on",
                   r.gpu_error),
       {{"code", "RUNTIME_GPU_MONITORING_FAILED"}, {"library", opt_.nvml_library}});
}

void SafetyMonitor::check_memory(const MonitorReadings& r, int64_t step, bool can_shrink) {
  const uint64_t avail = r.memory.available_bytes();
  if (memory_low_ == 0 || avail == 0) return;
  if (avail >= memory_low_) {
    pressure_active_ = false;
    nothing_to_shrink_reported_ = false;
    return;
  }
  if (pressure_active_ && avail >= pressure_level_) return;  // acted on this low already
  nlohmann::json extra = {{"code", "RUNTIME_MEMORY_PRESSURE"},
                          {"step", step},
                          {"bytes_available", avail},
                          {"bytes_low_threshold", memory_low_}};
  if (!can_shrink) {
    if (!nothing_to_shrink_reported_)
      emit("memory_pressure", "warn",
           fmt::format("[monitor] only {} of memory available at step {} (threshold {}), and the micro-batch is "
                       "already one sequence with gradient checkpointing on: nothing left to shrink",
                       format_bytes(avail), step, format_bytes(memory_low_)),
           extra);
    nothing_to_shrink_reported_ = true;
    return;
  }
  pressure_active_ = true;
  pressure_level_ = avail;
  std::string msg = fmt::format("[monitor] only {} of memory available at step {}, under monitor.memory_low {}",
                                format_bytes(avail), step, format_bytes(memory_low_));
  emit("memory_pressure", "warn", msg + ": taking the OOM-recovery path before the kernel acts", extra);
  throw Error(ErrorCode::RUNTIME_MEMORY_PRESSURE, msg, extra);
}

namespace {
std::string describe(const TemperatureReading* t) {
  return t ? fmt::format("{} at {:.1f} C", t->sensor, t->celsius) : std::string("no sensor");
}
}  // namespace

// The hottest sensor of a reading by level, then by degrees (nullptr: no sensor).
std::pair<TemperatureLevel, const TemperatureReading*> SafetyMonitor::hottest(const MonitorReadings& x) const {
  std::pair<TemperatureLevel, const TemperatureReading*> worst{TemperatureLevel::Normal, nullptr};
  for (const auto& t : x.temperatures) {
    TemperatureLevel l = temperature_level(t, opt_);
    if (!worst.second || l > worst.first || (l == worst.first && t.celsius > worst.second->celsius)) worst = {l, &t};
  }
  return worst;
}

void SafetyMonitor::check_temperature(MonitorReadings r, int64_t step, const std::function<void()>& save_and_stop) {
  auto [level, sensor] = hottest(r);
  if (level == TemperatureLevel::Emergency)
    stop(ErrorCode::RUNTIME_TEMPERATURE_EMERGENCY,
         fmt::format("[monitor] emergency temperature before step {}: {}", step, describe(sensor)), save_and_stop,
         {{"step", step}, {"temperatures", temperatures_json(r)}});
  if (level == TemperatureLevel::Normal) warning_reported_ = false;
  if (level == TemperatureLevel::Warning && !warning_reported_) {
    warning_reported_ = true;
    emit("temperature_warning", "warn",
         fmt::format("[monitor] temperature warning at step {}: {}", step, describe(sensor)),
         {{"step", step}, {"temperatures", temperatures_json(r)}});
  }
  if (level != TemperatureLevel::Critical) return;

  // Critical: wait here, between micro-batches, until every sensor has been under the warning
  // level for cooldown_s. Nothing is computed while waiting, so the run's result is unchanged.
  emit("pause", "warn",
       fmt::format("[monitor] RUNTIME_GPU_TEMPERATURE_CRITICAL: {} at step {}; training paused until it cools down",
                   describe(sensor), step),
       {{"code", "RUNTIME_GPU_TEMPERATURE_CRITICAL"}, {"step", step}, {"temperatures", temperatures_json(r)}});
  const double t0 = clock_->now_s();
  double cool_since = -1;
  int64_t readings = 0;
  for (;;) {
    clock_->sleep_s(opt_.poll_period_s);
    r = poll();
    ++readings;
    auto [l, s] = hottest(r);
    const double now = clock_->now_s();
    if (l == TemperatureLevel::Emergency)
      stop(ErrorCode::RUNTIME_TEMPERATURE_EMERGENCY,
           fmt::format("[monitor] emergency temperature while paused before step {}: {}", step, describe(s)),
           save_and_stop, {{"step", step}, {"temperatures", temperatures_json(r)}});
    if (l == TemperatureLevel::Normal) {
      if (cool_since < 0) cool_since = now;
      if (now - cool_since >= opt_.cooldown_s) break;
    } else {
      cool_since = -1;
    }
    if (now - t0 >= opt_.max_pause_s)
      stop(ErrorCode::RUNTIME_GPU_TEMPERATURE_CRITICAL,
           fmt::format("[monitor] still too hot after a pause of {:.0f} s (monitor.max_pause_s {:.0f}) before step "
                       "{}: {}",
                       now - t0, opt_.max_pause_s, step, describe(s)),
           save_and_stop, {{"step", step}, {"paused_s", now - t0}, {"temperatures", temperatures_json(r)}});
  }
  warning_reported_ = false;
  emit("resume", "info",
       fmt::format("[monitor] cool again ({} readings, {:.1f} s paused): training resumes at step {}", readings,
                   clock_->now_s() - t0, step),
       {{"step", step},
        {"paused_s", clock_->now_s() - t0},
        {"readings", readings},
        {"temperatures", temperatures_json(r)}});
}

namespace {
// A rank's vote in each round of an agreed pause.
enum PauseVote : int64_t { kStillHot = 0, kCool = 1, kTooLong = 2, kEmergency = 3 };

// The ranks whose value is `v`: "rank 1" or "ranks 0, 2".
std::string ranks_with(const std::vector<int64_t>& values, int64_t v, std::vector<int>* out) {
  std::vector<int> ranks;
  for (size_t r = 0; r < values.size(); ++r)
    if (values[r] == v) ranks.push_back(static_cast<int>(r));
  if (out) *out = ranks;
  return fmt::format("rank{} {}", ranks.size() > 1 ? "s" : "", fmt::join(ranks, ", "));
}
}  // namespace

void SafetyMonitor::step_boundary(int64_t step, const std::function<void()>& save_and_stop) {
  if (!gather_) return;
  MonitorReadings r;
  std::pair<TemperatureLevel, const TemperatureReading*> mine{TemperatureLevel::Normal, nullptr};
  if (opt_.enabled) {
    r = latest();
    check_gpu_monitoring(r);
    mine = hottest(r);
  }
  const std::vector<int64_t> levels = gather_(static_cast<int64_t>(mine.first));
  const int64_t worst = *std::max_element(levels.begin(), levels.end());
  std::vector<int> ranks;
  const std::string who = ranks_with(levels, worst, &ranks);
  // This rank's own sensor where it is one of the hottest.
  const std::string here = mine.first == static_cast<TemperatureLevel>(worst) && mine.second
                               ? fmt::format(" (here: {})", describe(mine.second))
                               : std::string();
  nlohmann::json extra = {{"step", step}, {"ranks", ranks}};
  if (opt_.enabled) extra["temperatures"] = temperatures_json(r);
  switch (static_cast<TemperatureLevel>(worst)) {
    case TemperatureLevel::Emergency:
      stop(ErrorCode::RUNTIME_TEMPERATURE_EMERGENCY,
           fmt::format("[monitor] emergency temperature on {} before step {}{}: every rank stops", who, step, here),
           save_and_stop, extra);
    case TemperatureLevel::Normal: warning_reported_ = false; return;
    case TemperatureLevel::Warning:
      if (!warning_reported_)
        emit("temperature_warning", "warn",
             fmt::format("[monitor] temperature warning on {} at step {}{}", who, step, here), extra);
      warning_reported_ = true;
      return;
    case TemperatureLevel::Critical: break;
  }
  emit("pause", "warn",
       fmt::format("[monitor] RUNTIME_GPU_TEMPERATURE_CRITICAL on {} at step {}{}; every rank pauses until it cools "
                   "down",
                   who, step, here),
       [&] {
         nlohmann::json e = extra;
         e["code"] = "RUNTIME_GPU_TEMPERATURE_CRITICAL";
         return e;
       }());
  // Rounds: every rank reads its sensors (a rank without a monitor is always cool) and votes; the
  // votes are all-gathered, so every rank takes the same decision in the same round.
  const double t0 = opt_.enabled ? clock_->now_s() : 0;
  double cool_since = -1;
  int64_t readings = 0, rounds = 0;
  for (;; ++rounds) {
    int64_t vote = kCool;
    if (opt_.enabled) {
      clock_->sleep_s(opt_.poll_period_s);
      r = poll();
      ++readings;
      const TemperatureLevel l = hottest(r).first;
      const double now = clock_->now_s();
      if (l == TemperatureLevel::Normal) {
        if (cool_since < 0) cool_since = now;
      } else {
        cool_since = -1;
      }
      vote = l == TemperatureLevel::Emergency                         ? kEmergency
             : cool_since >= 0 && now - cool_since >= opt_.cooldown_s ? kCool
             : now - t0 >= opt_.max_pause_s                           ? kTooLong
                                                                      : kStillHot;
    }
    const std::vector<int64_t> votes = gather_(vote);
    const int64_t decision = *std::max_element(votes.begin(), votes.end());
    extra["temperatures"] = opt_.enabled ? temperatures_json(r) : nlohmann::json::array();
    if (decision == kEmergency)
      stop(ErrorCode::RUNTIME_TEMPERATURE_EMERGENCY,
           fmt::format("[monitor] emergency temperature on {} while paused before step {}: every rank stops",
                       ranks_with(votes, kEmergency, nullptr), step),
           save_and_stop, extra);
    if (decision == kTooLong)
      stop(ErrorCode::RUNTIME_GPU_TEMPERATURE_CRITICAL,
           fmt::format("[monitor] {} still too hot after a pause of monitor.max_pause_s {:.0f} s before step {}",
                       ranks_with(votes, kTooLong, nullptr), opt_.max_pause_s, step),
           save_and_stop, extra);
    if (std::all_of(votes.begin(), votes.end(), [](int64_t v) { return v == kCool; })) break;
  }
  warning_reported_ = false;
  extra["readings"] = readings;
  extra["rounds"] = rounds + 1;
  extra["paused_s"] = opt_.enabled ? clock_->now_s() - t0 : 0.0;
  emit("resume", "info",
       fmt::format("[monitor] every rank cool again ({} rounds): training resumes at step {}", rounds + 1, step),
       extra);
}

void SafetyMonitor::stop(ErrorCode code, const std::string& message, const std::function<void()>& save_and_stop,
                         nlohmann::json extra) {
  extra["code"] = error_info(code).name;
  emit("stop", "error", message + "; saving the last finished step and stopping", extra);
  if (save_and_stop) save_and_stop();
  throw Error(code, message + "; the last finished step was saved: continue with --resume latest when it is cool",
              extra);
}

void SafetyMonitor::before_checkpoint(const std::string& dir, uint64_t bytes, int64_t step) {
  if (!opt_.enabled) return;
  const uint64_t free_b = source_->free_disk_bytes(dir);
  nlohmann::json extra = {{"step", step}, {"bytes_free", free_b}, {"bytes_checkpoint", bytes}, {"path", dir}};
  if (free_b < bytes) {
    extra["code"] = "STATE_DISK_FULL";
    emit("disk_full", "error",
         fmt::format("[monitor] the checkpoint of step {} needs about {} but only {} is free at {}", step,
                     format_bytes(bytes), format_bytes(free_b), dir),
         extra);
    throw Error(ErrorCode::STATE_DISK_FULL,
                fmt::format("[monitor] checkpoint of step {} not written: it needs about {} but only {} is free at "
                            "{}; the earlier checkpoints are intact",
                            step, format_bytes(bytes), format_bytes(free_b), dir),
                extra);
  }
  const uint64_t warn_below = bytes * static_cast<uint64_t>(std::max<int64_t>(0, opt_.disk_warn_checkpoints));
  if (free_b >= warn_below) {
    disk_warned_ = false;
    return;
  }
  if (disk_warned_) return;
  disk_warned_ = true;
  emit("disk_low", "warn",
       fmt::format("[monitor] {} free at {}: room for {} more checkpoint(s) of about {} (warning below {})",
                   format_bytes(free_b), dir, free_b / std::max<uint64_t>(1, bytes), format_bytes(bytes),
                   opt_.disk_warn_checkpoints),
       extra);
}

}  // namespace bp
