// The conformance kit's shared cases as one GoogleTest assertion, for the backends' test
// programs (backends/*/tests): they run the kit's suites in process through bp_conformance_lib
// under their own configurations (environment variables, thresholds, ISA levels) and keep only
// backend-specific cases in their own files. Header-only; needs gtest.
#pragma once

#include "conformance_inprocess.hpp"

#include <backplane_test/seed.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace bpc {

// Runs `suite` of the kit on `device` of the plugin at `plugin_path` (loaded through the real
// loader), restricted to `filters`, with the run's seed (bp_test::test_seed, printed; replay
// with BP_TEST_SEED). Fails the current test for every FAIL and XPASS, naming each, and when
// fewer than `min_pass` tests passed (a filter that matches nothing proves nothing). Prints the
// counts.
inline void expect_shared_cases_pass(const std::string& plugin_path, const std::string& suite,
                                     int32_t device, const std::vector<std::string>& filters,
                                     int min_pass = 1) {
  const uint64_t seed = bp_test::test_seed("conformance");
  SuiteRun run = run_suite_in_process(plugin_path, suite, device, seed, filters);
  ASSERT_EQ(run.error, "") << suite << " on " << plugin_path;
  std::printf(
      "conformance %s on %s (seed %llu): %d PASS, %d FAIL, %d XPASS, %d XFAIL, "
      "%d UNSUPPORTED, %d SKIP\n",
      suite.c_str(), run.device_label.c_str(), static_cast<unsigned long long>(seed),
      run.count(Status::pass), run.count(Status::fail), run.count(Status::xpass),
      run.count(Status::xfail), run.count(Status::unsupported), run.count(Status::skip));
  EXPECT_EQ(run.count(Status::fail) + run.count(Status::xpass), 0)
      << run.failures() << "(seed " << seed << ": rerun with BP_TEST_SEED=" << seed << ")";
  EXPECT_GE(run.count(Status::pass), min_pass)
      << "the filters matched fewer passing tests than expected";
}

}  // namespace bpc
