// Internal, exported deliberately: the plugin tables behind libbackplane's loader, for the
// in-tree tools and tests that exercise plugins at the C ABI level (bp-conformance and its
// library, the backends' ABI tests). Not installed; not part of the public C++ API, which
// never exposes plugin ABI types.
#pragma once

#include <backplane/abi/comm_abi.h>
#include <backplane/abi/plugin_abi.h>
#include <backplane/dist.hpp>
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

// A communicator plugin and its table: `path_or_name` containing '/' is a file loaded with every
// check (bp::dist::inspect_comm_plugin); otherwise the communicator of that name in the process's
// load report (bp::dist::comm_load_report). api is nullptr unless it loaded; report.reason says
// why (report.path is empty when no communicator has that name).
struct LoadedCommPlugin {
  dist::CommPluginReport report;
  const bp_comm_api* api = nullptr;  // valid while the process runs
};
BP_API LoadedCommPlugin load_comm_plugin(const std::string& path_or_name);

}  // namespace bp::host
