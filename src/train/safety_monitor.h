// The safety monitor (issue 20; DESIGN.md "Trainer"): neither the kernel, the heat nor a full disk
// kills a run. It reads memory (core/system_readings.h), CPU temperatures (hwmon, thermal zones)
// and GPUs (core/nvml.h) on a background thread every monitor.poll_period_s (with a period of 0, on
// the training thread at each micro-batch boundary: what tests use, so nothing depends on timing),
// and the trainer asks it for a decision at three hooks:
//
//   memory_budget_bytes()   --max-memory auto on the CPU: the smaller of MemAvailable and the
//                           cgroup's room, minus a headroom, plus what the run already holds.
//   between_micro_batches() memory under monitor.memory_low -> throws RUNTIME_MEMORY_PRESSURE, which
//                           OomRecovery treats as an out-of-memory: checkpointing on, then a smaller
//                           micro-batch, same samples, same batch — before any allocation fails.
//                           Once per new low: a reading must fall below the last one that acted (or
//                           recover above the threshold first) to act again.
//                           Temperature warning -> logged; critical -> waits here (no work is done,
//                           nothing is lost, so the result is bit-identical) until every sensor has
//                           stayed under the warning level for cooldown_s; still hot after
//                           max_pause_s -> save and stop (RUNTIME_GPU_TEMPERATURE_CRITICAL);
//                           emergency -> save and stop (RUNTIME_TEMPERATURE_EMERGENCY). "Save" is the
//                           trainer's callback: the last finished step, so the checkpoint resumes.
//   before_checkpoint()     free space of the output folder against the checkpoint's size: a warning
//                           while it holds fewer than disk_warn_checkpoints, STATE_DISK_FULL before
//                           writing when not even one fits (the earlier checkpoint stays intact).
//
// Every event goes to the sink as a JSON record {"type": "monitor", "event", "level", "message",
// "code", ...}; the trainer writes it to the log and metrics.jsonl with the run id. NVML that loads
// but fails: RUNTIME_GPU_MONITORING_FAILED once, and the run goes on without GPU readings.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/nvml.h"
#include "core/system_readings.h"

namespace bp {

class Settings;
class Model;

struct MonitorOptions {
  bool enabled = false;  // TrainOptions::from_settings turns it on (monitor.enabled, default true)
  double poll_period_s = 5;
  double warning_c = 80, critical_c = 90, emergency_c = 95;
  double margin_c = 3;  // levels also reached this far under the hardware's slowdown/shutdown thresholds
  double cooldown_s = 30, max_pause_s = 1800;
  int64_t memory_headroom_bytes = -1;  // -1 = auto: 10% of the memory available at the start
  int64_t memory_low_bytes = -1;       // -1 = auto: half the headroom; 0 = off
  int64_t disk_warn_checkpoints = 3;
  std::string system_root;  // "" = "/"
  std::string nvml_library = "libnvidia-ml.so.1";
  // Read at each hook on the training thread, no thread (poll_period_s 0 implies it). Unit tests set
  // it with a period, which is then the virtual time slept between readings while paused.
  bool synchronous = false;
  // Tests: free bytes of a folder instead of statvfs (a disk that fills up on cue). A hook, not a
  // setting: it takes no part in comparing options.
  struct FreeDiskHook : std::function<uint64_t(const std::string& dir)> {
    using std::function<uint64_t(const std::string& dir)>::function;
    using std::function<uint64_t(const std::string& dir)>::operator=;
    bool operator==(const FreeDiskHook&) const { return true; }
  };
  FreeDiskHook free_disk_bytes_for_tests;

