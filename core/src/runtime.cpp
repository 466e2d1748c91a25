// Public runtime functions: device lookup, the default device, availability, settings.
#include "config_internal.hpp"
#include "registry.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace bp {

using detail::Registry;
using detail::settings;

namespace {

std::string device_list() {
  std::string out;
  for (Device* d : Registry::get().devices()) out += (out.empty() ? "" : ", ") + d->str();
  return out.empty() ? "none" : out;
}

std::atomic<int> g_allow_tf32{-1};  // -1: not read from config yet
std::atomic<int> g_sync_debug{-1};

}  // namespace

void load_plugins() {
  (void)Registry::get();
}

std::vector<PluginReport> load_report() {
  return Registry::get().report();
}

PluginReport inspect_plugin(const std::string& path) {
  return Registry::load_candidate(path);
}

Device& device(std::string_view spec) {
  DeviceSpec s = parse_device_string(spec);
  Registry& reg = Registry::get();
  detail::Plugin* p = reg.plugin_for_type(s.type);
  if (!p) {
    std::string msg = "unknown device type '" + s.type + "' in '" + std::string(spec) + "'";
    if (const PluginReport* r = reg.report_for_type(s.type))
      msg += ": plugin " + r->path + " " + r->decision + ": " + r->reason;
    std::string known;
    for (const auto& t : reg.known_types()) known += (known.empty() ? "" : ", ") + t;
    msg += "; known device types: " + (known.empty() ? std::string("none") : known) +
           "; devices: " + device_list();
    throw DeviceError(msg);
  }
  if (p->devices.empty())
    throw DeviceError(std::string(spec) + " is not available: " + p->no_devices_reason +
                      " (plugin " + p->path + "); devices: " + device_list());
  if (s.index >= static_cast<int>(p->devices.size()))
    throw DeviceError("device " + s.type + ":" + std::to_string(s.index) +
                      " does not exist: index out of range, " + s.type + " has " +
                      std::to_string(p->devices.size()) + " device(s); devices: " + device_list());
  return *p->devices[s.index];
}

int num_devices(std::string_view type) {
  detail::Plugin* p = Registry::get().plugin_for_type(type);
  return p ? static_cast<int>(p->devices.size()) : 0;
}

Device& try_device(std::string_view spec) {
  DeviceSpec s = parse_device_string(spec);
  detail::Plugin* p = Registry::get().plugin_for_type(s.type);
  if (p && s.index < static_cast<int>(p->devices.size())) return *p->devices[s.index];
  return device("cpu:0");
}

std::vector<Device*> all_devices(std::string_view type) {
  std::vector<Device*> out;
  if (detail::Plugin* p = Registry::get().plugin_for_type(type))
    for (const auto& d : p->devices) out.push_back(d.get());
  if (out.empty()) out.push_back(&device("cpu:0"));
  return out;
}

std::vector<Device*> devices() {
  return Registry::get().devices();
}

Availability is_available(std::string_view type) {
  Registry& reg = Registry::get();
  detail::Plugin* p = reg.plugin_for_type(type);
  if (p && !p->devices.empty()) return {true, ""};
  if (p) return {false, p->no_devices_reason};
  if (const PluginReport* r = reg.report_for_type(type))
    return {false, "plugin " + r->path + " " + r->decision + ": " + r->reason};
  return {false, "no plugin provides device type '" + std::string(type) + "'"};
}

Device& default_device() {
  Registry& reg = Registry::get();
  if (Device* d = reg.default_device_cache.load(std::memory_order_acquire)) return *d;
  const Config& c = settings();
  Device* d = nullptr;
  if (!c.default_device.empty()) {
    try {
      d = &device(c.default_device);
    } catch (const DeviceError& e) {
      throw DeviceError(
          std::string("default device from ") +
          (std::getenv("BACKPLANE_DEVICE") ? "BACKPLANE_DEVICE" : "config file " + c.source) +
          ": " + e.what());
    }
  } else {
    d = &device("cpu:0");
  }
  reg.default_device_cache.store(d, std::memory_order_release);
  return *d;
}

void set_default_device(Device& d) {
  Registry::get().default_device_cache.store(&d, std::memory_order_release);
}

void synchronize() {
  for (Device* d : devices()) d->synchronize();
}

const Config& config() {
  return settings();
}

void set_allow_tf32(bool allow) {
  g_allow_tf32.store(allow ? 1 : 0);
}
bool allow_tf32() {
  int v = g_allow_tf32.load(std::memory_order_relaxed);
  if (v < 0) {
    v = settings().allow_tf32 ? 1 : 0;
    g_allow_tf32.store(v);
  }
  return v == 1;
}

void set_sync_debug(SyncDebug mode) {
  g_sync_debug.store(static_cast<int>(mode));
}
SyncDebug sync_debug() {
  int v = g_sync_debug.load(std::memory_order_relaxed);
  if (v < 0) {
    const std::string& m = settings().sync_debug;
    v = static_cast<int>(m == "warn"    ? SyncDebug::warn
                         : m == "error" ? SyncDebug::error
                                        : SyncDebug::off);
    g_sync_debug.store(v);
  }
  return static_cast<SyncDebug>(v);
}

namespace detail {

void note_implicit_sync(const Device& dev, const char* what) {
  if (dev.properties().unified_memory) return;  // host memory: nothing to wait for
  SyncDebug mode = sync_debug();
  if (mode == SyncDebug::off) return;
  std::string msg = std::string("implicit device-to-host synchronisation on ") + dev.str() +
                    " in " + what +
                    " (BACKPLANE_SYNC_DEBUG); keep values on the device and read them once, "
                    "or synchronise explicitly";
  if (mode == SyncDebug::error) throw SyncError(msg);
  std::fprintf(stderr, "backplane: warning: %s\n", msg.c_str());
}

}  // namespace detail
}  // namespace bp
