// The runtime: plugin discovery and loading (Registry), the load report, device lookup by
// string, the default device and configuration.
//
// Note [Plugin search order]
//   Candidates are files named libbackplane-<name>.so found, in this order, in
//   1. BACKPLANE_PLUGIN_PATH: ':'-separated directories or files;
//   2. the config file's `plugins.paths`;
//   3. <directory of libbackplane.so>/backplane/plugins (found with dladdr; relocatable).
//   The first file that provides a device type wins; later ones with the same type are
//   reported as shadowed. BACKPLANE_PLUGINS=cpu,cuda (or the config's `plugins.allow`) keeps
//   only those names; `plugins.deny` drops names. Every candidate gets a line in the report.
//   (A Registry built from RegistryOptions searches its plugin_paths, then step 3.)
//
// Note [Registries]
//   A Registry is one set of loaded plugins and their devices. The process default, behind
//   the free functions below (bp::device, bp::devices, ...), is built on first use from the
//   environment and the config file, loads once, thread-safely, never from static
//   initialisers, and lives until process exit. Other registries, built from explicit options,
//   serve tests and tools that compare plugin sets in one process. A plugin library is opened
//   and initialised once per process whichever registries load it (its init runs once; plugins
//   are never unloaded), so registries share its state. A registry other than the process
//   default must outlive every tensor, buffer, stream and event of its devices.
#pragma once

#include <backplane/device.hpp>
#include <backplane/errors.hpp>
#include <backplane/export.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bp {

namespace detail {
struct RegistryState;
}

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
};

struct Availability {
  bool available = false;
  std::string reason;  // why not, from the load report; "" when available
  explicit operator bool() const { return available; }
};

struct DeviceSpec {
  std::string type;
  int index = 0;
};
// Parses "type[:index]": `type` is lower-case letters, digits and '_' starting with a letter,
// `index` a non-negative decimal without sign or leading zeros; "cuda" means "cuda:0". Throws
// DeviceError saying what was wrong.
BP_API DeviceSpec parse_device_string(std::string_view spec);

// Configuration.
//
// Note [Config precedence]
//   The file: BACKPLANE_CONFIG if set (a missing file is then an error), else ./backplane.toml,
//   else $XDG_CONFIG_HOME/backplane/config.toml (~/.config/backplane/config.toml). Keys:
//
//     device = "cpu:0"                  # default device
//     [plugins]
//     paths = ["/opt/backplane/plugins"] # searched after BACKPLANE_PLUGIN_PATH
//     allow = ["cpu", "opencl"]         # only these plugin names
//     deny  = ["opencl"]                # never these
//     [matmul]
//     allow_tf32 = false
//     [debug]
//     sync = "warn"                     # "off", "warn" or "error"
//     [fallback]
//     policy = "warn"                   # "error", "warn" or "allow" (Note [Fallback policy])
//     [fallback.ops]
//     conv2d = "error"                  # per op of the catalogue
//
//   Environment beats file: BACKPLANE_DEVICE, BACKPLANE_PLUGINS (allow list),
//   BACKPLANE_ALLOW_TF32 (0/1), BACKPLANE_SYNC_DEBUG, BACKPLANE_FALLBACK (beats fallback.policy,
//   not fallback.ops), BACKPLANE_FALLBACK_REPORT (0/1), BACKPLANE_LAUNCH_BLOCKING (0/1). An unknown
//   key, a wrong type (a number for a boolean, an empty device string) or a syntax error is an
//   IOError naming the file, the line and the key; so is a file over 1 MiB, a line over 64 KiB or a
//   key of more than 64 dotted parts (checked before the TOML parser sees the file, whose recursion
//   they would overflow).
//
//   Trust: what a program loads comes only from places the user chose. A ./backplane.toml is
//   found implicitly, in whatever folder a program starts (a cloned repository, a download), so
//   it may set every key but plugins.paths: a plugin there would run its code in the program.
//   Such a file that sets plugins.paths is an IOError unless the user opts in, with
//   BACKPLANE_CONFIG=backplane.toml (naming the file) or BACKPLANE_TRUST_LOCAL_CONFIG=1. Relative
//   plugins.paths are resolved against the working folder.
struct Config {
  std::string source;  // the file read, or "" when none
  std::string default_device;
  std::vector<std::string> plugin_paths;
  std::vector<std::string> allow, deny;
  bool allow_tf32 = false;
  std::string sync_debug;  // "", "warn" or "error"
  // Note [Fallback policy]: "" (the default, warn), "error", "warn" or "allow", and per-op
  // overrides (op name, policy) in file order.
  std::string fallback;
  std::vector<std::pair<std::string, std::string>> fallback_ops;
  bool fallback_report = false;  // BACKPLANE_FALLBACK_REPORT=1: a table at exit
  bool launch_blocking = false;  // BACKPLANE_LAUNCH_BLOCKING=1

