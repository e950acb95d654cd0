#include "core/sysinfo.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <fstream>
#include <set>
#include <sstream>

#include "build_info.h"
#include "core/error.h"
#include "core/threads.h"

namespace bp {

namespace {

std::string read_file(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  size_t a = s.find_first_not_of(" \t");
  size_t b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// SIMD features that matter for our kernels, in the order they are printed.
constexpr const char* kCpuFeatures[] = {"sse4_2",   "avx",      "avx2",     "fma",         "f16c",
                                        "avx512f",  "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni",
                                        "amx_tile", "asimd",    "sve"};

bool nvml_loadable() {
  void* h = dlopen("libnvidia-ml.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!h) return false;
  dlclose(h);
  return true;
}

}  // namespace

CpuInfo parse_cpuinfo(const std::string& text) {
  CpuInfo c;
  std::istringstream in(text);
  std::string line, physical_id;
  std::set<std::string> flags, cores;
  int processors = 0;
  while (std::getline(in, line)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (key == "processor")
      ++processors;
    else if ((key == "model name" || key == "Model" || key == "cpu model") && c.model.empty())
      c.model = value;
    else if (key == "physical id")
      physical_id = value;
    else if (key == "core id")
      cores.insert(physical_id + ":" + value);
    else if ((key == "flags" || key == "Features") && flags.empty()) {
      std::istringstream fs(value);
      std::string f;
      while (fs >> f) flags.insert(f);
    }
  }
  if (c.model.empty()) c.model = "unknown";
  c.logical_cores = processors;
  c.physical_cores = static_cast<int>(cores.size());
  for (const char* f : kCpuFeatures)
    if (flags.count(f)) c.features.push_back(f);
  return c;
}

CpuInfo cpu_info() {
  CpuInfo c = parse_cpuinfo(read_file("/proc/cpuinfo"));
  c.logical_cores = hardware_threads();
  return c;
}

MemInfo parse_meminfo(const std::string& text) {
  MemInfo m;
  std::istringstream in(text);
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemTotal:") m.bytes_total = kb * 1024;
    if (key == "MemAvailable:") m.bytes_available = kb * 1024;
  }
  return m;
}

MemInfo mem_info() {
  return parse_meminfo(read_file("/proc/meminfo"));
}

SystemInfo system_info() {
  SystemInfo s;
  s.version = BP_VERSION;
  s.build_type = BP_BUILD_TYPE;
  s.compiler = BP_CXX_COMPILER;
  s.flags = trim(BP_CXX_FLAGS);
  s.sanitizers = std::string(BP_SANITIZE) == "ON";
  s.blas = blas_name();
  s.blas_threads = blas_num_threads();
  s.cpu = cpu_info();
  s.mem = mem_info();
  s.cuda = cuda_status();
  s.nvml_loadable = nvml_loadable();

  bool gpu = !s.cuda.devices.empty();
  auto has = [&](const char* f) {
    for (const auto& x : s.cpu.features)
      if (x == f) return true;
    return false;
  };
  s.features.push_back({"cpu_training", true, fmt::format("BLAS: {} ({} threads)", s.blas, s.blas_threads)});
  s.features.push_back({"avx2_fma", has("avx2") && has("fma"),
                        has("avx2") && has("fma") ? "AVX2/FMA used by BLAS and the compiled kernels"
                                                  : "this CPU lacks AVX2/FMA; scalar code paths are used"});
  s.features.push_back(
      {"cuda_backend", s.cuda.compiled,
       s.cuda.compiled
           ? fmt::format("CUDA runtime {}.{}", s.cuda.runtime_version / 1000, (s.cuda.runtime_version % 1000) / 10)
           : "not compiled in (configure with -DBACKPROP_CUDA=ON where the CUDA toolkit exists)"});
  s.features.push_back(
      {"gpu_training", gpu, gpu ? fmt::format("{} device(s)", s.cuda.devices.size()) : s.cuda.why_unavailable});
  s.features.push_back({"gpu_monitoring", s.nvml_loadable && gpu,
                        !s.nvml_loadable ? "libnvidia-ml.so.1 (NVML, from the NVIDIA driver) cannot be loaded"
                        : !gpu           ? "NVML loads, but no GPU is usable"
                                         : "NVML temperature and memory readings"});
  s.features.push_back({"sanitizers", s.sanitizers,
                        s.sanitizers ? "built with AddressSanitizer and UBSan"
                                     : "release build (configure with -DBACKPROP_SANITIZE=ON)"});
  return s;
}

nlohmann::json to_json(const SystemInfo& s) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& d : s.cuda.devices)
    gpus.push_back({{"index", d.index},
                    {"name", d.name},
                    {"bytes_total", d.bytes_total},
                    {"bytes_free", d.bytes_free},
                    {"compute_capability", fmt::format("{}.{}", d.cc_major, d.cc_minor)}});
  nlohmann::json features = nlohmann::json::array();
  for (const auto& f : s.features)
    features.push_back({{"name", f.name}, {"available", f.available}, {"detail", f.detail}});
  return {
      {"version", s.version},
      {"build",
       {{"type", s.build_type},
        {"compiler", s.compiler},
        {"flags", s.flags},
        {"sanitizers", s.sanitizers},
        {"blas", s.blas},
        {"blas_threads", s.blas_threads},
        {"cuda_compiled", s.cuda.compiled}}},
      {"cpu",
       {{"model", s.cpu.model},
        {"logical_cores", s.cpu.logical_cores},
        {"physical_cores", s.cpu.physical_cores},
        {"features", s.cpu.features}}},
      {"memory", {{"bytes_total", s.mem.bytes_total}, {"bytes_available", s.mem.bytes_available}}},
      {"cuda",
       {{"compiled", s.cuda.compiled},
        {"runtime_version", s.cuda.runtime_version},
        {"driver_version", s.cuda.driver_version},
        {"why_unavailable", s.cuda.why_unavailable},
        {"nvml_loadable", s.nvml_loadable}}},
      {"gpus", gpus},
      {"features", features},
  };
}

