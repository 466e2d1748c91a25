// Public runtime functions over the process default registry (Note [Registries] in
// runtime.hpp), and the process-wide settings.
#include "runtime/config_internal.hpp"
#include "runtime/host/plugin_host.hpp"
#include "runtime/observer.hpp"
#include "runtime/registry.hpp"

#include <atomic>
#include <cstdio>

namespace bp {

namespace {
Registry& reg() {
  return Registry::process_default();
}
std::atomic<int> g_allow_tf32{-1};  // -1: not read from config yet
std::atomic<int> g_sync_debug{-1};
}  // namespace

PluginAbiVersion plugin_abi_version() {
  return {BP_ABI_MAJOR, BP_ABI_MINOR};
}

void load_plugins() {
  (void)reg().report();
}
std::vector<PluginReport> load_report() {
  return reg().report();
}
PluginReport inspect_plugin(const std::string& path) {
  const bp_plugin_api* api = nullptr;
  return detail::load_library(path, &api);
}
Device& device(std::string_view spec) {
  return reg().device(spec);
}
int num_devices(std::string_view type) {
  return reg().num_devices(type);
}
Device& try_device(std::string_view spec) {
  return reg().try_device(spec);
}
std::vector<Device*> all_devices(std::string_view type) {
  return reg().all_devices(type);
}
std::vector<Device*> devices() {
  return reg().devices();
}
Availability is_available(std::string_view type) {
  return reg().is_available(type);
}
Device& default_device() {
  return reg().default_device();
}
void set_default_device(Device& d) {
  reg().set_default_device(d);
}
void synchronize() {
  reg().synchronize();
}

void set_allow_tf32(bool allow) {
  g_allow_tf32.store(allow ? 1 : 0);
}
bool allow_tf32() {
  int v = g_allow_tf32.load(std::memory_order_relaxed);
  if (v < 0) {
    v = detail::settings().allow_tf32 ? 1 : 0;
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
    const std::string& m = detail::settings().sync_debug;
    v = static_cast<int>(m == "warn"    ? SyncDebug::warn
                         : m == "error" ? SyncDebug::error
                                        : SyncDebug::off);
    g_sync_debug.store(v);
  }
  return static_cast<SyncDebug>(v);
}

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::cpu:
      return "cpu";
    case DeviceKind::gpu:
      return "gpu";
    case DeviceKind::accelerator:
      return "accelerator";
  }
  return "?";
}

namespace {
thread_local const char* t_sync_call = nullptr;
}  // namespace

SyncDebugCall::SyncDebugCall(const char* what) noexcept : prev_(t_sync_call) {
  if (!prev_) t_sync_call = what;
}
SyncDebugCall::~SyncDebugCall() {
  if (!prev_) t_sync_call = nullptr;
}

namespace detail {

// Note [Sync-debug]
//   A host read of a device's values waits for the work queued on its default stream. Such a
//   read is reported only when that wait is real: DeviceState::queued is set by every launch,
//   copy and memset, and cleared by a synchronisation of the default stream (an explicit
//   bp::synchronize(), Device::synchronize(), or the read's own wait). So after an explicit
//   synchronize, reads of the values it covered are quiet, until new work is queued. Work
//   queued by a native library on the stream (a collective) does not mark it. The report
//   names the user's call (SyncDebugCall) when a binding gave one.
void note_implicit_sync(const Device& dev, const char* what) {
  const char* call = t_sync_call ? t_sync_call : what;
  if (observing()) [[unlikely]]
    observer_hooks().implicit_sync(dev, call);
  if (dev.properties().unified_memory) return;  // host memory: nothing to wait for
  SyncDebug mode = sync_debug();
  if (mode == SyncDebug::off) return;
  if (!state(dev).queued.load(std::memory_order_relaxed)) return;
  std::string msg = std::string("implicit device-to-host synchronisation on ") + dev.str() +
                    " in " + call +
                    " (BACKPLANE_SYNC_DEBUG); keep values on the device and read them once, "
                    "or synchronise explicitly";
  if (mode == SyncDebug::error) throw SyncError(msg);
  std::fprintf(stderr, "backplane: warning: %s\n", msg.c_str());
}

}  // namespace detail
}  // namespace bp

namespace bp::host {

LoadedPlugin load_plugin(const std::string& path) {
  LoadedPlugin p;
  p.report = detail::load_library(path, &p.api);
  return p;
}

}  // namespace bp::host
