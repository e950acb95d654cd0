#include "core/sysinfo.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <strings.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "build_info.h"
#include "core/collective.h"
#include "core/error.h"
#include "core/nccl.h"
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

CpuIsa cpu_isa() {
  CpuIsa isa;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return isa;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  isa.vendor = vendor;
  const unsigned max_leaf = a;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return isa;
  const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
  if (!osxsave || !avx || max_leaf < 7) return isa;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm_saved = (xcr0_lo & 0x6u) == 0x6u, zmm_saved = (xcr0_lo & 0xE0u) == 0xE0u;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512dq = b & (1u << 17);
  const bool avx512bw = b & (1u << 30), avx512vl = b & (1u << 31);
  isa.avx2_fma = ymm_saved && avx2 && fma && f16c;
  isa.avx512 = isa.avx2_fma && zmm_saved && avx512f && avx512dq && avx512bw && avx512vl;
  const bool amx_bf16 = d & (1u << 22), amx_tile = d & (1u << 24);
  const bool tile_saved = (xcr0_lo & 0x60000u) == 0x60000u;  // XTILECFG and XTILEDATA
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  __cpuid_count(7, 1, a1, b1, c1, d1);
  isa.avx512_bf16 = isa.avx512 && (a1 & (1u << 5));
  isa.amx_bf16 = isa.avx512 && amx_bf16 && amx_tile && tile_saved;
#endif
  return isa;
}

std::string openblas_core_type(const CpuIsa& isa, const std::string& openblas_own) {
  auto own_is = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (strcasecmp(openblas_own.c_str(), n) == 0) return true;
    return false;
  };
  if (isa.avx512) return own_is({"SkylakeX", "Cooperlake", "SapphireRapids"}) ? "" : "SkylakeX";
  if (isa.avx2_fma) {
    if (own_is({"Haswell", "Zen"})) return "";
    return isa.vendor == "AuthenticAMD" ? "Zen" : "Haswell";
  }
  return "";
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

