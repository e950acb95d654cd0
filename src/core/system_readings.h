// Live readings of the machine for the safety monitor (issue 20; DESIGN.md "Trainer"): available
// memory of the machine and of the cgroup the process runs in (cgroup v2, else the v1 memory
// controller: a container's limit on a v1 host), and CPU temperatures from hwmon and thermal zones.
// GPU readings come from core/nvml.h.
//
// Every path is read under `root` ("" = the real "/"), so tests point the readings at a fake
// sysfs/procfs tree (monitor.system_root). Readings never throw: a file that is missing or
// unreadable leaves its field unknown (0 / no limit / no sensor), because the monitor must keep
// watching whatever it can and training must go on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bp {

struct MemoryReading {
  uint64_t mem_total_bytes = 0;      // /proc/meminfo MemTotal
  uint64_t mem_available_bytes = 0;  // /proc/meminfo MemAvailable
  // The tightest memory limit on the path from the process's cgroup up to the root, and that
  // cgroup's usage: cgroup v2 memory.max / memory.current; where v2 sets none, the v1 memory
  // controller's memory.limit_in_bytes / memory.usage_in_bytes (and memory.stat's
  // hierarchical_memory_limit, which also covers levels a container cannot see). cgroup_limited
  // false when every level says "max" (v1: 9223372036854771712 or any value from 2^62 up) or
  // there is no cgroup.
  bool cgroup_limited = false;
  uint64_t cgroup_max_bytes = 0;
  uint64_t cgroup_current_bytes = 0;
  // Where the limit was read: the folder whose limit is the tightest, or when there is none the
  // process's own cgroup folder that was looked at; "" and version 0 when no cgroup memory
  // controller was found (neither v2's memory.max nor a v1 memory mount).
  int cgroup_version = 0;
  std::string cgroup_path;
  std::string cgroup_limit_file;  // "memory.max", "memory.limit_in_bytes" or "memory.stat" (v1 hierarchical)

  // What can still be allocated before the kernel acts: MemAvailable, or less when the cgroup's
  // room (memory.max - memory.current) is smaller. 0 when nothing is known.
  uint64_t available_bytes() const;
  // "8.00 GiB (cgroup v1 /sys/fs/cgroup/memory/docker/x/memory.limit_in_bytes, 1.20 GiB in use)",
  // "no limit (cgroup v2 /sys/fs/cgroup/user.slice)", "no limit (no cgroup memory controller found)":
  // for `backprop info` and the dashboard.
  std::string limit_text() const;
};

MemoryReading read_memory(const std::string& root);

struct TemperatureReading {
  std::string sensor;     // "hwmon0/coretemp/temp1", "thermal_zone0/x86_pkg_temp", "gpu0"
  double celsius = 0;     // current temperature
  double slowdown_c = 0;  // where the hardware starts to slow down (hwmon temp*_max, NVML slowdown); 0 = unknown
  double shutdown_c = 0;  // where it shuts down (hwmon temp*_crit, NVML shutdown); 0 = unknown
};

// hwmon (<root>/sys/class/hwmon/hwmon*/temp*_input, millidegrees) and thermal zones
// (<root>/sys/class/thermal/thermal_zone*/temp).
std::vector<TemperatureReading> read_cpu_temperatures(const std::string& root);

// A live (not zombie) process's start time in clock ticks since boot (field 22 of /proc/PID/stat),
// or -1 when there is no such live process. The start time identifies the process across execve
// and tells a reused pid apart (the dashboard's run list; a data-parallel rank watching the others).
long long live_process_start(long pid);

}  // namespace bp