  // Reads the config file and the environment now (Note [Config precedence]). Throws IOError
  // for a bad file or value.
  BP_API static Config load();
};
// The configuration of the process, read once on first use (Config::load()).
BP_API const Config& config();

// What a Registry loads (Note [Plugin search order]).
struct RegistryOptions {
  std::vector<std::string> plugin_paths;  // directories or files, searched in this order
  bool search_library_dir = true;         // then <dir of libbackplane.so>/backplane/plugins
  std::vector<std::string> allow;         // plugin names to keep (empty: all)
  std::vector<std::string> deny;          // plugin names to drop
  std::string default_device;             // "" : cpu:0
  // Where default_device came from ("BACKPLANE_DEVICE", "config file <path>"), for messages.
  std::string default_device_origin;
  // > 0: load each plugin first in a child process and leave out, with the reason, one whose
  // init crashes or does not return within this many seconds (Note [Plugin probes] in
  // registry.cpp; BACKPLANE_PROBE_PLUGINS=<seconds>, 0.1 to 3600; bp-smi uses 10). For
  // single-threaded tools: the probe forks without exec.
  double probe_seconds = 0;

  // The options of the process default: BACKPLANE_PLUGIN_PATH then the config file's paths,
  // the allow and deny lists and the default device of Config::load().
  BP_API static RegistryOptions from_environment();
};

// A set of loaded plugins and their devices (Note [Registries]). Thread-safe.
class BP_API Registry {
 public:
  // Lists the candidate plugins the options name; opens none of them (Note [Loading on demand] in
  // registry.cpp: a plugin is opened when a device of its type is first asked for, and every one
  // by report(), devices() and devices(kind)). A plugin that fails never stops the others; its
  // line in report() says why.
  explicit Registry(RegistryOptions options);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The process default (RegistryOptions::from_environment()), loaded on first use.
  static Registry& process_default();

  // The report of every candidate file, in search order (loads every plugin first).
  const std::vector<PluginReport>& report() const;
  // Every device of every plugin, plugins in search order (loads every plugin first).
  std::vector<Device*> devices() const;
  // The devices of the plugins loaded so far (Note [Loading on demand] in registry.cpp); loads
  // nothing.
  std::vector<Device*> loaded_devices() const;
  // Every device of a kind (DeviceProperties::kind), in the order of devices().
  std::vector<Device*> devices(DeviceKind kind) const;
  // Resolves a device string. Throws DeviceError listing the devices that exist, or quoting
  // the load report's reason when the type has no devices.
  Device& device(std::string_view spec);
  // Number of devices of a type ("cuda", or the type of a device string "cuda:1"); 0 when the
  // backend is missing or has none. DeviceError for a malformed device string.
  int num_devices(std::string_view type) const;
  // The device if it exists, otherwise cpu:0 (like d2l's try_gpu(i)).
  Device& try_device(std::string_view spec);
  // Every device of a type, or [cpu:0] when there is none (like try_all_gpus()).
  std::vector<Device*> all_devices(std::string_view type);
  // Whether a type ("cuda") has a device, or a device string ("cuda:1") names one, with the
  // reason when not. DeviceError for a malformed device string.
  Availability is_available(std::string_view type) const;
  // set_default_device, else the options' default_device, else cpu:0.
  Device& default_device();
  void set_default_device(Device& d);
  // Waits for all work on every device.
  void synchronize();

 private:
  friend struct detail::Access;
  std::unique_ptr<detail::RegistryState> s_;
};

// The plugin ABI version this libbackplane implements (plugin_abi.h): plugins of the same
// major and any minor load.
struct PluginAbiVersion {
  uint32_t major = 0, minor = 0;
};
BP_API PluginAbiVersion plugin_abi_version();

// ---- The process default registry (Note [Registries]) ----

// Loads every plugin (once); without it each loads when a device of its type is first asked for
// (Note [Loading on demand]). Safe to call from several threads.
BP_API void load_plugins();
// The report of every candidate file, in search order (loads every plugin first).
BP_API std::vector<PluginReport> load_report();
// Loads one plugin file with the same checks as the registry, without registering its
// devices (used by bp-conformance --plugin). The library stays loaded for the process.
BP_API PluginReport inspect_plugin(const std::string& path);

