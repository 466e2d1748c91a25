// Device facts of the CPU backend (cpu_device.hpp).
#include "cpu_device.hpp"

#include <backplane/sdk/plugin_sdk.hpp>

#include <sys/sysinfo.h>
#include <tbb/info.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>

namespace bp::cpu {
namespace {

struct CpuIdentity {
  std::string model = "CPU";
  std::string vendor = "unknown";
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  const size_t e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// The first "model name" and "vendor_id" lines of /proc/cpuinfo.
CpuIdentity read_identity() {
  CpuIdentity id;
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  bool have_model = false, have_vendor = false;
  while ((!have_model || !have_vendor) && std::getline(f, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (!have_model && key == "model name" && !value.empty()) {
      id.model = value;
      have_model = true;
    } else if (!have_vendor && key == "vendor_id" && !value.empty()) {
      id.vendor = value;
      have_vendor = true;
    }
  }
  return id;
}

const CpuIdentity& identity() {
  static const CpuIdentity id = read_identity();
  return id;
}

// A cgroup v2 file holding a byte count, or `fallback` when absent or "max".
uint64_t read_cgroup_bytes(const char* path, uint64_t fallback) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return fallback;
  try {
    return std::stoull(s);
  } catch (...) {
    return fallback;
  }
}

constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();

}  // namespace

uint64_t total_memory() {
  struct sysinfo si {};
  uint64_t total = 0;
  if (sysinfo(&si) == 0) total = static_cast<uint64_t>(si.totalram) * si.mem_unit;
  return std::min(total, read_cgroup_bytes("/sys/fs/cgroup/memory.max", kNoLimit));
}

uint64_t available_memory() {
  uint64_t avail = 0;
  bool found = false;
  std::ifstream f("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (f >> key >> kb) {
    std::getline(f, unit);
    if (key == "MemAvailable:") {
      avail = kb * 1024;
      found = true;
      break;
    }
  }
  if (!found) {
    struct sysinfo si {};
    if (sysinfo(&si) == 0) avail = static_cast<uint64_t>(si.freeram) * si.mem_unit;
  }
  const uint64_t limit = read_cgroup_bytes("/sys/fs/cgroup/memory.max", kNoLimit);
  if (limit != kNoLimit) {
    const uint64_t used = read_cgroup_bytes("/sys/fs/cgroup/memory.current", 0);
    avail = std::min(avail, limit > used ? limit - used : 0);
  }
  return avail;
}

void fill_device_properties(bp_device_properties& props) {
  const int threads = tbb::info::default_concurrency();
  const CpuIdentity& id = identity();
  bp::sdk::copy_string(props.name, bp::sdk::format("%s (%d threads)", id.model.c_str(), threads));
  bp::sdk::copy_string(props.vendor, id.vendor);
  bp::sdk::copy_string(props.uuid, "");
  bp::sdk::copy_string(props.pci_bus_id, "");
  props.total_memory = total_memory();
  props.free_memory = std::min(available_memory(), props.total_memory);
  props.compute_major = 0;
  props.compute_minor = 0;
  props.cores = threads;
  props.supports_f64 = 1;
  props.unified_memory = 1;
  props.kind = BP_DEVICE_KIND_CPU;
}

}  // namespace bp::cpu
