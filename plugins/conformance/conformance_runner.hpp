// The parent side of bp-conformance: discovers plugins and runs each test group in a child
// process (Note [Child processes] in conformance_runner.cpp), turning crashes and hangs into
// failures of the test that was running.
#pragma once

#include "conformance_harness.hpp"

#include <functional>
#include <string>
#include <vector>

namespace bpc {

// One reported test.
struct Result {
  std::string name, suite, device, dtype;
  Status status = Status::fail;
  std::string message;
  double seconds = 0;
};

// One line of the load report, as the discovery child saw it.
struct PluginInfo {
  std::string path, status, decision, reason, name, device_type, version;
  int abi_major = 0, abi_minor = 0, device_count = 0;
  bool loaded() const { return status == "loaded"; }
  // The device type, or the file's <name> in libbackplane-<name>.so when the table was unread.
  std::string label() const;
};

// A test listed by a child.
struct PlanEntry {
  std::string name, suite, device, dtype;
};

struct RunnerOptions {
  std::string exe;         // this program (re-executed for children)
  double timeout_s = 120;  // per test, and for loading a plugin
  uint64_t seed = 0;
  std::vector<std::string> filters;
  int max_restarts = 20;  // crashed or hung children restarted per group
};

// Runs the discovery child: the whole load report (paths empty) or each file in its own child
// (a plugin that crashes while loading is then a failed line, not a lost report). On failure of
// the whole discovery, returns false with *error set.
bool discover(const RunnerOptions& opt, const std::vector<std::string>& paths,
              std::vector<PluginInfo>* out, std::string* error);

// Runs one group (suite x device; device_index -1 for plugin-level suites), calling `emit` for
// each result as soon as it is known.
void run_group(const RunnerOptions& opt, const std::string& suite, const PluginInfo& plugin,
               int device_index, const std::function<void(const Result&)>& emit);

// Lists the tests of one group without running them. On failure, returns false with *error.
bool list_group(const RunnerOptions& opt, const std::string& suite, const PluginInfo& plugin,
                int device_index, std::vector<PlanEntry>* out, std::string* error);

}  // namespace bpc
