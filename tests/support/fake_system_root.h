// A fake sysfs/procfs tree for the safety monitor's tests (monitor.system_root): /proc/meminfo,
// /proc/self/cgroup, cgroup v2 memory.max / memory.current, cgroup v1's memory controller and hwmon / thermal-zone
// temperatures, written as plain files under a temporary folder.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace bp::test {

inline void write_text_file(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::trunc) << text;
}

struct FakeSystemRoot {
  std::string root;
  void meminfo(uint64_t total_bytes, uint64_t available_bytes) const {
    write_text_file(root + "/proc/meminfo", "MemTotal:       " + std::to_string(total_bytes / 1024) +
                                                " kB\nMemFree:         1024 kB\nMemAvailable:   " +
                                                std::to_string(available_bytes / 1024) + " kB\n");
  }
  // The process's cgroup v2 path ("/train"), as /proc/self/cgroup's "0::" line says.
  void own_cgroup(const std::string& path) const { write_text_file(root + "/proc/self/cgroup", "0::" + path + "\n"); }
  // memory.max ("max" or bytes) and memory.current of the cgroup folder `path`.
  void cgroup_memory(const std::string& path, const std::string& max, uint64_t current) const {
    write_text_file(root + "/sys/fs/cgroup" + path + "/memory.max", max + "\n");
    write_text_file(root + "/sys/fs/cgroup" + path + "/memory.current", std::to_string(current) + "\n");
  }
  // cgroup v1: the process's memory cgroup ("4:memory:/docker/abc") and the memory mount
  // (/proc/self/mountinfo: mount point /sys/fs/cgroup/memory showing the cgroup `mount_root`).
  void own_cgroup_v1(const std::string& path, const std::string& mount_root = "/") const {
    write_text_file(root + "/proc/self/cgroup", "5:cpu,cpuacct:/\n4:memory:" + path + "\n0::/\n");
    write_text_file(root + "/proc/self/mountinfo",
                    "30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
                    "31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
                    "34 30 0:31 " +
                        mount_root + " /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n");
  }
  // memory.limit_in_bytes, memory.usage_in_bytes and (when hierarchical_limit is not 0) memory.stat
  // of the folder `path` under the v1 memory mount.
  void cgroup_v1_memory(const std::string& path, uint64_t limit, uint64_t usage,
                        uint64_t hierarchical_limit = 0) const {
    const std::string dir = root + "/sys/fs/cgroup/memory" + path;
    write_text_file(dir + "/memory.limit_in_bytes", std::to_string(limit) + "\n");
    write_text_file(dir + "/memory.usage_in_bytes", std::to_string(usage) + "\n");
    if (hierarchical_limit)
      write_text_file(dir + "/memory.stat", "cache 0\nrss " + std::to_string(usage) + "\nhierarchical_memory_limit " +
                                                std::to_string(hierarchical_limit) +
                                                "\nhierarchical_memsw_limit 9223372036854771712\n");
  }
  void hwmon(int n, const std::string& name, int temp, double celsius, double crit_c = 0) const {
    std::string dir = root + "/sys/class/hwmon/hwmon" + std::to_string(n);
    write_text_file(dir + "/name", name + "\n");
    write_text_file(dir + "/temp" + std::to_string(temp) + "_input",
                    std::to_string(static_cast<int64_t>(celsius * 1000)) + "\n");
    if (crit_c > 0)
      write_text_file(dir + "/temp" + std::to_string(temp) + "_crit",
                      std::to_string(static_cast<int64_t>(crit_c * 1000)) + "\n");
  }
  void thermal_zone(int n, const std::string& type, double celsius) const {
    std::string dir = root + "/sys/class/thermal/thermal_zone" + std::to_string(n);
    write_text_file(dir + "/type", type + "\n");
    write_text_file(dir + "/temp", std::to_string(static_cast<int64_t>(celsius * 1000)) + "\n");
  }
};

}  // namespace bp::test
