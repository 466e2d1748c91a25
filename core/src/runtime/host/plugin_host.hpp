// Internal, exported deliberately: the plugin tables behind libbackplane's loader, for the
// in-tree tools and tests that exercise plugins at the C ABI level (bp-conformance and its
// library, the backends' ABI tests). Not installed; not part of the public C++ API, which
// never exposes plugin ABI types. Communicator plugins: comm_host.hpp (the dist layer).
#pragma once

#include <backplane/abi/plugin_abi.h>
#include <backplane/export.hpp>
#include <backplane/runtime.hpp>

#include <string>

namespace bp::host {

// A plugin file loaded with every check of the registry (bp::inspect_plugin) and its table.
struct LoadedPlugin {
  PluginReport report;
  const bp_plugin_api* api = nullptr;  // valid while the process runs; nullptr unless loaded
};

// Opens and initialises `path` through the loader (once per process, Note [Plugin lifetime]).
BP_API LoadedPlugin load_plugin(const std::string& path);

}  // namespace bp::host
