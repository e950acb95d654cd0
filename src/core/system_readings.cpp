// Memory, cgroup v2 and temperature readings under a (possibly fake) root. See system_readings.h.
#include "core/system_readings.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

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

// The process's cgroup v2 path ("/user.slice/x") from /proc/self/cgroup's "0::" line.
std::string own_cgroup(const std::string& root) {
  std::string text;
  if (!read_text(under(root, "/proc/self/cgroup"), &text)) return {};
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return {};
}

void read_cgroup(const std::string& root, MemoryReading* m) {
  std::string own = own_cgroup(root);
  if (own.empty()) return;
  const fs::path base = under(root, "/sys/fs/cgroup");
  // memory.max of every level from the process's cgroup up to (not including) the root: the
  // smallest room (max - current) is the one the kernel enforces first.
  for (fs::path rel = fs::path(own).relative_path();; rel = rel.parent_path()) {
    const fs::path dir = base / rel;
    std::string max_text;
    uint64_t max_b = 0, cur_b = 0;
    if (read_word(dir / "memory.max", &max_text) && max_text != "max" && read_u64(dir / "memory.max", &max_b)) {
      read_u64(dir / "memory.current", &cur_b);
      uint64_t room = max_b > cur_b ? max_b - cur_b : 0;
      uint64_t best_room =
          m->cgroup_max_bytes > m->cgroup_current_bytes ? m->cgroup_max_bytes - m->cgroup_current_bytes : 0;
      if (!m->cgroup_limited || room < best_room) {
        m->cgroup_limited = true;
        m->cgroup_max_bytes = max_b;
        m->cgroup_current_bytes = cur_b;
        m->cgroup_path = dir.string();
      }
    }
    if (rel.empty() || rel == rel.parent_path()) break;
  }
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

}  // namespace bp
