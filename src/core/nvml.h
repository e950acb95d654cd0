// GPU readings through NVML, loaded with dlopen at run time (DESIGN.md "Dependencies": there is no
// NVML header here, so nvml.cpp declares the few functions it calls with their documented C
// signatures). Temperature, the slowdown and shutdown thresholds, memory, power and the clock
// throttle reasons of every GPU.
//
// Three outcomes, because they mean different things to the safety monitor:
//   Absent: the library cannot be loaded (no NVIDIA driver: a CPU machine) — nothing to watch;
//   Broken: it loads but a function is missing, nvmlInit fails or a reading fails — the monitor
//           warns RUNTIME_GPU_MONITORING_FAILED once and training goes on;
//   Ready:  readings work.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace bp {

struct GpuReading {
  unsigned index = 0;
  double celsius = 0;
  double slowdown_c = 0;  // NVML_TEMPERATURE_THRESHOLD_SLOWDOWN; 0 = not reported
  double shutdown_c = 0;  // NVML_TEMPERATURE_THRESHOLD_SHUTDOWN; 0 = not reported
  uint64_t memory_total_bytes = 0, memory_used_bytes = 0;
  double power_watts = 0;             // 0 when the card does not report it
  uint64_t throttle_reasons = 0;      // nvmlClocksThrottleReason* bits
  bool thermal_throttling() const;    // SW or HW thermal slowdown bits set
  std::string throttle_text() const;  // "hw_thermal, sw_power_cap" or "none"
};

class Nvml {
 public:
  enum class Status { Absent, Broken, Ready };

  // dlopen(library) and nvmlInit_v2. Never throws.
  explicit Nvml(const std::string& library);
  ~Nvml();  // nvmlShutdown and dlclose
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  Status status() const { return status_; }
  const std::string& why() const { return why_; }  // what failed (Absent/Broken)
  // One reading per GPU. A failing call turns the status to Broken (with why()) and returns {}.
  std::vector<GpuReading> read();

 private:
  struct Api;
  std::vector<GpuReading> fail(const std::string& what, int code);  // marks Broken; returns {}
  void* handle_ = nullptr;
  std::unique_ptr<Api> api_;
  Status status_ = Status::Absent;
  std::string why_;
  bool initialised_ = false;
};

}  // namespace bp
