#include "core/sysinfo.h"

#include <gtest/gtest.h>

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
  }
  EXPECT_TRUE(has_cuda_row);
  auto j = to_json(s);
  for (const char* k : {"version", "build", "cpu", "memory", "cuda", "gpus", "features"})
    EXPECT_TRUE(j.contains(k)) << k;
}

}  // namespace
}  // namespace bp
