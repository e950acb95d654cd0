// Memory, cgroup v2 and temperature readings from a fake sysfs/procfs root (issue 20).
#include "core/system_readings.h"

#include "core/nvml.h"
#include "support/fake_system_root.h"
#include "support/test_util.h"

namespace bp {

constexpr uint64_t kMiB = 1ull << 20;

TEST(SystemReadings, MemAvailableWithoutCgroupLimit) {
  test::TempDir tmp;
  test::FakeSystemRoot fake{tmp.path};
  fake.meminfo(8192 * kMiB, 3000 * kMiB);
  fake.own_cgroup("/user.slice");
  fake.cgroup_memory("/user.slice", "max", 100 * kMiB);
  MemoryReading m = read_memory(tmp.path);
  EXPECT_EQ(m.mem_total_bytes, 8192 * kMiB);
  EXPECT_EQ(m.mem_available_bytes, 3000 * kMiB);
  EXPECT_FALSE(m.cgroup_limited) << "memory.max 'max' is no limit";
  EXPECT_EQ(m.available_bytes(), 3000 * kMiB);
}

// The tightest level on the path from the process's cgroup to the root is the one the kernel
// enforces first: here the parent's room (1000 - 900 MiB) is smaller than the child's.
TEST(SystemReadings, CgroupRoomOfTheTightestLevelBoundsAvailable) {
  test::TempDir tmp;
  test::FakeSystemRoot fake{tmp.path};
  fake.meminfo(8192 * kMiB, 3000 * kMiB);
  fake.own_cgroup("/jobs/train");
  fake.cgroup_memory("/jobs/train", std::to_string(600 * kMiB), 300 * kMiB);
  fake.cgroup_memory("/jobs", std::to_string(1000 * kMiB), 900 * kMiB);
  MemoryReading m = read_memory(tmp.path);
  ASSERT_TRUE(m.cgroup_limited);
  EXPECT_EQ(m.cgroup_max_bytes, 1000 * kMiB);
  EXPECT_EQ(m.cgroup_current_bytes, 900 * kMiB);
  EXPECT_EQ(m.available_bytes(), 100 * kMiB);

  fake.cgroup_memory("/jobs", "max", 900 * kMiB);  // the parent lifts its limit: the child's room counts
  m = read_memory(tmp.path);
  EXPECT_EQ(m.cgroup_max_bytes, 600 * kMiB);
  EXPECT_EQ(m.available_bytes(), 300 * kMiB);
}

TEST(SystemReadings, MissingFilesReadAsUnknown) {
  test::TempDir tmp;
  MemoryReading m = read_memory(tmp.path);
  EXPECT_EQ(m.available_bytes(), 0u);
  EXPECT_FALSE(m.cgroup_limited);
  EXPECT_TRUE(read_cpu_temperatures(tmp.path).empty());
}

TEST(SystemReadings, HwmonAndThermalZoneTemperatures) {
  test::TempDir tmp;
  test::FakeSystemRoot fake{tmp.path};
  fake.hwmon(0, "coretemp", 1, 71.5, 100);
  fake.hwmon(0, "coretemp", 2, 64);
  fake.thermal_zone(0, "x86_pkg_temp", 73.25);
  std::vector<TemperatureReading> t = read_cpu_temperatures(tmp.path);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].sensor, "hwmon0/coretemp/temp1");
  EXPECT_DOUBLE_EQ(t[0].celsius, 71.5);
  EXPECT_DOUBLE_EQ(t[0].shutdown_c, 100);
  EXPECT_EQ(t[1].sensor, "hwmon0/coretemp/temp2");
  EXPECT_DOUBLE_EQ(t[1].shutdown_c, 0) << "no temp2_crit";
  EXPECT_EQ(t[2].sensor, "thermal_zone0/x86_pkg_temp");
  EXPECT_DOUBLE_EQ(t[2].celsius, 73.25);
}

TEST(Nvml, MissingLibraryIsAbsentNotBroken) {
  Nvml n("/nonexistent/libnvidia-ml.so.1");
  EXPECT_EQ(n.status(), Nvml::Status::Absent);
  EXPECT_NE(n.why().find("cannot be loaded"), std::string::npos) << n.why();
  EXPECT_TRUE(n.read().empty());
}

// A library that loads but lacks NVML's functions is NVML present but broken.
TEST(Nvml, LibraryWithoutNvmlFunctionsIsBroken) {
  Nvml n("libm.so.6");
  EXPECT_EQ(n.status(), Nvml::Status::Broken);
  EXPECT_NE(n.why().find("has no function nvmlInit_v2"), std::string::npos) << n.why();
}

}  // namespace bp
