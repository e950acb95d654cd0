// Memory, cgroup (v2, else v1) and temperature readings under a (possibly fake) root. See system_readings.h.
#include "core/system_readings.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/sysinfo.h"

namespace bp {

namespace fs = std::filesystem;

namespace {

bool read_text(const fs::path& p, std::string* out) {
  std::ifstream in(p);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

// First whitespace-separated word of a file ("max", "123456").
bool read_word(const fs::path& p, std::string* out) {
  std::string text;
  if (!read_text(p, &text)) return false;
  std::istringstream in(text);
  return static_cast<bool>(in >> *out);
}

bool read_u64(const fs::path& p, uint64_t* out) {
  std::string w;
  if (!read_word(p, &w)) return false;
  try {
    size_t used = 0;
    *out = std::stoull(w, &used);
    return used == w.size();
  } catch (const std::exception&) {
    return false;
  }
}

bool read_double(const fs::path& p, double* out) {
  std::string w;
  if (!read_word(p, &w)) return false;
  try {
    *out = std::stod(w);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

fs::path under(const std::string& root, std::string_view abs_path) {
  return fs::path(root.empty() ? "/" : root) / fs::path(abs_path).relative_path();
}

// The process's cgroup path for one hierarchy from /proc/self/cgroup: v2's "0::/x" line when
// `controller` is empty, else the v1 line whose controller list ("4:memory:/x", "5:cpu,memory:/x")
// names it. "" when there is none.
std::string own_cgroup(const std::string& root, std::string_view controller) {
  std::string text;
  if (!read_text(under(root, "/proc/self/cgroup"), &text)) return {};
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    if (controller.empty()) {
      if (id == "0" && controllers.empty()) return line.substr(b + 1);
      continue;
    }
    std::istringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');)
      if (c == controller) return line.substr(b + 1);
  }
  return {};
}

// One level's limit, kept when its room (limit - usage) is the smallest so far.
void consider(MemoryReading* m, int version, const fs::path& dir, const char* file, uint64_t max_b, uint64_t cur_b) {
  const uint64_t room = max_b > cur_b ? max_b - cur_b : 0;
  const uint64_t best_room =
      m->cgroup_max_bytes > m->cgroup_current_bytes ? m->cgroup_max_bytes - m->cgroup_current_bytes : 0;
  if (m->cgroup_limited && room >= best_room) return;
  m->cgroup_limited = true;
  m->cgroup_max_bytes = max_b;
  m->cgroup_current_bytes = cur_b;
  m->cgroup_version = version;
  m->cgroup_path = dir.string();
  m->cgroup_limit_file = file;
}

// cgroup v2: memory.max of every level from the process's cgroup up to (not including) the root:
// the smallest room (max - current) is the one the kernel enforces first. True when v2 has the
// memory controller here (some level has a memory.max, or the root's cgroup.controllers names it).
bool read_cgroup_v2(const std::string& root, MemoryReading* m) {
  const std::string own = own_cgroup(root, "");
  if (own.empty()) return false;
  const fs::path base = under(root, "/sys/fs/cgroup");
  bool present = false;
  for (fs::path rel = fs::path(own).relative_path();; rel = rel.parent_path()) {
    const fs::path dir = rel.empty() ? base : base / rel;
    std::string max_text;
    if (read_word(dir / "memory.max", &max_text)) {
      if (!present && !m->cgroup_limited) m->cgroup_path = dir.string();  // the lowest level looked at
      present = true;
      uint64_t max_b = 0, cur_b = 0;
      if (max_text != "max" && read_u64(dir / "memory.max", &max_b)) {
        read_u64(dir / "memory.current", &cur_b);
        consider(m, 2, dir, "memory.max", max_b, cur_b);
      }
    }
    if (rel.empty() || rel == rel.parent_path()) break;
  }
  // A process in the root cgroup has no memory.max above it: v2 is there when its root lists the controller.
  std::string controllers;
  if (!present && read_text(base / "cgroup.controllers", &controllers) &&
      (" " + controllers + " ").find(" memory") != std::string::npos) {
    present = true;
    m->cgroup_path = base.string();
  }
  if (present && !m->cgroup_limited) m->cgroup_version = 2;
  return present;
}

// The v1 memory controller's mount: (mount point, the cgroup path mounted there) from
// /proc/self/mountinfo ("34 30 0:31 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory"),
// else the usual /sys/fs/cgroup/memory showing the whole tree.
std::pair<std::string, std::string> v1_memory_mount(const std::string& root) {
  std::string text;
  if (read_text(under(root, "/proc/self/mountinfo"), &text)) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      const size_t dash = line.find(" - ");
      if (dash == std::string::npos) continue;
      std::istringstream before(line.substr(0, dash)), after(line.substr(dash + 3));
      std::string id, parent, dev, mount_root, mount_point, fstype, source, options;
      if (!(before >> id >> parent >> dev >> mount_root >> mount_point) || !(after >> fstype >> source >> options))
        continue;
      if (fstype != "cgroup") continue;
      std::istringstream list(options);
      for (std::string o; std::getline(list, o, ',');)
        if (o == "memory") return {mount_point, mount_root};
    }
  }
  return {"/sys/fs/cgroup/memory", "/"};
}

// v1 reports "no limit" as the largest page-aligned value (9223372036854771712 with 4 KiB pages,
// less with bigger pages); nothing near 2^62 bytes is a real limit.
bool v1_limited(uint64_t v) {
  return v < (uint64_t{1} << 62);
}

// cgroup v1: memory.limit_in_bytes of every level from the process's memory cgroup up to the
// mount's top, and memory.stat's hierarchical_memory_limit of the process's own level (the
// tightest limit above it, including levels outside a container's view).
void read_cgroup_v1(const std::string& root, MemoryReading* m) {
  const std::string own = own_cgroup(root, "memory");
  if (own.empty()) return;
  const auto [mount_point, mount_root] = v1_memory_mount(root);
  const fs::path top = under(root, mount_point);
  // The process's path relative to the mount: a container sees its own cgroup as the mount's top.
  std::string rel = own;
  if (mount_root != "/" && rel.rfind(mount_root, 0) == 0) rel = rel.substr(mount_root.size());
  fs::path own_dir = fs::path(rel).relative_path().empty() ? top : top / fs::path(rel).relative_path();
  std::error_code ec;
  if (!fs::is_directory(own_dir, ec)) own_dir = top;  // a path from outside this mount namespace
  if (!fs::exists(own_dir / "memory.limit_in_bytes", ec)) return;
  if (!m->cgroup_limited) {
    m->cgroup_version = 1;
    m->cgroup_path = own_dir.string();
  }
  uint64_t own_usage = 0;
  read_u64(own_dir / "memory.usage_in_bytes", &own_usage);
  for (fs::path dir = own_dir;; dir = dir.parent_path()) {
    uint64_t max_b = 0, cur_b = 0;
    if (read_u64(dir / "memory.limit_in_bytes", &max_b) && v1_limited(max_b)) {
      read_u64(dir / "memory.usage_in_bytes", &cur_b);
      consider(m, 1, dir, "memory.limit_in_bytes", max_b, cur_b);
    }
    if (dir.string().size() <= top.string().size() || dir == dir.parent_path()) break;  // the mount's top
  }
  std::string stat;
  if (read_text(own_dir / "memory.stat", &stat)) {
    std::istringstream in(stat);
    std::string key;
    uint64_t value = 0;
    while (in >> key >> value)
      if (key == "hierarchical_memory_limit" && v1_limited(value))  // usage above is unknown: the own level's
        consider(m, 1, own_dir, "memory.stat", value, own_usage);
  }
}

void read_cgroup(const std::string& root, MemoryReading* m) {
  read_cgroup_v2(root, m);
  if (!m->cgroup_limited) read_cgroup_v1(root, m);  // the memory controller is on v1, or v2 sets no limit
}

// Sorted entries of `dir` whose names start with `prefix`.
std::vector<fs::path> entries(const fs::path& dir, std::string_view prefix) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

uint64_t MemoryReading::available_bytes() const {
  uint64_t avail = mem_available_bytes;
  if (cgroup_limited) {
    uint64_t room = cgroup_max_bytes > cgroup_current_bytes ? cgroup_max_bytes - cgroup_current_bytes : 0;
    avail = avail == 0 ? room : std::min(avail, room);
  }
  return avail;
}

std::string MemoryReading::limit_text() const {
  if (cgroup_version == 0) return "no limit (no cgroup memory controller found)";
  if (!cgroup_limited) return fmt::format("no limit (cgroup v{} {})", cgroup_version, cgroup_path);
  return fmt::format("{} (cgroup v{} {}, {} in use)", format_bytes(cgroup_max_bytes), cgroup_version,
                     (fs::path(cgroup_path) / cgroup_limit_file).string(), format_bytes(cgroup_current_bytes));
}

MemoryReading read_memory(const std::string& root) {
  MemoryReading m;
  std::string text;
  if (read_text(under(root, "/proc/meminfo"), &text)) {
    MemInfo mi = parse_meminfo(text);
    m.mem_total_bytes = mi.bytes_total;
    m.mem_available_bytes = mi.bytes_available;
  }
  read_cgroup(root, &m);
  return m;
}

std::vector<TemperatureReading> read_cpu_temperatures(const std::string& root) {
  std::vector<TemperatureReading> out;
  for (const fs::path& hw : entries(under(root, "/sys/class/hwmon"), "hwmon")) {
    std::string name = "hwmon";
    read_word(hw / "name", &name);
    for (const fs::path& input : entries(hw, "temp")) {
      std::string file = input.filename().string();
      if (file.size() < 7 || file.compare(file.size() - 6, 6, "_input") != 0) continue;
      double milli = 0;
      if (!read_double(input, &milli)) continue;
      std::string stem = file.substr(0, file.size() - 6);  // "temp1"
      TemperatureReading t;
      t.sensor = hw.filename().string() + "/" + name + "/" + stem;
      t.celsius = milli / 1000.0;
      if (double v = 0; read_double(hw / (stem + "_max"), &v) && v > 0) t.slowdown_c = v / 1000.0;
      if (double v = 0; read_double(hw / (stem + "_crit"), &v) && v > 0) t.shutdown_c = v / 1000.0;
      out.push_back(t);
    }
  }
  for (const fs::path& zone : entries(under(root, "/sys/class/thermal"), "thermal_zone")) {
    double milli = 0;
    if (!read_double(zone / "temp", &milli)) continue;
    std::string type = "zone";
    read_word(zone / "type", &type);
    TemperatureReading t;
    t.sensor = zone.filename().string() + "/" + type;
    t.celsius = milli / 1000.0;
    out.push_back(t);
  }
  return out;
}

long long live_process_start(long pid) {
  if (pid <= 0) return -1;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(in, stat, '\0');
  const auto paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z' || stat[paren + 2] == 'X')
    return -1;
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i)
    if (i == 22) return std::strtoll(field.c_str(), nullptr, 10);
  return -1;
}

}  // namespace bp
