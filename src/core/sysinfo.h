// Facts about this machine and build for `backprop info` and bug reports: CPU (from /proc/cpuinfo),
// memory (/proc/meminfo), BLAS, CUDA (via core/device_info.h; never throws, reports why a
// GPU is not usable) and the feature matrix (which optional parts work here, and why not).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/device_info.h"

namespace bp {

struct CpuInfo {
  std::string model;                  // "AMD EPYC 7B13" ("unknown" when /proc/cpuinfo lacks it)
  int logical_cores = 0;              // threads the OS schedules
  int physical_cores = 0;             // distinct (physical id, core id) pairs; 0 when unknown
  std::vector<std::string> features;  // the SIMD features backprop cares about, in a fixed order
};
// Parses /proc/cpuinfo text (a parameter so tests can feed known text).
CpuInfo parse_cpuinfo(const std::string& text);
CpuInfo cpu_info();

struct MemInfo {
  uint64_t bytes_total = 0, bytes_available = 0;
};
MemInfo parse_meminfo(const std::string& text);
MemInfo mem_info();

struct Feature {
  std::string name;
  bool available = false;
  std::string detail;  // what it is, or why it is not available
};

struct SystemInfo {
  std::string version, build_type, compiler, flags;
  bool sanitizers = false;
  std::string blas;
  int blas_threads = 0;
  CpuInfo cpu;
  MemInfo mem;
  CudaStatus cuda;
  bool nvml_loadable = false;
  std::vector<Feature> features;
};
SystemInfo system_info();
nlohmann::json to_json(const SystemInfo& s);
// Human-readable report (several lines).
std::string to_text(const SystemInfo& s);

}  // namespace bp
