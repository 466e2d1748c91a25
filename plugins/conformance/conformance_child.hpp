// The child side of bp-conformance: the process the tool re-executes itself as (hidden
// arguments --child-discover / --child-group), which loads a plugin, runs one group of tests
// and reports through the line protocol (conformance_protocol.hpp) on a dedicated descriptor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bpc {

struct ChildOptions {
  bool discover = false;             // --child-discover: report plugins, run nothing
  std::vector<std::string> plugins;  // --plugin: files to inspect (discover) or the one to test
  std::string suite;                 // --child-group SUITE
  int device_index = -1;             // --device-index; -1 for plugin-level suites
  int fd = 3;                        // --child-fd: where records go
  uint64_t seed = 0;                 // --seed
  size_t start = 0;                  // --start: index of the first test to run
  std::vector<std::string> filters;  // --filter globs (any may match)
  bool list_only = false;            // --list-only: PLAN records, then DONE
};

// Runs the child; the return value is the process exit status.
int run_child(const ChildOptions& opt);

// True when `name` matches any of the globs (fnmatch), or `filters` is empty. A pattern
// without wildcards also matches as a plain substring, so "add_broadcast" works as expected.
bool matches_filters(const std::vector<std::string>& filters, const std::string& name);

}  // namespace bpc
