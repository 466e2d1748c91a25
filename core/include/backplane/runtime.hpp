// The runtime: plugin discovery and loading, the load report, device lookup by string, the
// default device and configuration.
//
// Note [Plugin search order]
//   Candidates are files named libbackplane-<name>.so found, in this order, in
//   1. BACKPLANE_PLUGIN_PATH: ':'-separated directories or files;
//   2. the config file's `plugins.paths`;
//   3. <directory of libbackplane.so>/backplane/plugins (found with dladdr; relocatable).
//   The first file that provides a device type wins; later ones with the same type are
//   reported as shadowed. BACKPLANE_PLUGINS=cpu,cuda (or the config's `plugins.allow`) keeps
//   only those names; `plugins.deny` drops names. Every candidate gets a line in the report.
//
// Loading happens once, thread-safely, on the first call that needs devices or explicitly via
// load_plugins(); never from static initialisers.
#pragma once

#include <backplane/plugin_abi.h>
#include <backplane/device.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace bp {

// One line of the load report.
struct PluginReport {
  enum class Status { loaded, failed, skipped };
  std::string path;
  Status status = Status::failed;
  std::string decision;  // "loaded", "failed", "skipped (BACKPLANE_PLUGINS)", "shadowed by ..."
  std::string reason;    // why it failed or was skipped; for loaded plugins with no devices,
                         // why there are none
  std::string name, device_type, version;  // from the plugin's table when it had one
  uint32_t abi_major = 0, abi_minor = 0;
  int device_count = 0;
  const bp_plugin_api* api = nullptr;  // valid while the process runs; nullptr unless loaded
};

// Loads plugins (once). Safe to call from several threads.
void load_plugins();
// The report of every candidate file, in search order.
std::vector<PluginReport> load_report();
// Loads one plugin file with the same checks as the registry, without registering its
// devices (used by bp-conformance --plugin). The library stays loaded for the process.
PluginReport inspect_plugin(const std::string& path);

struct DeviceSpec {
  std::string type;
  int index = 0;
};
// Parses "type[:index]" (Note [Device strings] in device_string.cpp). Throws DeviceError.
DeviceSpec parse_device_string(std::string_view spec);

// Resolves a device string. Throws DeviceError listing the devices that exist, or quoting the
// load report's reason when the type has no devices.
Device& device(std::string_view spec);
// Number of devices of a type ("cuda"); 0 when the backend is missing or has none.
int num_devices(std::string_view type);
// The device if it exists, otherwise cpu:0 (like d2l's try_gpu(i)).
Device& try_device(std::string_view spec);
// Every device of a type, or [cpu:0] when there is none (like try_all_gpus()).
std::vector<Device*> all_devices(std::string_view type);
// Every device of every loaded plugin.
std::vector<Device*> devices();

struct Availability {
  bool available = false;
  std::string reason;  // why not, from the load report; "" when available
  explicit operator bool() const { return available; }
};
Availability is_available(std::string_view type);

// The default device: set_default_device, else BACKPLANE_DEVICE, else the config file's
// `device`, else cpu:0.
Device& default_device();
void set_default_device(Device& d);

// Waits for all work on every device.
void synchronize();

// Configuration (Note [Config precedence] in config.cpp).
struct Config {
  std::string source;  // the file read, or "" when none
  std::string default_device;
  std::vector<std::string> plugin_paths;
  std::vector<std::string> allow, deny;
  bool allow_tf32 = false;
  std::string sync_debug;  // "", "warn" or "error"
};
const Config& config();

// TF32 for f32 matmul on devices that have it (like torch.backends.cuda.matmul.allow_tf32).
void set_allow_tf32(bool allow);
bool allow_tf32();

// Sync-debug mode: reports implicit device-to-host synchronisations (item, to_vector, print)
// of non-host devices. "off", "warn" (prints to stderr), "error" (throws SyncError).
enum class SyncDebug { off, warn, error };
void set_sync_debug(SyncDebug mode);
SyncDebug sync_debug();

}  // namespace bp
