// Internal: registries and the process-wide table of opened plugin libraries (Note
// [Registries] in runtime.hpp).
#pragma once

#include "runtime/device_state.hpp"

#include <backplane/runtime.hpp>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace bp::detail {

// On the process's main thread: makes sure finish_queued_work (device_state.hpp) runs first
// when the process exits (Note [Exit] in registry.cpp); elsewhere nothing. Cheap once armed.
void arm_exit_guard() noexcept;
// finish_queued_work as an exit handler (std::atexit), registered again after each kernel
// lookup (Note [Exit]).
void finish_queued_work_at_exit();

// One candidate file of the search order (Note [Loading on demand] in registry.cpp). Made by the
// Registry's constructor and never moved; `done` and `plugin` are the only fields that change.
struct Candidate {
  std::string path;
  std::string name;  // from the file name; "" for a file named otherwise
  std::string type;  // the device type its file name or manifest announces; "" when unknown
  std::string manifest_error;            // what is wrong with its manifest, for its report line
  size_t line = 0;                       // its line in RegistryState::report
  std::atomic<bool> done{false};         // tried: loaded, failed or skipped
  std::atomic<Plugin*> plugin{nullptr};  // set once, when it loaded and was registered
};

struct RegistryState {
  explicit RegistryState(RegistryOptions o) : options(std::move(o)) {}
  RegistryOptions options;
  // Serialises loading. Guards the lines of `report` (their number is fixed after construction)
  // and `owned`; readers of `candidates` need no lock (Note [Loading on demand]).
  std::mutex load_mu;
  std::vector<PluginReport> report;
  std::deque<Candidate> candidates;  // in search order; never grows after construction
  std::vector<std::unique_ptr<Plugin>> owned;
  std::atomic<bool> all_loaded{false};
  std::atomic<Device*> default_device{nullptr};

  // Loads the candidates that may serve `type` (Note [Loading on demand]), once.
  void ensure_type(std::string_view type);
  // Loads every candidate, once (tools that list everything; error messages that list devices).
  void load_all();
  // Devices of the plugins loaded so far, plugins in search order.
  std::vector<Device*> devices() const;
  // A loaded plugin serving `type` (one with devices first), else nullptr. Loads nothing.
  Plugin* plugin_for_type(std::string_view type) const;
  // The report line of the plugin that serves (or failed to serve) a device type.
  const PluginReport* report_for_type(std::string_view type);
  std::vector<std::string> known_types() const;
  std::string device_list() const;  // "cpu:0, cuda:0" or "none"

 private:
  void load_candidate(Candidate& c);  // with load_mu held
  // Adds a loaded plugin and its devices; marks the report failed if properties fail.
  void register_plugin(Candidate& c, PluginReport& r, const bp_plugin_api* api);
};

// The device type a manifest beside `path` (`<path>.manifest`, one line `device_type = "npu"`)
// announces; "" without one. `why` says what is wrong with a malformed one.
std::string manifest_device_type(const std::string& path, std::string& why);

// Opens one candidate file with every check of Note [Plugin search order] and initialises it,
// once per process per library: a library already opened (by any registry) gives its first
// report again, with `path` as given, and init is never called twice. *out_api is the table
// of a loaded plugin, else nullptr.
PluginReport load_library(const std::string& path, const bp_plugin_api** out_api);

// The loader's checks of a plugin's table, before anything in it is called (Note [Plugin table
// checks] in registry.cpp): returns "" when the table may be used, else the reason for the load
// report. Fills r's ABI version, name, device type and version as far as the table's
// struct_size covers them. Reads nothing past api->struct_size, calls no slot; the strings it
// reads must be NUL-terminated or NULL. Used by load_library and by the fuzz target
// tests/fuzz/fuzz_plugin_table.cpp on tables in memory.
// Exported deliberately for that fuzz target (this header is not installed).
BP_API std::string check_plugin_table(const bp_plugin_api* api, PluginReport& r);

// The registry options of a configuration (BACKPLANE_PLUGIN_PATH first).
RegistryOptions options_from(const Config& c);

// Loader pieces shared with the communicator registry (comm_registry.cpp).
std::string library_dir();  // directory of libbackplane.so, "" when unknown
// "libbackplane-cuda.so" -> "cuda", "libbackplane-comm-nccl.so" -> "comm-nccl"; "" otherwise.
std::string plugin_name_from_file(const std::string& path);
bool is_comm_plugin_name(const std::string& name);  // "comm-*"
bool is_elf_file(const std::string& path, std::string& why);
// Checks that `path` is an ELF file, dlopens it (RTLD_NOW | RTLD_LOCAL) and finds
// `entry_symbol`: the handle, or nullptr with `reason` set (`hint` says what the file should
// have been when the symbol is missing).
void* open_library(const std::string& path, const char* entry_symbol, const char* hint,
                   void** out_entry, std::string& reason);
// dlerror() text -> "dependency libfoo.so.1 not found (...)" or "dlopen failed: ...".
std::string explain_dlerror(const std::string& path, const std::string& err);
// The entries of the search order (Note [Plugin search order]): BACKPLANE_PLUGIN_PATH, the
// config file's paths, the library's own plugin folder.
std::vector<std::string> plugin_search_entries();
// Loads `path` in a forked child (Note [Plugin probes] in registry.cpp): "" when the child
// exited, else "init crashed with SIGSEGV ..." or "init did not return within N s ...".
std::string probe_in_child(const std::string& path, double seconds);

// Starts the BACKPLANE_PUBLISH_STATS=1 thread (Note [Published allocator statistics] in
// stats_publisher.cpp) for the process default registry; nothing when the variable is not set.
void maybe_publish_stats(Registry& reg);

}  // namespace bp::detail