  // The monitor.* rows of the settings table (their BP_FILLS column, train/train_options.cpp).
  static MonitorOptions from_settings(const Settings& s);
  // Throws CONFIG_INVALID_SETTING unless warning <= critical <= emergency.
  void validate() const;
  bool operator==(const MonitorOptions&) const = default;
};

struct MonitorReadings {
  MemoryReading memory;
  std::vector<TemperatureReading> temperatures;  // CPU sensors and GPUs ("gpu0")
  std::vector<GpuReading> gpus;
  std::string gpu_error;  // NVML present but broken: what failed
};

// Where readings come from: the machine (below) or a test's script.
class ReadingSource {
 public:
  virtual ~ReadingSource() = default;
  virtual MonitorReadings read() = 0;
  virtual uint64_t free_disk_bytes(const std::string& dir) = 0;
};
// /proc and /sys under `root`, NVML from `nvml_library`, statvfs for the disk.
std::unique_ptr<ReadingSource> system_reading_source(const std::string& root, const std::string& nvml_library);

class MonitorClock {
 public:
  virtual ~MonitorClock() = default;
  virtual double now_s() = 0;
  virtual void sleep_s(double seconds) = 0;
};
std::shared_ptr<MonitorClock> steady_monitor_clock();

enum class TemperatureLevel { Normal, Warning, Critical, Emergency };
const char* temperature_level_name(TemperatureLevel l);
// The level of one sensor under the options (fixed levels, lowered by the sensor's own thresholds).
TemperatureLevel temperature_level(const TemperatureReading& t, const MonitorOptions& o);

// f32 trainable weights plus AdamW's two moments, and room for the JSON files.
uint64_t checkpoint_bytes_estimate(const Model& model);

class SafetyMonitor {
 public:
  using Sink = std::function<void(const nlohmann::json& record)>;
  // Does nothing at all when !options.enabled. Otherwise reads once now (the start readings decide
  // the automatic budget and thresholds, and report a broken NVML) and starts the polling thread
  // when poll_period_s > 0.
  SafetyMonitor(MonitorOptions options, Sink sink, std::unique_ptr<ReadingSource> source = nullptr,
                std::shared_ptr<MonitorClock> clock = nullptr);
  ~SafetyMonitor();
  SafetyMonitor(const SafetyMonitor&) = delete;
  SafetyMonitor& operator=(const SafetyMonitor&) = delete;

  bool enabled() const { return opt_.enabled; }
  // The CPU memory budget for --max-memory auto; kNoLimit when disabled or memory is unknown.
  size_t memory_budget_bytes(size_t bytes_in_use);
  // The hook between micro-batches (see the top of this file). `step` is 1-based; `can_shrink`
  // says whether OOM recovery has anything left to give; `save_and_stop` writes the checkpoint of
  // the last finished step before the monitor throws.
  void between_micro_batches(int64_t step, bool can_shrink, const std::function<void()>& save_and_stop);
  // Data-parallel runs (several ranks): `gather` all-gathers one value from every rank, in rank
  // order (the trainer's Collective). Once it is set, temperatures are acted on at step boundaries
  // only (step_boundary), as one decision of all the ranks; between micro-batches the monitor
  // looks at memory alone (its OOM-recovery path is agreed across the ranks by the trainer).
  using RankGather = std::function<std::vector<int64_t>(int64_t)>;
  void set_rank_gather(RankGather gather) { gather_ = std::move(gather); }
  // Before the micro-batches of step `step` (1-based), data-parallel only; collective: every rank
  // calls it, its monitor on or off. Each rank reads its sensors and the worst level over the ranks
  // decides for all: emergency -> every rank saves (the callback: the last finished step) and
  // stops; critical -> every rank pauses until every rank's sensors have been under the warning
  // level for cooldown_s (each rank's own readings and clock), or a rank has waited max_pause_s
  // (save and stop, RUNTIME_GPU_TEMPERATURE_CRITICAL). The records name the ranks. No-op without
  // a gather.
  void step_boundary(int64_t step, const std::function<void()>& save_and_stop);
  // Before a checkpoint of about `bytes` is written into `dir` (see the top of this file).
  void before_checkpoint(const std::string& dir, uint64_t bytes, int64_t step);

  uint64_t memory_low_bytes() const { return memory_low_; }
  int64_t polls() const;  // readings taken so far

 private:
  MonitorReadings poll();
  MonitorReadings latest();
  void emit(const std::string& event, const std::string& level, const std::string& message, nlohmann::json extra = {});
  void check_gpu_monitoring(const MonitorReadings& r);
  void check_memory(const MonitorReadings& r, int64_t step, bool can_shrink);
  void check_temperature(MonitorReadings r, int64_t step, const std::function<void()>& save_and_stop);
  std::pair<TemperatureLevel, const TemperatureReading*> hottest(const MonitorReadings& r) const;
  [[noreturn]] void stop(ErrorCode code, const std::string& message, const std::function<void()>& save_and_stop,
                         nlohmann::json extra);
  void thread_main();

  MonitorOptions opt_;
  Sink sink_;
  std::unique_ptr<ReadingSource> source_;
  std::shared_ptr<MonitorClock> clock_;
  RankGather gather_;
  MonitorReadings start_;
  uint64_t headroom_ = 0, memory_low_ = 0;
  bool pressure_active_ = false;
  uint64_t pressure_level_ = 0;
  bool nothing_to_shrink_reported_ = false, gpu_failure_reported_ = false, warning_reported_ = false;
  bool disk_warned_ = false;

  std::mutex read_mu_;  // one reading at a time (the thread, or the training thread while paused)
  mutable std::mutex mu_;
  std::condition_variable cv_;
  MonitorReadings snapshot_;
  int64_t polls_ = 0;
  bool quit_ = false;
  std::thread thread_;
};

}  // namespace bp
