// The safety monitor's policy (issue 20), driven by scripted readings and a virtual clock, so no
// test waits or depends on timing: pause and resume, cool-down, maximum pause, emergency, memory
// pressure once per new low, the --max-memory auto budget, disk space before checkpoints, NVML
// through the fake library (tests/train/fake_nvml.c), and the [monitor] settings.
#include "train/safety_monitor.h"

#include <cstdlib>
#include <deque>

#include "core/allocator.h"
#include "core/settings.h"
#include "support/expect_error.h"
#include "support/fake_system_root.h"
#include "support/test_util.h"

namespace bp {

namespace {

using test::code_of;

constexpr uint64_t kMiB = 1ull << 20;

// Each read() takes the next scripted reading (the last one repeats) and counts.
struct Script {
  std::deque<MonitorReadings> readings;
  int reads = 0;
  uint64_t disk_free = UINT64_MAX;
};

class ScriptedSource : public ReadingSource {
 public:
  explicit ScriptedSource(Script* s) : s_(s) {}
  MonitorReadings read() override {
    ++s_->reads;
    MonitorReadings r = s_->readings.front();
    if (s_->readings.size() > 1) s_->readings.pop_front();
    return r;
  }
  uint64_t free_disk_bytes(const std::string&) override { return s_->disk_free; }

