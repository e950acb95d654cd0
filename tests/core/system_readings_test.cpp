// Memory, cgroup (v2 and v1) and temperature readings from a fake sysfs/procfs root (issue 20).
#include "core/system_readings.h"

#include "core/error.h"
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

// cgroup v1 (a container on a v1 host): the memory controller's memory.limit_in_bytes of the
// process's memory cgroup bounds what is available, the tightest level winning as in v2.
TEST(SystemReadings, CgroupV1LimitBoundsAvailable) {
  test::TempDir tmp;
  test::FakeSystemRoot fake{tmp.path};
  fake.meminfo(64000 * kMiB, 60000 * kMiB);
  fake.own_cgroup_v1("/jobs/train");
  const uint64_t unlimited = 9223372036854771712ull;  // v1's "no limit" with 4 KiB pages
  fake.cgroup_v1_memory("", unlimited, 5000 * kMiB);
  fake.cgroup_v1_memory("/jobs", 1000 * kMiB, 900 * kMiB);
  fake.cgroup_v1_memory("/jobs/train", 600 * kMiB, 300 * kMiB);
  MemoryReading m = read_memory(tmp.path);
  ASSERT_TRUE(m.cgroup_limited);
  EXPECT_EQ(m.cgroup_version, 1);
  EXPECT_EQ(m.cgroup_max_bytes, 1000 * kMiB) << "the parent's room (100 MiB) is the smaller";
  EXPECT_EQ(m.cgroup_current_bytes, 900 * kMiB);
  EXPECT_EQ(m.available_bytes(), 100 * kMiB);
  EXPECT_EQ(m.limit_text(), format_bytes(1000 * kMiB) + " (cgroup v1 " + tmp.path +
                                "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes, " + format_bytes(900 * kMiB) +
                                " in use)");

  fake.cgroup_v1_memory("/jobs", unlimited, 900 * kMiB);
  m = read_memory(tmp.path);
  EXPECT_EQ(m.cgroup_max_bytes, 600 * kMiB);
  EXPECT_EQ(m.available_bytes(), 300 * kMiB);
}

// v1 says "no limit" with the largest page-aligned value (4 KiB pages: 9223372036854771712; 64 KiB
// pages: 9223372036854710272): no limit, and the report says where it looked.
TEST(SystemReadings, CgroupV1HugeValuesAreNoLimit) {
  test::TempDir tmp;
  test::FakeSystemRoot fake{tmp.path};
  fake.meminfo(8192 * kMiB, 3000 * kMiB);
  fake.own_cgroup_v1("/user");
  fake.cgroup_v1_memory("", 9223372036854771712ull, 100 * kMiB);
  fake.cgroup_v1_memory("/user", 9223372036854710272ull, 100 * kMiB, 9223372036854771712ull);
  const MemoryReading m = read_memory(tmp.path);
  EXPECT_FALSE(m.cgroup_limited);
  EXPECT_EQ(m.cgroup_version, 1);
  EXPECT_EQ(m.available_bytes(), 3000 * kMiB);
  EXPECT_EQ(m.limit_text(), "no limit (cgroup v1 " + tmp.path + "/sys/fs/cgroup/memory/user)");
}

// A container on a v1 host sees its own cgroup as the top of the memory mount (mountinfo's root
// /docker/abc) while /proc/self/cgroup names the host's path; a limit set above it is visible only
// as memory.stat's hierarchical_memory_limit.
TEST(SystemReadings, CgroupV1ContainerReadsTheMountTopAndTheHierarchicalLimit) {
  test::TempDir tmp;
  test::FakeSystemRoot fake{tmp.path};
  fake.meminfo(64000 * kMiB, 60000 * kMiB);
  fake.own_cgroup_v1("/docker/abc", "/docker/abc");
  fake.cgroup_v1_memory("", 9223372036854771712ull, 200 * kMiB, 2048 * kMiB);
  const MemoryReading m = read_memory(tmp.path);
  ASSERT_TRUE(m.cgroup_limited);
  EXPECT_EQ(m.cgroup_version, 1);
  EXPECT_EQ(m.cgroup_max_bytes, 2048 * kMiB);
  EXPECT_EQ(m.available_bytes(), 1848 * kMiB);
  EXPECT_EQ(m.cgroup_limit_file, "memory.stat");
  EXPECT_EQ(m.cgroup_path, tmp.path + "/sys/fs/cgroup/memory");
}

// A v2 limit is the one read where v2 has one; the report names v2.
TEST(SystemReadings, CgroupV2LimitIsReportedWithItsPath) {
  test::TempDir tmp;
  test::FakeSystemRoot fake{tmp.path};
  fake.meminfo(8192 * kMiB, 3000 * kMiB);
  fake.own_cgroup("/train");
  fake.cgroup_memory("/train", "max", 10 * kMiB);
  EXPECT_EQ(read_memory(tmp.path).limit_text(), "no limit (cgroup v2 " + tmp.path + "/sys/fs/cgroup/train)");
  fake.cgroup_memory("/train", std::to_string(500 * kMiB), 10 * kMiB);
  const MemoryReading m = read_memory(tmp.path);
  EXPECT_EQ(m.cgroup_version, 2);
  EXPECT_EQ(m.limit_text(), format_bytes(500 * kMiB) + " (cgroup v2 " + tmp.path + "/sys/fs/cgroup/train/memory.max, " +
                                format_bytes(10 * kMiB) + " in use)");
}

TEST(SystemReadings, MissingFilesReadAsUnknown) {
  test::TempDir tmp;
  MemoryReading m = read_memory(tmp.path);
  EXPECT_EQ(m.available_bytes(), 0u);
  EXPECT_FALSE(m.cgroup_limited);
  EXPECT_EQ(m.limit_text(), "no limit (no cgroup memory controller found)");
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