BP_API Device& device(std::string_view spec);
BP_API int num_devices(std::string_view type);
BP_API Device& try_device(std::string_view spec);
BP_API std::vector<Device*> all_devices(std::string_view type);
BP_API std::vector<Device*> devices();
BP_API Availability is_available(std::string_view type);
// The default device: set_default_device, else BACKPLANE_DEVICE, else the config file's
// `device`, else cpu:0.
BP_API Device& default_device();
BP_API void set_default_device(Device& d);
// Waits for all work on every device.
BP_API void synchronize();

// Note [Device lost]
//   A device whose backend reports it lost (Note [Asynchronous errors] in plugin_abi.h: a
//   sticky CUDA error such as an illegal address) runs nothing more in this process. The call
//   that finds it throws DeviceLost naming the op that failed; from then on every call on that
//   device (launches, copies, allocations, synchronisations, new streams and events) throws
//   DeviceLost at once with the same description, without calling the backend. Other devices
//   go on. on_device_lost registers a callback run once per lost device, on the thread that
//   found the loss, before that DeviceLost is thrown: a server can stop taking requests, report
//   and exit cleanly rather than answer every later request with an error. Callbacks run in
//   registration order and must not throw (what they throw is dropped); they may not use the
//   lost device. The returned id removes the callback (remove_device_lost_callback).
BP_API uint64_t on_device_lost(std::function<void(const DeviceLost&)> callback);
BP_API void remove_device_lost_callback(uint64_t id);

// TF32 for f32 matmul on devices that have it (like torch.backends.cuda.matmul.allow_tf32).
BP_API void set_allow_tf32(bool allow);
BP_API bool allow_tf32();

// Sync-debug mode: reports implicit device-to-host reads (item, to_vector, printing, copies
// to a host device) of non-host devices that wait for queued work: "off", "warn" (prints to
// stderr), "error" (throws SyncError). Note [Sync-debug].
enum class SyncDebug { off, warn, error };
BP_API void set_sync_debug(SyncDebug mode);
BP_API SyncDebug sync_debug();

// Note [Fallback policy]
//   An op that a device's plugin lacks (its find_kernel answered UNSUPPORTED, asked once per op
//   and dtype and cached) is not silently slow: libbackplane either runs the op's decomposition
//   into ops that plugin has (composites written once in core: linear as matmul, add and relu;
//   matmul as mul and sum; conv2d and its backward ops by im2col and matmul; sumsq and norm;
//   softmax and log_softmax), else runs the op on a device of another plugin that has it,
//   copying its operands there and back (Note [Fallback by copy] in fallback.cpp), else throws
//   UnsupportedError naming the op, dtype and device. A plugin that claims an op and then fails
//   it gives its own error, never a fallback. The policy decides whether the first two may
//   happen:
//     error  every fallback is an UnsupportedError saying what would have been done;
//     warn   (the default) allowed, with one warning on stderr per op, dtype, device and action;
//     allow  allowed silently.
//   BACKPLANE_FALLBACK or the config file's fallback.policy sets it, set_fallback_policy beats
//   both, and fallback.ops.<op> in the config file sets it for one op (beating all of them).
//   Inside a graph capture a fallback is always an error (CaptureError), whatever the policy.
//   Every fallback is counted per device, op, dtype and action (count, bytes copied, time):
//   fallback_stats(), the profiler's table, bp-smi, and a table on stderr at exit with
//   BACKPLANE_FALLBACK_REPORT=1.
enum class FallbackPolicy { error, warn, allow };
BP_API void set_fallback_policy(FallbackPolicy policy);
// The policy that applies to `op` now.
BP_API FallbackPolicy fallback_policy(Op op);
struct FallbackStats {
  std::string device, op, dtype;
  // "decomposition into mul and sum", "a run on cpu:0, its operands copied there and back"
  std::string action;
  uint64_t count = 0, bytes_copied = 0;
  double seconds = 0;  // host time from the policy check to the end of the fallback
};
// The counters of every fallback of this process so far, sorted by device, op, dtype, action.
BP_API std::vector<FallbackStats> fallback_stats();
BP_API void reset_fallback_stats();
// fallback_stats() as a text table (what BACKPLANE_FALLBACK_REPORT=1 prints at exit).
BP_API std::string fallback_table();

// Names the call the user made (e.g. "tolist()") in sync-debug reports of the host reads this
// thread makes while the object lives, in place of the library function that reads; language
// bindings wrap their reads in one. When they nest, the outermost name is reported. `what`
// must outlive the object.
class BP_API SyncDebugCall {
 public:
  explicit SyncDebugCall(const char* what) noexcept;
  ~SyncDebugCall();
  SyncDebugCall(const SyncDebugCall&) = delete;
  SyncDebugCall& operator=(const SyncDebugCall&) = delete;

 private:
  const char* prev_;
};

}  // namespace bp