 private:
  Script* s_;
};

// Time moves only when the monitor sleeps.
class VirtualClock : public MonitorClock {
 public:
  double now_s() override { return t; }
  void sleep_s(double s) override { t += s; }
  double t = 1000;
};

MonitorReadings gpu_at(double celsius, uint64_t available = 8192 * kMiB) {
  MonitorReadings r;
  r.memory.mem_available_bytes = available;
  r.temperatures.push_back({"gpu0", celsius, 0, 0});
  return r;
}

MonitorOptions sync_options() {
  MonitorOptions o;
  o.enabled = true;
  o.poll_period_s = 0;   // one reading per hook
  o.synchronous = true;  // also when a test sets a period (virtual seconds slept while paused)
  return o;
}

struct Harness {
  Script script;
  std::shared_ptr<VirtualClock> clock = std::make_shared<VirtualClock>();
  std::vector<nlohmann::json> events;
  std::unique_ptr<SafetyMonitor> monitor;
  void start(MonitorOptions o) {
    monitor = std::make_unique<SafetyMonitor>(
        o, [this](const nlohmann::json& r) { events.push_back(r); }, std::make_unique<ScriptedSource>(&script), clock);
  }
  std::vector<std::string> event_names() const {
    std::vector<std::string> out;
    for (const auto& e : events) out.push_back(e.at("event"));
    return out;
  }
};

}  // namespace

TEST(SafetyMonitor, LevelsFollowFixedThresholdsAndTheCardsOwn) {
  MonitorOptions o;  // 80 / 90 / 95, margin 3
  EXPECT_EQ(temperature_level({"gpu0", 79.9, 0, 0}, o), TemperatureLevel::Normal);
  EXPECT_EQ(temperature_level({"gpu0", 80, 0, 0}, o), TemperatureLevel::Warning);
  EXPECT_EQ(temperature_level({"gpu0", 90, 0, 0}, o), TemperatureLevel::Critical);
  EXPECT_EQ(temperature_level({"gpu0", 95, 0, 0}, o), TemperatureLevel::Emergency);
  // A card that slows down at 85 C and shuts down at 92 C: critical from 82, emergency from 89.
  EXPECT_EQ(temperature_level({"gpu0", 81.9, 85, 92}, o), TemperatureLevel::Warning);
  EXPECT_EQ(temperature_level({"gpu0", 82, 85, 92}, o), TemperatureLevel::Critical);
  EXPECT_EQ(temperature_level({"gpu0", 89, 85, 92}, o), TemperatureLevel::Emergency);
  o.margin_c = 0;
  EXPECT_EQ(temperature_level({"gpu0", 84, 85, 92}, o), TemperatureLevel::Warning);
}

// Critical pauses in the hook; it returns only after every sensor stayed under the warning level
// for cooldown_s (a cool reading that turns hot again restarts the cool-down).
TEST(SafetyMonitor, CriticalPausesUntilCooledDownForCooldownSeconds) {
  Harness h;
  for (double c : {50.0, 91.0, 85.0, 70.0, 82.0, 70.0, 70.0, 70.0, 70.0}) h.script.readings.push_back(gpu_at(c));
  MonitorOptions o = sync_options();
  o.poll_period_s = 10;  // virtual seconds between readings while paused
  o.cooldown_s = 20;
  h.start(o);
  bool saved = false;
  h.monitor->between_micro_batches(3, true, [&] { saved = true; });
  EXPECT_FALSE(saved);
  EXPECT_EQ(h.event_names(), (std::vector<std::string>{"pause", "resume"}));
  EXPECT_EQ(h.events[0].at("code"), "RUNTIME_GPU_TEMPERATURE_CRITICAL");
  EXPECT_EQ(h.events[0].at("step"), 3);
  // Readings while paused: 85 (warm), 70 (cool from t), 82 (hot again), 70, 70, 70 (20 s cool).
  EXPECT_EQ(h.events[1].at("readings"), 6);
  EXPECT_DOUBLE_EQ(h.events[1].at("paused_s").get<double>(), 60.0);
}

TEST(SafetyMonitor, PauseLongerThanMaxPauseSavesAndStops) {
  Harness h;
  h.script.readings = {gpu_at(50), gpu_at(91)};  // hot for ever
  MonitorOptions o = sync_options();
  o.poll_period_s = 10;
  o.max_pause_s = 60;
  h.start(o);
  bool saved = false;
  EXPECT_EQ(code_of([&] { h.monitor->between_micro_batches(2, true, [&] { saved = true; }); }),
            ErrorCode::RUNTIME_GPU_TEMPERATURE_CRITICAL);
  EXPECT_TRUE(saved) << "the last finished step is saved before stopping";
  EXPECT_DOUBLE_EQ(h.clock->t, 1060.0);
  EXPECT_EQ(h.event_names(), (std::vector<std::string>{"pause", "stop"}));
}

TEST(SafetyMonitor, EmergencySavesAndStopsWithItsCode) {
  Harness h;
  h.script.readings = {gpu_at(50), gpu_at(60), gpu_at(96)};
  h.start(sync_options());
  int saved = 0;
  h.monitor->between_micro_batches(1, true, [&] { ++saved; });
  EXPECT_EQ(code_of([&] { h.monitor->between_micro_batches(1, true, [&] { ++saved; }); }),
            ErrorCode::RUNTIME_TEMPERATURE_EMERGENCY);
  EXPECT_EQ(saved, 1);
  ASSERT_EQ(h.events.size(), 1u);
  EXPECT_EQ(h.events[0].at("code"), "RUNTIME_TEMPERATURE_EMERGENCY");
  EXPECT_EQ(h.events[0].at("temperatures").at("gpu0"), 96.0);
}

TEST(SafetyMonitor, WarningIsLoggedOncePerRise) {
  Harness h;
  h.script.readings = {gpu_at(50), gpu_at(81), gpu_at(82), gpu_at(60), gpu_at(83)};
  h.start(sync_options());
  for (int i = 0; i < 4; ++i) h.monitor->between_micro_batches(1, true, {});
  EXPECT_EQ(h.event_names(), (std::vector<std::string>{"temperature_warning", "temperature_warning"}));
}

// Available memory under the threshold throws RUNTIME_MEMORY_PRESSURE (the OOM-recovery path) once
// per new low; a reading back above the threshold re-arms it.
TEST(SafetyMonitor, MemoryPressureActsOncePerNewLow) {
  Harness h;
  h.script.readings = {gpu_at(40, 4000 * kMiB), gpu_at(40, 90 * kMiB),  gpu_at(40, 90 * kMiB),
                       gpu_at(40, 80 * kMiB),   gpu_at(40, 500 * kMiB), gpu_at(40, 95 * kMiB)};
  MonitorOptions o = sync_options();
  o.memory_low_bytes = 100 * kMiB;
  h.start(o);
  auto hook = [&](bool can_shrink) { h.monitor->between_micro_batches(1, can_shrink, {}); };
  EXPECT_EQ(code_of([&] { hook(true); }), ErrorCode::RUNTIME_MEMORY_PRESSURE);  // 90 MiB
  EXPECT_NO_THROW(hook(true));                                                  // 90 MiB again: done already
  EXPECT_EQ(code_of([&] { hook(true); }), ErrorCode::RUNTIME_MEMORY_PRESSURE);  // 80 MiB: a new low
  EXPECT_NO_THROW(hook(true));                                                  // 500 MiB: re-armed
  EXPECT_EQ(code_of([&] { hook(true); }), ErrorCode::RUNTIME_MEMORY_PRESSURE);  // 95 MiB
  EXPECT_EQ(h.events.back().at("bytes_available"), 95 * kMiB);
}

TEST(SafetyMonitor, MemoryPressureWithNothingLeftToShrinkOnlyWarns) {
  Harness h;
  h.script.readings = {gpu_at(40, 4000 * kMiB), gpu_at(40, 50 * kMiB)};
  MonitorOptions o = sync_options();
  o.memory_low_bytes = 100 * kMiB;
  h.start(o);
  EXPECT_NO_THROW(h.monitor->between_micro_batches(1, false, {}));
  EXPECT_NO_THROW(h.monitor->between_micro_batches(1, false, {}));
  EXPECT_EQ(h.event_names(), (std::vector<std::string>{"memory_pressure"})) << "one warning, not one per batch";

  Harness off;  // memory_low none: never acts
  off.script.readings = {gpu_at(40, 4000 * kMiB), gpu_at(40, 1 * kMiB)};
  o.memory_low_bytes = 0;
  off.start(o);
  EXPECT_NO_THROW(off.monitor->between_micro_batches(1, true, {}));
  EXPECT_TRUE(off.events.empty());
}

// --max-memory auto on the CPU: the smaller of MemAvailable and the cgroup's room, minus the
// headroom, plus what the run already holds; the auto low threshold is half the headroom.
TEST(SafetyMonitor, MemoryBudgetUsesTheCgroupRoomMinusHeadroom) {
  Harness h;
  MonitorReadings r;
  r.memory.mem_available_bytes = 8000 * kMiB;
  r.memory.cgroup_limited = true;
  r.memory.cgroup_max_bytes = 1200 * kMiB;
  r.memory.cgroup_current_bytes = 200 * kMiB;
  h.script.readings = {r};
  h.start(sync_options());  // headroom auto: 10% of the 1000 MiB room
  EXPECT_EQ(h.monitor->memory_budget_bytes(50 * kMiB), (50 + 1000 - 100) * kMiB);
  EXPECT_EQ(h.monitor->memory_low_bytes(), 50 * kMiB);
  EXPECT_EQ(h.events.back().at("event"), "memory_budget");

  Harness fixed;
  fixed.script.readings = {r};
  MonitorOptions o = sync_options();
  o.memory_headroom_bytes = 300 * kMiB;
  fixed.start(o);
  EXPECT_EQ(fixed.monitor->memory_budget_bytes(0), 700 * kMiB);

  SafetyMonitor disabled(MonitorOptions{}, {});
  EXPECT_EQ(disabled.memory_budget_bytes(0), kNoLimit);
}

TEST(SafetyMonitor, DiskWarnsAheadThenRefusesBeforeWriting) {
  Harness h;
  h.script.readings = {gpu_at(40)};
  MonitorOptions o = sync_options();
  o.disk_warn_checkpoints = 3;
  h.start(o);
  h.script.disk_free = 1000 * kMiB;
  h.monitor->before_checkpoint("/out", 100 * kMiB, 1);  // room for 10: quiet
  EXPECT_TRUE(h.events.empty());
  h.script.disk_free = 250 * kMiB;
  h.monitor->before_checkpoint("/out", 100 * kMiB, 2);  // room for 2 < 3: warn ahead, once
  h.monitor->before_checkpoint("/out", 100 * kMiB, 3);
  EXPECT_EQ(h.event_names(), (std::vector<std::string>{"disk_low"}));
  h.script.disk_free = 99 * kMiB;
  EXPECT_EQ(code_of([&] { h.monitor->before_checkpoint("/out", 100 * kMiB, 4); }), ErrorCode::STATE_DISK_FULL);
  EXPECT_EQ(h.events.back().at("code"), "STATE_DISK_FULL");

  Harness quiet;  // disk_warn_checkpoints 0: no warning ahead, still refuses when it cannot fit
  quiet.script.readings = {gpu_at(40)};
  o.disk_warn_checkpoints = 0;
  quiet.start(o);
  quiet.script.disk_free = 150 * kMiB;
  quiet.monitor->before_checkpoint("/out", 100 * kMiB, 1);
  EXPECT_TRUE(quiet.events.empty());
}

TEST(SafetyMonitor, FakeNvmlReadsTheScriptWithThresholdsAndThrottling) {
  test::TempDir tmp;
  test::write_text_file(tmp.path + "/script", "slowdown 87 shutdown 95 temps 60 88");
  setenv("BP_FAKE_NVML_SCRIPT", (tmp.path + "/script").c_str(), 1);
  Nvml n(BP_FAKE_NVML);
  ASSERT_EQ(n.status(), Nvml::Status::Ready) << n.why();
  std::vector<GpuReading> g = n.read();
  ASSERT_EQ(g.size(), 1u);
  EXPECT_DOUBLE_EQ(g[0].celsius, 60);
  EXPECT_DOUBLE_EQ(g[0].slowdown_c, 87);
  EXPECT_DOUBLE_EQ(g[0].shutdown_c, 95);
  EXPECT_EQ(g[0].memory_total_bytes, 80ull << 30);
  EXPECT_DOUBLE_EQ(g[0].power_watts, 250);
  EXPECT_FALSE(g[0].thermal_throttling());
  g = n.read();
  EXPECT_DOUBLE_EQ(g[0].celsius, 88);
  EXPECT_TRUE(g[0].thermal_throttling());
  EXPECT_EQ(g[0].throttle_text(), "hw_thermal");
  unsetenv("BP_FAKE_NVML_SCRIPT");
}

TEST(SafetyMonitor, BrokenNvmlIsReportedOnceAndMonitoringGoesOn) {
  test::TempDir tmp;
  test::write_text_file(tmp.path + "/script", "init_fail");
  setenv("BP_FAKE_NVML_SCRIPT", (tmp.path + "/script").c_str(), 1);
  MonitorOptions o = sync_options();
  o.system_root = tmp.path;  // empty tree: no CPU sensors, no memory readings
  o.nvml_library = BP_FAKE_NVML;
  std::vector<nlohmann::json> events;
  SafetyMonitor m(o, [&](const nlohmann::json& r) { events.push_back(r); });
  EXPECT_NO_THROW(m.between_micro_batches(1, true, {}));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].at("code"), "RUNTIME_GPU_MONITORING_FAILED");
  EXPECT_NE(events[0].at("message").get<std::string>().find("Driver Not Loaded"), std::string::npos);
  unsetenv("BP_FAKE_NVML_SCRIPT");
}

