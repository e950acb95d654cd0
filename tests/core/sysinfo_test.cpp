#include "core/sysinfo.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace bp {
namespace {

TEST(SysInfo, ParsesCpuinfo) {
  std::string text =
      "processor\t: 0\nmodel name\t: Test CPU 9000\nphysical id\t: 0\ncore id\t\t: 0\n"
      "flags\t\t: fpu sse4_2 avx avx2 fma avx512f\n\n"
      "processor\t: 1\nmodel name\t: Test CPU 9000\nphysical id\t: 0\ncore id\t\t: 0\n"
      "flags\t\t: fpu sse4_2 avx avx2 fma avx512f\n\n"
      "processor\t: 2\nmodel name\t: Test CPU 9000\nphysical id\t: 0\ncore id\t\t: 1\n"
      "flags\t\t: fpu sse4_2 avx avx2 fma avx512f\n";
  CpuInfo c = parse_cpuinfo(text);
  EXPECT_EQ(c.model, "Test CPU 9000");
  EXPECT_EQ(c.logical_cores, 3);
  EXPECT_EQ(c.physical_cores, 2);
  EXPECT_EQ(c.features, (std::vector<std::string>{"sse4_2", "avx", "avx2", "fma", "avx512f"}));
  EXPECT_EQ(parse_cpuinfo("").model, "unknown");
}

TEST(SysInfo, ParsesMeminfo) {
  MemInfo m = parse_meminfo("MemTotal:       16384 kB\nMemFree:  100 kB\nMemAvailable:    8192 kB\n");
  EXPECT_EQ(m.bytes_total, 16384u * 1024);
  EXPECT_EQ(m.bytes_available, 8192u * 1024);
}

// The process's resident memory (the memory plan's "process" part is measured with it): 64 MiB
// written in this process show up in it.
TEST(SysInfo, ProcessResidentBytesSeesMemoryThisProcessTouches) {
  const uint64_t before = process_resident_bytes();
  ASSERT_GT(before, 0u);
  std::vector<char> block(64u << 20);
  std::fill(block.begin(), block.end(), 1);
  const uint64_t after = process_resident_bytes();
  EXPECT_GE(after, before + (60u << 20)) << before << " -> " << after;
  EXPECT_EQ(block[12345], 1);
}

TEST(SysInfo, OpenblasCoreTypeForIntelAndAmd) {
  auto isa = [](const char* vendor, bool avx2, bool avx512) {
    CpuIsa i;
    i.vendor = vendor;
    i.avx2_fma = avx2;
    i.avx512 = avx512;
    return i;
  };
  // OpenBLAS fell back to SSE kernels (a CPU it does not know): name the right ones.
  EXPECT_EQ(openblas_core_type(isa("GenuineIntel", true, true), "Prescott"), "SkylakeX");  // Ice Lake .. SPR
  EXPECT_EQ(openblas_core_type(isa("AuthenticAMD", true, true), "Prescott"), "SkylakeX");  // Zen 4 unknown
  EXPECT_EQ(openblas_core_type(isa("AuthenticAMD", true, false), "Prescott"), "Zen");      // Zen 1-3
  EXPECT_EQ(openblas_core_type(isa("GenuineIntel", true, false), "Prescott"), "Haswell");  // Haswell .. Alder Lake
  EXPECT_EQ(openblas_core_type(isa("AuthenticAMD", true, false), "Sandybridge"), "Zen");   // AVX without FMA kernels
  // OpenBLAS's own pick already uses the vector units: kept (Zen 4 reads as Cooperlake).
  EXPECT_EQ(openblas_core_type(isa("AuthenticAMD", true, true), "Cooperlake"), "");
  EXPECT_EQ(openblas_core_type(isa("GenuineIntel", true, true), "SKYLAKEX"), "");
  EXPECT_EQ(openblas_core_type(isa("AuthenticAMD", true, false), "Zen"), "");
  EXPECT_EQ(openblas_core_type(isa("GenuineIntel", true, false), "Haswell"), "");
  // AVX-512 CPU with AVX2 kernels picked: upgraded.
  EXPECT_EQ(openblas_core_type(isa("GenuineIntel", true, true), "Haswell"), "SkylakeX");
  // Nothing better to name.
  EXPECT_EQ(openblas_core_type(isa("GenuineIntel", false, false), "Prescott"), "");
  EXPECT_EQ(openblas_core_type(isa("", false, false), "ARMV8"), "");  // not x86
}

// CPUID (cpu_isa) and the kernel's /proc/cpuinfo flags are two independent views of one CPU.
TEST(SysInfo, CpuidAgreesWithProcCpuinfo) {
  const CpuIsa isa = cpu_isa();
  const CpuInfo c = cpu_info();
  auto has = [&](const char* f) { return std::find(c.features.begin(), c.features.end(), f) != c.features.end(); };
#if defined(__x86_64__)
  EXPECT_FALSE(isa.vendor.empty());
  EXPECT_EQ(isa.avx2_fma, has("avx2") && has("fma") && has("f16c"));
  const bool listed_avx512 = has("avx512f") && has("avx512bw") && has("avx512vl");  // DQ comes with BW/VL
  EXPECT_EQ(isa.avx512, listed_avx512);
#else
  (void)has;
  EXPECT_FALSE(isa.avx2_fma || isa.avx512);
#endif
}

TEST(SysInfo, ThisMachineAndTheFeatureMatrix) {
  SystemInfo s = system_info();
  EXPECT_GE(s.cpu.logical_cores, 1);
  EXPECT_GT(s.mem.bytes_total, 0u);
  EXPECT_FALSE(s.blas.empty());
  EXPECT_GE(s.blas_threads, 1);
  // Without a usable device the reason is given; with one, its facts are.
  if (s.cuda.devices.empty()) {
    EXPECT_FALSE(s.cuda.why_unavailable.empty());
    EXPECT_NE(to_text(s).find("no GPU found: training runs on the CPU"), std::string::npos);
  } else {
    for (const auto& d : s.cuda.devices) {
      EXPECT_GT(d.bytes_total, 0u);
      EXPECT_GT(d.cc_major, 0);
    }
  }
  bool has_cuda_row = false;
  for (const auto& f : s.features) {
    EXPECT_FALSE(f.detail.empty()) << f.name;  // available or not, it says why
    if (f.name == "cuda_backend") has_cuda_row = f.available == s.cuda.compiled;
    // GPU training only with the CUDA backend AND a usable device; otherwise the line says why.
    if (f.name == "gpu_training") {
      const bool usable = !s.cuda.devices.empty() && s.cuda.why_unavailable.empty();
      EXPECT_EQ(f.available, s.cuda.compiled && usable) << f.detail;
      if (!s.cuda.compiled) {
        EXPECT_NE(f.detail.find("no CUDA training kernels"), std::string::npos) << f.detail;
      }
      if (s.cuda.compiled && !usable) {
        EXPECT_NE(f.detail.find("no usable device"), std::string::npos) << f.detail;
      }
    }
    if (f.name == "cuda_backend" && s.cuda.compiled) {
      EXPECT_NE(f.detail.find("training kernels for every op"), std::string::npos) << f.detail;
    }
  }
  EXPECT_TRUE(has_cuda_row);
  auto j = to_json(s);
  for (const char* k : {"version", "build", "cpu", "memory", "cuda", "gpus", "features"})
    EXPECT_TRUE(j.contains(k)) << k;
}

// The GPU lines of `info` agree with the gpu_training feature: device 0 is "used for training"
// exactly when training can use it, else the line says why not (an old card, another index).
TEST(SysInfo, GpuLinesSayWhetherTheDeviceTrains) {
  SystemInfo s;
  s.cuda.compiled = true;
  s.cuda.runtime_version = s.cuda.driver_version = 13000;
  CudaDeviceInfo a100{0, "NVIDIA A100", size_t{80} << 30, size_t{79} << 30, 8, 0, true};
  CudaDeviceInfo t4{1, "Tesla T4", size_t{16} << 30, 0, 7, 5, false};
  s.cuda.devices = {a100, t4};
  std::string text = to_text(s);
  EXPECT_NE(text.find("GPU 0:      NVIDIA A100, 80.00 GiB (79.00 GiB free), compute capability 8.0; used for training"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("Tesla T4, 16.00 GiB (free not measured), compute capability 7.5; not used for training: "
                      "this version trains on device 0 only"),
            std::string::npos)
      << text;
  EXPECT_EQ(to_json(s)["gpus"][0]["training"], "used for training (--device auto or cuda)");

  s.cuda.devices = {t4, a100};
  s.cuda.devices[0].index = 0;
  s.cuda.devices[1].index = 1;
  s.cuda.why_unavailable = "Tesla T4 has compute capability 7.5; this build's CUDA kernels need 8.0 or newer";
  text = to_text(s);
  EXPECT_NE(text.find("compute capability 7.5; not used for training: Tesla T4 has compute capability 7.5"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("; used for training"), std::string::npos) << text;
}

}  // namespace
}  // namespace bp
