// NVML through dlopen. The declarations below are NVML's C API as documented in the NVML API
// Reference (nvml.h): every function returns nvmlReturn_t (0 = NVML_SUCCESS), a device is an
// opaque pointer, nvmlMemory_t is {total, free, used} in bytes, power is in milliwatts.
#include "core/nvml.h"

#include <dlfcn.h>
#include <fmt/format.h>

namespace bp {

namespace {

using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr int NVML_TEMPERATURE_GPU = 0;                 // nvmlTemperatureSensors_t
constexpr int NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0;  // nvmlTemperatureThresholds_t
constexpr int NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1;

// nvmlClocksThrottleReason* bits (nvml.h).
struct ThrottleBit {
  uint64_t bit;
  const char* name;
};
constexpr ThrottleBit kThrottleBits[] = {{0x1, "gpu_idle"},    {0x2, "applications_clocks"}, {0x4, "sw_power_cap"},
                                         {0x8, "hw_slowdown"}, {0x10, "sync_boost"},         {0x20, "sw_thermal"},
                                         {0x40, "hw_thermal"}, {0x80, "hw_power_brake"},     {0x100, "display_clocks"}};
constexpr uint64_t kThermalBits = 0x20 | 0x40;

}  // namespace

struct Nvml::Api {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  nvmlReturn_t (*count)(unsigned*);
  nvmlReturn_t (*handle_by_index)(unsigned, nvmlDevice_t*);
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned*);
  nvmlReturn_t (*threshold)(nvmlDevice_t, int, unsigned*);
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned*);
  nvmlReturn_t (*throttle)(nvmlDevice_t, unsigned long long*);
  const char* (*error_string)(nvmlReturn_t);
};

bool GpuReading::thermal_throttling() const {
  return (throttle_reasons & kThermalBits) != 0;
}

std::string GpuReading::throttle_text() const {
  std::string out;
  for (const auto& b : kThrottleBits)
    if (throttle_reasons & b.bit) out += (out.empty() ? "" : ", ") + std::string(b.name);
  return out.empty() ? "none" : out;
}

Nvml::Nvml(const std::string& library) {
  if (library.empty()) {
    why_ = "no NVML library configured";
    return;
  }
  handle_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* e = dlerror();
    why_ = fmt::format("{} cannot be loaded: {}", library, e ? e : "unknown reason");
    return;
  }
  status_ = Status::Broken;  // until every symbol resolves and init succeeds
  api_ = std::make_unique<Api>();
  bool missing = false;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle_, name));
    if (!fn && !missing) {
      missing = true;
      why_ = fmt::format("{} has no function {}", library, name);
    }
  };
  sym(api_->init, "nvmlInit_v2");
  sym(api_->shutdown, "nvmlShutdown");
  sym(api_->count, "nvmlDeviceGetCount_v2");
  sym(api_->handle_by_index, "nvmlDeviceGetHandleByIndex_v2");
  sym(api_->temperature, "nvmlDeviceGetTemperature");
  sym(api_->threshold, "nvmlDeviceGetTemperatureThreshold");
  sym(api_->memory, "nvmlDeviceGetMemoryInfo");
  sym(api_->power, "nvmlDeviceGetPowerUsage");
  sym(api_->throttle, "nvmlDeviceGetCurrentClocksThrottleReasons");
  sym(api_->error_string, "nvmlErrorString");
  if (missing) return;
  if (nvmlReturn_t r = api_->init(); r != NVML_SUCCESS) {
    fail("nvmlInit_v2", r);
    return;
  }
  initialised_ = true;
  status_ = Status::Ready;
}

Nvml::~Nvml() {
  if (initialised_) api_->shutdown();
  if (handle_) dlclose(handle_);
}

std::vector<GpuReading> Nvml::fail(const std::string& what, int code) {
  status_ = Status::Broken;
  const char* text = api_ && api_->error_string ? api_->error_string(code) : nullptr;
  why_ = fmt::format("{} failed with NVML error {} ({})", what, code, text ? text : "no description");
  return {};
}

std::vector<GpuReading> Nvml::read() {
  if (status_ != Status::Ready) return {};
  unsigned n = 0;
  if (nvmlReturn_t r = api_->count(&n); r != NVML_SUCCESS) return fail("nvmlDeviceGetCount_v2", r);
  std::vector<GpuReading> out;
  for (unsigned i = 0; i < n; ++i) {
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t r = api_->handle_by_index(i, &dev); r != NVML_SUCCESS)
      return fail(fmt::format("nvmlDeviceGetHandleByIndex_v2({})", i), r);
    GpuReading g;
    g.index = i;
    unsigned t = 0;
    if (nvmlReturn_t r = api_->temperature(dev, NVML_TEMPERATURE_GPU, &t); r != NVML_SUCCESS)
      return fail(fmt::format("nvmlDeviceGetTemperature(gpu {})", i), r);
    g.celsius = t;
    // Thresholds, memory, power and throttle reasons are optional: some cards do not report them
    // (NVML_ERROR_NOT_SUPPORTED), which is no failure of the monitoring.
    if (unsigned v = 0; api_->threshold(dev, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, &v) == NVML_SUCCESS) g.slowdown_c = v;
    if (unsigned v = 0; api_->threshold(dev, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, &v) == NVML_SUCCESS) g.shutdown_c = v;
    if (nvmlMemory_t m{}; api_->memory(dev, &m) == NVML_SUCCESS) {
      g.memory_total_bytes = m.total;
      g.memory_used_bytes = m.used;
    }
    if (unsigned mw = 0; api_->power(dev, &mw) == NVML_SUCCESS) g.power_watts = mw / 1000.0;
    if (unsigned long long bits = 0; api_->throttle(dev, &bits) == NVML_SUCCESS) g.throttle_reasons = bits;
    out.push_back(g);
  }
  return out;
}

}  // namespace bp