uint64_t process_resident_bytes() {
  std::istringstream in(read_file("/proc/self/status"));
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;  // "kB"
  return 0;
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
  s.blas_core = blas_core_name();
  const CpuIsa isa = cpu_isa();
  const char* env_core = std::getenv("OPENBLAS_CORETYPE");
  const char* replaced = std::getenv("BACKPROP_OPENBLAS_OWN_CORE");  // set by cli/main.cpp when it chose
  s.blas_core_why = env_core == nullptr ? "OpenBLAS's own detection, OPENBLAS_CORETYPE unset"
                    : replaced != nullptr
                        ? fmt::format(
                              "OPENBLAS_CORETYPE={} set by backprop: OpenBLAS's own pick, {}, does not use "
                              "this CPU's vector units",
                              env_core, replaced)
                        : fmt::format("OPENBLAS_CORETYPE={}, set by the user", env_core);
  s.cpu = cpu_info();
  s.mem = mem_info();
  s.mem_limit = read_memory("");
  s.cuda = cuda_status();
  s.nvml_loadable = nvml_loadable();

  bool gpu = !s.cuda.devices.empty();
  s.features.push_back(
      {"cpu_training", true, fmt::format("BLAS: {} ({} threads, {} kernels)", s.blas, s.blas_threads, s.blas_core)});
  s.features.push_back(
      {"avx2_fma", isa.avx2_fma,
       isa.avx2_fma ? fmt::format("used by OpenBLAS ({} kernels) and the avx2/avx512 kernel variants", s.blas_core)
                    : "this CPU lacks AVX2/FMA: OpenBLAS and the kernels run their SSE/NEON code"});
  // What the CUDA part of a CUDA build has: a kernel for every op of the dispatch table (ops/
  // kernels.inc), the caching allocator and device queries. The kernels are verified on the CPU
  // simulation of the CUDA thread model (tests/cuda); this line claims no run on a GPU.
  s.features.push_back(
      {"cuda_backend", s.cuda.compiled,
       s.cuda.compiled
           ? fmt::format("CUDA runtime {}.{}: training kernels for every op (tested on the CPU simulation of "
                         "CUDA), caching GPU memory allocator, device queries",
                         s.cuda.runtime_version / 1000, (s.cuda.runtime_version % 1000) / 10)
           : "not compiled in (configure with -DBACKPROP_CUDA=ON where the CUDA toolkit exists)"});
  s.features.push_back(
      {"gpu_training", s.cuda.usable(),
       !s.cuda.compiled ? "this build has no CUDA training kernels: training runs on the CPU (no CUDA backend)"
       : s.cuda.usable()
           ? fmt::format("--device auto or cuda trains on CUDA device 0 ({} device(s) visible)", s.cuda.devices.size())
           : fmt::format("CUDA training kernels are built in, but no usable device: training runs on the "
                         "CPU ({})",
                         s.cuda.why_unavailable)});
  s.features.push_back({"gpu_monitoring", s.nvml_loadable && gpu,
                        !s.nvml_loadable ? "libnvidia-ml.so.1 (NVML, from the NVIDIA driver) cannot be loaded"
                        : !gpu           ? "NVML loads, but no GPU is usable"
                                         : "NVML temperature and memory readings"});
  // Data-parallel training over MPI (core/collective.h): the plugin loads (with the MPI library it
  // links) and mpirun is there for `train --nproc`.
  {
    const PluginAvailability mpi = mpi_plugin_availability();
    const std::string mpirun = find_mpirun();
    s.features.push_back(
        {"mpi", mpi.available,
         mpi.available ? fmt::format("data-parallel training under mpirun / srun (plugin {}); train --nproc N: {}",
                                     mpi.path, mpirun.empty() ? "mpirun not found" : mpirun)
                       : "the MPI collective plugin cannot be loaded: " + mpi.why +
                             " (apt-get install openmpi-bin libopenmpi-dev, then rebuild)"});
  }
  // NCCL for data-parallel runs on CUDA devices (core/nccl.h): loaded at run time, never linked.
  {
    const NcclAvailability nccl = nccl_availability();
    s.features.push_back(
        {"nccl", nccl.available,
         nccl.available ? fmt::format("NCCL {} ({}): a data-parallel run on CUDA devices sums its gradients GPU to GPU",
                                      nccl.version, nccl.path)
                        : "NCCL (libnccl.so.2) cannot be loaded: " + nccl.why +
                              "; a data-parallel run on CUDA devices sends its gradients through the host over MPI"});
  }
  s.features.push_back({"sanitizers", s.sanitizers,
                        s.sanitizers ? "built with AddressSanitizer and UBSan"
                                     : "release build (configure with -DBACKPROP_SANITIZE=ON)"});
  return s;
}

std::string gpu_training_use(const CudaStatus& cuda, const CudaDeviceInfo& d) {
  if (d.index != 0) return "not used for training: this version trains on device 0 only";
  if (!cuda.compiled) return "not used for training: this build has no CUDA backend";
  if (cuda.usable()) return "used for training (--device auto or cuda)";
  return "not used for training: " + cuda.why_unavailable;
}

