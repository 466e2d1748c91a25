// Internal: discovery and loading of communicator plugins (libbackplane-comm-<name>.so), with
// the device loader's checks and report lines (registry.cpp), kept in a registry of its own.
#pragma once

#include <backplane/abi/comm_abi.h>
#include <backplane/dist.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace bp::detail {

// A loaded communicator plugin. Lives until process exit (Note [Plugin lifetime]).
struct CommPlugin {
  const bp_comm_api* api = nullptr;
  dist::CommPluginReport report;
  bool serves(std::string_view device_type) const;
};

class CommRegistry {
 public:
  static CommRegistry& get();  // loads on first use; thread-safe
  const std::vector<dist::CommPluginReport>& report() const { return report_; }
  // Loaded plugins in search order (available or not).
  const std::vector<CommPlugin>& plugins() const { return plugins_; }
  const CommPlugin* find(std::string_view name) const;  // by plugin name ("gloo")

  // Loads one candidate with every check; does not register it.
  static dist::CommPluginReport load_candidate(const std::string& path,
                                               const bp_comm_api** out_api);

 private:
  CommRegistry();
  std::vector<dist::CommPluginReport> report_;
  std::vector<CommPlugin> plugins_;
};

// Converts a communicator's error object (freed here) into the matching bp::dist error:
// TIMEOUT -> TimeoutError, REMOTE / ABORTED -> PeerError, UNAVAILABLE -> BackendUnavailable,
// INVALID_ARGUMENT -> DistError, OUT_OF_MEMORY -> OutOfMemory, else DistError. `context`
// names what the host was doing.
[[noreturn]] void throw_comm_error(const bp_comm_api* api, bp_error* err,
                                   const std::string& context);
// The error's text ("message [native_name]") without throwing; frees it.
std::string take_comm_error(const bp_comm_api* api, bp_error* err, int32_t* out_code = nullptr);

}  // namespace bp::detail
