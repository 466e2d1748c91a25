#include "conformance_child.hpp"

#include "conformance_harness.hpp"
#include "conformance_inprocess.hpp"
#include "conformance_protocol.hpp"
#include "conformance_suites.hpp"

#include <backplane/runtime.hpp>
#include <plugin_host.hpp>

#include <fnmatch.h>
#include <unistd.h>

#include <chrono>
#include <exception>

namespace bpc {

bool matches_filters(const std::vector<std::string>& filters, const std::string& name) {
  if (filters.empty()) return true;
  for (const std::string& f : filters)
    if (fnmatch(f.c_str(), name.c_str(), 0) == 0 || name.find(f) != std::string::npos) return true;
  return false;
}

namespace {

const char* report_status(bp::PluginReport::Status s) {
  switch (s) {
    case bp::PluginReport::Status::loaded:
      return "loaded";
    case bp::PluginReport::Status::skipped:
      return "skipped";
    default:
      return "failed";
  }
}

void emit_plugin(int fd, const bp::PluginReport& r) {
  write_record(fd, {"PLUGIN", r.path, report_status(r.status), r.decision, r.reason, r.name,
                    r.device_type, r.version, std::to_string(r.abi_major),
                    std::to_string(r.abi_minor), std::to_string(r.device_count)});
}

int run_discover(const ChildOptions& opt) {
  if (opt.plugins.empty()) {
    for (const bp::PluginReport& r : bp::load_report()) emit_plugin(opt.fd, r);
  } else {
    for (const std::string& p : opt.plugins) emit_plugin(opt.fd, bp::inspect_plugin(p));
  }
  write_record(opt.fd, {"DONE"});
  return 0;
}

int run_group(const ChildOptions& opt) {
  const int fd = opt.fd;
  if (opt.plugins.size() != 1) {
    write_record(fd, {"SETUP", "internal: --child-group needs exactly one --plugin"});
    return 2;
  }
  const std::string& path = opt.plugins[0];
  bp::host::LoadedPlugin loaded = bp::host::load_plugin(path);
  const bp::PluginReport& r = loaded.report;
  if (r.status != bp::PluginReport::Status::loaded || !loaded.api) {
    write_record(fd, {"SETUP", "the plugin did not load: " + r.reason});
    write_record(fd, {"DONE"});
    return 0;
  }
  const bool plugin_level = is_plugin_suite(opt.suite);
  std::string label = r.device_type;
  if (!plugin_level) {
    label += ':';
    label += std::to_string(opt.device_index);
  }
  Context ctx(loaded.api, path, plugin_level ? -1 : opt.device_index, label, opt.seed);
  std::vector<TestCase> all;
  try {
    if (!build_suite(opt.suite, ctx, all)) {
      write_record(fd, {"SETUP", "unknown suite '" + opt.suite + "'"});
      return 2;
    }
  } catch (const std::exception& e) {
    write_record(fd, {"SETUP", std::string("building the test list failed: ") + e.what()});
    write_record(fd, {"DONE"});
    return 0;
  }
  std::vector<const TestCase*> selected;
  for (const TestCase& tc : all)
    if (matches_filters(opt.filters, tc.name())) selected.push_back(&tc);
  for (size_t i = 0; i < selected.size(); ++i) {
    const TestCase& tc = *selected[i];
    write_record(fd, {"PLAN", std::to_string(i), tc.name(), tc.suite, tc.device, tc.dtype});
  }
  if (!opt.list_only) {
    for (size_t i = opt.start; i < selected.size(); ++i) {
      write_record(fd, {"BEGIN", std::to_string(i)});
      auto t0 = std::chrono::steady_clock::now();
      CaseResult o = run_case(ctx, *selected[i]);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      write_record(fd, {"RESULT", std::to_string(i), status_name(o.status), format("%.6f", secs),
                        o.message});
    }
  }
  write_record(fd, {"DONE"});
  return 0;
}

}  // namespace

int run_child(const ChildOptions& opt) {
  int rc;
  try {
    rc = opt.discover ? run_discover(opt) : run_group(opt);
  } catch (const std::exception& e) {
    write_record(opt.fd, {"SETUP", std::string("the child failed: ") + e.what()});
    rc = 2;
  }
  // The group's resources were released by Context's destructor above. Static destructors and
  // atexit handlers of libraries we do not own are skipped: the parent has every record.
  ::_exit(rc);
}

}  // namespace bpc
