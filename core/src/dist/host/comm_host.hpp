// Internal, exported deliberately: the communicator plugin tables behind libbackplane's loader,
// for the in-tree tools and tests that exercise communicator plugins at the C ABI level
// (bp-conformance's comm suites). Not installed. The device plugins' counterpart is
// plugin_host.hpp (the runtime layer).
#pragma once

#include <backplane/abi/comm_abi.h>
#include <backplane/dist.hpp>
#include <backplane/export.hpp>

#include <string>

namespace bp::host {

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
