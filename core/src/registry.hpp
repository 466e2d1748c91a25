// Internal: registries and the process-wide table of opened plugin libraries (Note
// [Registries] in runtime.hpp).
#pragma once

#include "device_state.hpp"

#include <backplane/runtime.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace bp::detail {

struct RegistryState {
  explicit RegistryState(RegistryOptions o) : options(std::move(o)) {}
  RegistryOptions options;
  std::vector<PluginReport> report;
  std::vector<std::unique_ptr<Plugin>> plugins;
  std::atomic<Device*> default_device{nullptr};

  std::vector<Device*> devices() const;
  Plugin* plugin_for_type(std::string_view type) const;
  // The report line of the plugin that serves (or failed to serve) a device type.
  const PluginReport* report_for_type(std::string_view type) const;
  std::vector<std::string> known_types() const;
  std::string device_list() const;  // "cpu:0, cuda:0" or "none"
  // Adds a loaded plugin and its devices; marks the report failed if properties fail.
  void register_plugin(PluginReport& r, const bp_plugin_api* api);
};

// Opens one candidate file with every check of Note [Plugin search order] and initialises it,
// once per process per library: a library already opened (by any registry) gives its first
// report again, with `path` as given, and init is never called twice. *out_api is the table
// of a loaded plugin, else nullptr.
PluginReport load_library(const std::string& path, const bp_plugin_api** out_api);

// The registry options of a configuration (BACKPLANE_PLUGIN_PATH first).
RegistryOptions options_from(const Config& c);

}  // namespace bp::detail
