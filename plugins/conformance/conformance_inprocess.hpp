// bp_conformance_lib's entry for test programs: the conformance kit's suites run in the calling
// process, on a plugin loaded through the real loader (bp::host::load_plugin, every check of
// the registry). The backends' test programs (backends/*/tests) run the shared cases this way
// under their own configurations (thread thresholds, ISA levels, environments) and keep only
// their backend-specific cases in their own files; bp-conformance itself runs the same suites
// in child processes (conformance_runner.hpp), which survive a crash or a hang.
//
// Not thread-safe: one suite runs at a time on the calling thread (the concurrency suite
// starts its own threads).
#pragma once

#include "conformance_harness.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace bpc {

// One test's outcome.
struct CaseResult {
  Status status = Status::fail;
  std::string message;  // the failure, the skip or unsupported reason, or the PASS note
};

// Runs one test case here: its declared support (BP_SUPPORT_NO: unsupported, EXPECTED_FAIL:
// xfail or xpass), the body, Failure and Skipped.
CaseResult run_case(Context& ctx, const TestCase& tc);

// A suite's run: `error` is set (and `results` empty) when the plugin did not load, the device
// does not exist, or the suite could not be built.
struct SuiteRun {
  std::string error;
  std::string device_label;  // "cpu:0"; the device type for plugin-level suites
  std::vector<std::pair<std::string, CaseResult>> results;  // test name, outcome, in order
  int count(Status s) const;
  // One line per FAIL and XPASS ("FAIL kernels.add_contiguous[cpu:0,f32]: ..."); "" if none.
  std::string failures() const;
};

// Loads `plugin_path` through the loader (once per process), builds `suite` ("kernels",
// "memory", ...: conformance_suites.hpp) for `device` (ignored for plugin-level suites) and runs
// the tests whose names match `filters` (matches_filters: globs or substrings; empty: all).
// `seed` seeds every test's data (the caller prints it).
SuiteRun run_suite_in_process(const std::string& plugin_path, const std::string& suite,
                              int32_t device, uint64_t seed,
                              const std::vector<std::string>& filters = {});

}  // namespace bpc
