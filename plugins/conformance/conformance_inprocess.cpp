#include "conformance_inprocess.hpp"

#include "conformance_child.hpp"
#include "conformance_suites.hpp"

#include <backplane/runtime.hpp>
#include <plugin_host.hpp>

#include <exception>

namespace bpc {

CaseResult run_case(Context& ctx, const TestCase& tc) {
  if (tc.support == BP_SUPPORT_NO) return {Status::unsupported, tc.reason};
  bool passed = false;
  CaseResult o{Status::fail, ""};
  ctx.take_note();
  try {
    tc.body(ctx);
    passed = true;
    o.message = ctx.take_note();
  } catch (const Skipped& e) {
    ctx.take_note();
    return {Status::skip, e.what()};
  } catch (const Failure& e) {
    o.message = e.what();
  } catch (const std::exception& e) {
    o.message = std::string("unexpected exception in the test: ") + e.what();
  }
  if (tc.support == BP_SUPPORT_EXPECTED_FAIL) {
    if (passed) return {Status::xpass, "declared expected to fail (" + tc.reason + ") but passed"};
    return {Status::xfail, "expected failure (" + tc.reason + "): " + o.message};
  }
  return passed ? CaseResult{Status::pass, o.message} : o;
}

int SuiteRun::count(Status s) const {
  int n = 0;
  for (const auto& r : results) n += r.second.status == s;
  return n;
}

std::string SuiteRun::failures() const {
  std::string out;
  for (const auto& [name, r] : results)
    if (r.status == Status::fail || r.status == Status::xpass)
      out += std::string(status_name(r.status)) + " " + name + ": " + r.message + "\n";
  return out;
}

SuiteRun run_suite_in_process(const std::string& plugin_path, const std::string& suite,
                              int32_t device, uint64_t seed,
                              const std::vector<std::string>& filters) {
  SuiteRun run;
  bp::host::LoadedPlugin loaded = bp::host::load_plugin(plugin_path);
  const bp::PluginReport& r = loaded.report;
  if (r.status != bp::PluginReport::Status::loaded || !loaded.api) {
    run.error = plugin_path + ": the plugin did not load: " + r.reason;
    return run;
  }
  const bool plugin_level = is_plugin_suite(suite);
  run.device_label = r.device_type;
  if (!plugin_level) {
    if (device < 0 || device >= r.device_count) {
      run.error =
          format("%s:%d does not exist: the plugin has %d device(s)%s", r.device_type.c_str(),
                 device, r.device_count, r.reason.empty() ? "" : (" (" + r.reason + ")").c_str());
      return run;
    }
    run.device_label += ':' + std::to_string(device);
  }
  Context ctx(loaded.api, plugin_path, plugin_level ? -1 : device, run.device_label, seed);
  std::vector<TestCase> all;
  try {
    if (!build_suite(suite, ctx, all)) {
      run.error = "unknown suite '" + suite + "'";
      return run;
    }
  } catch (const std::exception& e) {
    run.error = std::string("building the test list failed: ") + e.what();
    return run;
  }
  for (const TestCase& tc : all)
    if (matches_filters(filters, tc.name())) run.results.emplace_back(tc.name(), run_case(ctx, tc));
  return run;
}

}  // namespace bpc
