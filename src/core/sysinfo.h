// Facts about this machine and build for `backprop info` and bug reports: CPU (from /proc/cpuinfo),
// memory (/proc/meminfo), BLAS, CUDA (via core/device_info.h; never throws, reports why a
// GPU is not usable) and the feature matrix (which optional parts work here, and why not).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/device_info.h"
#include "core/system_readings.h"

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

// Instruction sets this CPU and its OS can run, from CPUID and XGETBV (x86-64; all false
// elsewhere). The one place that reads them: the CPU kernel variants (backend/cpu/kernel_variants.h)
// and the OpenBLAS core type both decide from this.
struct CpuIsa {
  std::string vendor;        // "GenuineIntel", "AuthenticAMD", ... ("" off x86)
  bool avx2_fma = false;     // AVX2 + FMA + F16C, YMM state saved by the OS
  bool avx512 = false;       // AVX-512 F, BW, DQ, VL, ZMM state saved by the OS
  bool avx512_bf16 = false;  // avx512 and AVX512_BF16 (bf16 dot products: Cooper Lake, Zen 4 and later)
  bool amx_bf16 = false;     // AMX-BF16 tiles, tile state saved by the OS (Sapphire Rapids and later)
};
CpuIsa cpu_isa();

// The OPENBLAS_CORETYPE backprop names when the user set none, given the core OpenBLAS picked by
// itself (openblas_get_corename()); "" = keep OpenBLAS's own choice. Debian's OpenBLAS 0.3.21
// falls back to SSE kernels ("Prescott") on CPUs it does not know (Intel since Ice Lake in some
// guests); where its choice already uses what the CPU has, it stays (on an AMD Zen 4 it picks
// Cooperlake: SkylakeX, Zen and Haswell measured the same there, docs/benchmarks.md). Otherwise:
// AVX-512 -> SkylakeX; AVX2 + FMA -> Zen on AMD (Haswell kernels, Zen blocking), Haswell elsewhere.
std::string openblas_core_type(const CpuIsa& isa, const std::string& openblas_own);

struct MemInfo {
  uint64_t bytes_total = 0, bytes_available = 0;
};
MemInfo parse_meminfo(const std::string& text);
MemInfo mem_info();
// This process's resident memory now (VmRSS of /proc/self/status), 0 where it cannot be read.
uint64_t process_resident_bytes();

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
  std::string blas_core;      // the OpenBLAS kernel set in use
  std::string blas_core_why;  // who chose it
  // The CPU kernel variant (backend/cpu/kernel_variants.h); filled by the caller (cli/cmd_info),
  // since core sits below backend. Empty = not reported.
  std::string cpu_kernels, cpu_kernels_reason;
  std::vector<std::string> cpu_kernels_supported;
  // The CPU's GEMM engines (backend/cpu/gemm_engine.h), filled by the caller likewise: runtime.cpu_gemm,
  // the path of the GEMMs against bf16-held weights and why, oneDNN's version ("" = not linked), and
  // what each GEMM kind computes in. Empty cpu_gemm = not reported.
  std::string cpu_gemm, cpu_gemm_held_bf16, cpu_gemm_reason, onednn_version, cpu_compute;
  CpuInfo cpu;
  MemInfo mem;
  // The cgroup memory limit (v2, else v1) and where it was read: system_info() reads the real
  // root; `backprop info` reads monitor.system_root when it is set (tests' fake trees).
  MemoryReading mem_limit;
  CudaStatus cuda;
  bool nvml_loadable = false;
  std::vector<Feature> features;
};
SystemInfo system_info();
nlohmann::json to_json(const SystemInfo& s);
// Human-readable report (several lines).
std::string to_text(const SystemInfo& s);
// Whether `info` may say device `d` trains: "used for training ..." for device 0 when the
// gpu_training feature is yes, else "not used for training: <why>".
std::string gpu_training_use(const CudaStatus& cuda, const CudaDeviceInfo& d);

}  // namespace bp