// With a poll period the readings come from a thread; the hook only looks at the latest one.
TEST(SafetyMonitor, PollingThreadKeepsReading) {
  Harness h;
  h.script.readings = {gpu_at(40)};
  MonitorOptions o = sync_options();
  o.synchronous = false;
  o.poll_period_s = 0.001;
  h.start(o);
  for (int i = 0; i < 20000 && h.monitor->polls() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_GE(h.monitor->polls(), 3) << "the thread polls on its own";
  const int64_t before = h.monitor->polls();
  h.monitor->between_micro_batches(1, true, {});  // no reading of its own (it may race the thread)
  EXPECT_GE(h.monitor->polls(), before);
}

// Every [monitor] setting reaches MonitorOptions (each one's effect is tested above and in
// monitor_run_test.cpp); levels that do not rise are refused.
TEST(SafetyMonitor, SettingsMapToOptions) {
  Settings s;
  s.set("monitor.enabled", "false");
  s.set("monitor.poll_period_s", "0.5");
  s.set("monitor.temperature_warning_c", "70");
  s.set("monitor.temperature_critical_c", "75");
  s.set("monitor.temperature_emergency_c", "85");
  s.set("monitor.threshold_margin_c", "5");
  s.set("monitor.cooldown_s", "7");
  s.set("monitor.max_pause_s", "90");
  s.set("monitor.memory_headroom", "300M");
  s.set("monitor.memory_low", "none");
  s.set("monitor.disk_warn_checkpoints", "2");
  s.set("monitor.system_root", "/fake");
  s.set("monitor.nvml_library", "libfake.so");
  MonitorOptions o = MonitorOptions::from_settings(s);
  EXPECT_FALSE(o.enabled);
  EXPECT_EQ(o.poll_period_s, 0.5);
  EXPECT_EQ(o.warning_c, 70);
  EXPECT_EQ(o.critical_c, 75);
  EXPECT_EQ(o.emergency_c, 85);
  EXPECT_EQ(o.margin_c, 5);
  EXPECT_EQ(o.cooldown_s, 7);
  EXPECT_EQ(o.max_pause_s, 90);
  EXPECT_EQ(o.memory_headroom_bytes, static_cast<int64_t>(300 * kMiB));
  EXPECT_EQ(o.memory_low_bytes, 0);
  EXPECT_EQ(o.disk_warn_checkpoints, 2);
  EXPECT_EQ(o.system_root, "/fake");
  EXPECT_EQ(o.nvml_library, "libfake.so");
  EXPECT_EQ(MonitorOptions::from_settings(Settings()).memory_low_bytes, -1) << "auto";
  EXPECT_TRUE(MonitorOptions::from_settings(Settings()).enabled);
  s.set("monitor.temperature_critical_c", "99");
  EXPECT_EQ(code_of([&] { MonitorOptions::from_settings(s); }), ErrorCode::CONFIG_INVALID_SETTING);
}

}  // namespace bp