nlohmann::json to_json(const SystemInfo& s) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const auto& d : s.cuda.devices)
    gpus.push_back({{"index", d.index},
                    {"name", d.name},
                    {"bytes_total", d.bytes_total},
                    {"bytes_free", d.bytes_free},
                    {"free_measured", d.free_measured},
                    {"training", gpu_training_use(s.cuda, d)},
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
        {"blas_core", s.blas_core},
        {"blas_core_why", s.blas_core_why},
        {"cuda_compiled", s.cuda.compiled}}},
      {"cpu",
       {{"model", s.cpu.model},
        {"logical_cores", s.cpu.logical_cores},
        {"physical_cores", s.cpu.physical_cores},
        {"features", s.cpu.features}}},
      {"cpu_kernels",
       {{"variant", s.cpu_kernels}, {"reason", s.cpu_kernels_reason}, {"supported", s.cpu_kernels_supported}}},
      {"cpu_gemm",
       {{"setting", s.cpu_gemm},
        {"held_bf16", s.cpu_gemm_held_bf16},
        {"reason", s.cpu_gemm_reason},
        {"onednn", !s.onednn_version.empty()},
        {"onednn_version", s.onednn_version},
        {"compute", s.cpu_compute}}},
      {"memory",
       {{"bytes_total", s.mem.bytes_total},
        {"bytes_available", s.mem.bytes_available},
        {"limit",
         {{"limited", s.mem_limit.cgroup_limited},
          {"bytes_max", s.mem_limit.cgroup_limited ? nlohmann::json(s.mem_limit.cgroup_max_bytes) : nullptr},
          {"bytes_current", s.mem_limit.cgroup_limited ? nlohmann::json(s.mem_limit.cgroup_current_bytes) : nullptr},
          {"cgroup_version", s.mem_limit.cgroup_version},
          {"path", s.mem_limit.cgroup_path},
          {"file", s.mem_limit.cgroup_limit_file},
          {"text", s.mem_limit.limit_text()}}}}},
      {"cuda",
       {{"compiled", s.cuda.compiled},
        {"runtime_version", s.cuda.runtime_version},
        {"driver_version", s.cuda.driver_version},
        {"why_unavailable", s.cuda.why_unavailable},
        {"compute", s.cuda.compute},
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
  t += fmt::format("  BLAS kernels: {} ({})\n", s.blas_core, s.blas_core_why);
  if (!s.cpu_kernels.empty()) {
    std::string sup;
    for (const auto& v : s.cpu_kernels_supported) sup += (sup.empty() ? "" : ", ") + v;
    t += fmt::format("  CPU kernels: {} ({}); this CPU runs: {}\n", s.cpu_kernels, s.cpu_kernels_reason, sup);
  }
  if (!s.cpu_gemm.empty()) {
    t += fmt::format("  CPU GEMMs: runtime.cpu_gemm = {}; against bf16-held weights {} ({}); oneDNN {}\n", s.cpu_gemm,
                     s.cpu_gemm_held_bf16, s.cpu_gemm_reason,
                     s.onednn_version.empty() ? "not linked" : s.onednn_version + " linked");
    t += fmt::format("  CPU compute: {}\n", s.cpu_compute);
  }
  t += fmt::format("  CUDA:     {}\n", s.cuda.compiled ? fmt::format("training kernels, caching allocator, device "
                                                                     "queries; runtime {}, driver {}",
                                                                     cuda_version_text(s.cuda.runtime_version),
                                                                     cuda_version_text(s.cuda.driver_version))
                                                       : "not compiled in");
  if (!s.cuda.compute.empty()) t += fmt::format("  CUDA compute: {}\n", s.cuda.compute);
  t += fmt::format("CPU:        {}\n", s.cpu.model);
  t += fmt::format("  cores:    {} logical, {} physical\n", s.cpu.logical_cores, s.cpu.physical_cores);
  std::string feats;
  for (const auto& f : s.cpu.features) feats += (feats.empty() ? "" : " ") + f;
  t += fmt::format("  features: {}\n", feats.empty() ? "(none of note)" : feats);
  t += fmt::format("RAM:        {} total, {} available\n", format_bytes(s.mem.bytes_total),
                   format_bytes(s.mem.bytes_available));
  t += fmt::format("  memory limit: {}\n", s.mem_limit.limit_text());
  if (s.cuda.devices.empty()) {
    t += fmt::format("GPU:        no GPU found: training runs on the CPU ({})\n", s.cuda.why_unavailable);
  } else {
    for (const auto& d : s.cuda.devices)
      t += fmt::format("GPU {}:      {}, {} ({}), compute capability {}.{}; {}\n", d.index, d.name,
                       format_bytes(d.bytes_total),
                       d.free_measured ? format_bytes(d.bytes_free) + " free" : std::string("free not measured"),
                       d.cc_major, d.cc_minor, gpu_training_use(s.cuda, d));
  }
  t += "Features:\n";
  for (const auto& f : s.features)
    t += fmt::format("  {:<15} {:<3}  {}\n", f.name, f.available ? "yes" : "no", f.detail);
  return t;
}

}  // namespace bp
