// The suites of bp-conformance. A suite builds its list of test cases for one context (a plugin
// for plugin-level suites, a device otherwise); the list must be the same on every build for
// the same plugin and device, because a restarted child resumes by index (Note [Child
// processes] in conformance_runner.cpp).
#pragma once

#include "conformance_harness.hpp"

#include <string>
#include <vector>

namespace bpc {

// Suites run once per plugin, with the device type as device label: {"abi"}.
const std::vector<std::string>& plugin_suites();
// Suites run once per device, in report order: devices memory copies streams optional native
// kernels concurrency graphs errors (last: a fault build may lose the device there).
const std::vector<std::string>& device_suites();
bool is_plugin_suite(const std::string& suite);

// Builds the tests of `suite` into `out`; false for an unknown suite name.
bool build_suite(const std::string& suite, Context& ctx, std::vector<TestCase>& out);

void build_abi_suite(Context& ctx, std::vector<TestCase>& out);
void build_devices_suite(Context& ctx, std::vector<TestCase>& out);
void build_memory_suite(Context& ctx, std::vector<TestCase>& out);
void build_copies_suite(Context& ctx, std::vector<TestCase>& out);
void build_streams_suite(Context& ctx, std::vector<TestCase>& out);
void build_optional_suite(Context& ctx, std::vector<TestCase>& out);
void build_native_suite(Context& ctx, std::vector<TestCase>& out);
void build_kernels_suite(Context& ctx, std::vector<TestCase>& out);
void build_concurrency_suite(Context& ctx, std::vector<TestCase>& out);
void build_graphs_suite(Context& ctx, std::vector<TestCase>& out);
void build_errors_suite(Context& ctx, std::vector<TestCase>& out);

// Helpers shared by several suites.
bp_device_properties read_properties(Context& ctx);
bp_memory_stats read_stats(Context& ctx);
// Random bytes for copy tests (never all zero).
std::vector<uint8_t> random_bytes(uint64_t seed, size_t n);

}  // namespace bpc