static std::string cuda_version_text(int v) {
  return v ? fmt::format("{}.{}", v / 1000, (v % 1000) / 10) : "none";
}

std::string to_text(const SystemInfo& s) {
  std::string t;
  t += fmt::format("backprop {} ({} build, {})\n", s.version, s.build_type, s.compiler);
  t += fmt::format("  flags:    {}\n", s.flags.empty() ? "(none)" : s.flags);
  t += fmt::format("  BLAS:     {} ({} threads)\n", s.blas, s.blas_threads);
  t += fmt::format("  CUDA:     {}\n", s.cuda.compiled ? fmt::format("compiled in; runtime {}, driver {}",
                                                                     cuda_version_text(s.cuda.runtime_version),
                                                                     cuda_version_text(s.cuda.driver_version))
                                                       : "not compiled in");
  t += fmt::format("CPU:        {}\n", s.cpu.model);
  t += fmt::format("  cores:    {} logical, {} physical\n", s.cpu.logical_cores, s.cpu.physical_cores);
  std::string feats;
  for (const auto& f : s.cpu.features) feats += (feats.empty() ? "" : " ") + f;
  t += fmt::format("  features: {}\n", feats.empty() ? "(none of note)" : feats);
  t += fmt::format("RAM:        {} total, {} available\n", format_bytes(s.mem.bytes_total),
                   format_bytes(s.mem.bytes_available));
  if (s.cuda.devices.empty()) {
    t += fmt::format("GPU:        no GPU found: training runs on the CPU ({})\n", s.cuda.why_unavailable);
  } else {
    for (const auto& d : s.cuda.devices)
      t += fmt::format("GPU {}:      {}, {} ({} free), compute capability {}.{}\n", d.index, d.name,
                       format_bytes(d.bytes_total), format_bytes(d.bytes_free), d.cc_major, d.cc_minor);
  }
  t += "Features:\n";
  for (const auto& f : s.features)
    t += fmt::format("  {:<15} {:<3}  {}\n", f.name, f.available ? "yes" : "no", f.detail);
  return t;
}

}  // namespace bp
