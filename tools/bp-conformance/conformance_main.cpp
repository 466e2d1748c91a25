// bp-conformance: proves a Backplane backend plugin against the plugin ABI
// (plugins/conformance/README.md). The parent process parses arguments, discovers plugins and runs
// every test group in a child process (Note [Child processes] in conformance_runner.cpp); it never
// loads a plugin itself.
#include "conformance_child.hpp"
#include "conformance_comm.hpp"
#include "conformance_report.hpp"
#include "conformance_runner.hpp"
#include "conformance_suites.hpp"

#include <backplane/errors.hpp>
#include <backplane/runtime.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

using bpc::PluginInfo;
using bpc::Result;
using bpc::Status;

const char* kUsage =
    "usage: bp-conformance [--plugin PATH.so]... [--device TYPE[:N]]... [--filter GLOB]...\n"
    "                      [--json FILE] [--junit FILE] [--verify-xfail] [--timeout SECONDS]\n"
    "                      [--seed N] [--no-device-exit N] [--list] [--help]\n"
    "\n"
    "Tests Backplane backend plugins at the ABI level (the bp_plugin_api table).\n"
    "With no --plugin, every plugin of the load report (BACKPLANE_PLUGIN_PATH, the config\n"
    "file, the install's plugin folder) and every device of each is tested.\n"
    "\n"
    "  --plugin PATH     test this file only, loaded with the loader's checks (repeatable)\n"
    "  --device D        test only device D, e.g. cpu:0 or cuda:1 (repeatable)\n"
    "  --filter GLOB     run only tests whose name matches GLOB or contains it (repeatable);\n"
    "                    names look like kernels.add_broadcast[cpu:0,f32]\n"
    "  --json FILE       write one object per test (name suite device dtype status message\n"
    "                    seconds) to FILE\n"
    "  --junit FILE      write JUnit XML to FILE\n"
    "  --verify-xfail    an expected failure that passes (XPASS) fails the run\n"
    "  --timeout S       kill a test that runs longer than S seconds (default 120)\n"
    "  --seed N          random data seed (default: fresh each run; printed)\n"
    "  --no-device-exit N  exit with status N when no test failed and the plugins tested have\n"
    "                    no device (their plugin-level tests still run; the reason is printed):\n"
    "                    CTest's SKIP_RETURN_CODE, as conformance.<plugin> uses it with 77\n"
    "  --list            list the tests that would run, run nothing\n"
    "  --comm P ...      the communicator suite instead (bp-conformance --comm --help)\n"
    "\n"
    "Exit status: 0 when no test failed, 1 when one did, 2 on a usage error.\n";

struct Options {
  std::vector<std::string> plugins, devices, filters;
  std::string json, junit;
  bool verify_xfail = false, list = false;
  double timeout = 120;
  bool have_seed = false;
  uint64_t seed = 0;
  int no_device_exit = -1;  // --no-device-exit; -1: not given
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "bp-conformance: %s\n\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

// Parses "--name value" and "--name=value".
class Args {
 public:
  Args(int argc, char** argv) : argv_(argv + 1, argv + argc) {}
  bool done() const { return i_ >= argv_.size(); }
  bool take_flag(const char* name) {
    if (argv_[i_] != name) return false;
    ++i_;
    return true;
  }
  bool take_value(const char* name, std::string* out) {
    const std::string& a = argv_[i_];
    size_t n = std::strlen(name);
    if (a.compare(0, n, name) != 0) return false;
    if (a.size() == n) {
      if (i_ + 1 >= argv_.size()) usage_error(std::string(name) + " needs a value");
      *out = argv_[i_ + 1];
      i_ += 2;
      return true;
    }
    if (a[n] != '=') return false;
    *out = a.substr(n + 1);
    ++i_;
    return true;
  }
  const std::string& current() const { return argv_[i_]; }

 private:
  std::vector<std::string> argv_;
  size_t i_ = 0;
};

uint64_t parse_u64(const std::string& s, const char* what) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (s.empty() || *end || errno) usage_error(std::string(what) + ": not a number: '" + s + "'");
  return v;
}

int child_main(int argc, char** argv) {
  bpc::ChildOptions c;
  Args a(argc, argv);
  std::string v;
  while (!a.done()) {
    if (a.take_flag("--child-discover"))
      c.discover = true;
    else if (a.take_value("--child-group", &v))
      c.suite = v;
    else if (a.take_value("--plugin", &v))
      c.plugins.push_back(v);
    else if (a.take_value("--device-index", &v))
      c.device_index = std::atoi(v.c_str());
    else if (a.take_value("--child-fd", &v))
      c.fd = std::atoi(v.c_str());
    else if (a.take_value("--seed", &v))
      c.seed = parse_u64(v, "--seed");
    else if (a.take_value("--start", &v))
      c.start = static_cast<size_t>(parse_u64(v, "--start"));
    else if (a.take_value("--filter", &v))
      c.filters.push_back(v);
    else if (a.take_flag("--list-only"))
      c.list_only = true;
    else
      usage_error("unknown child argument '" + a.current() + "'");
  }
  return bpc::run_child(c);
}

Options parse(int argc, char** argv) {
  Options o;
  Args a(argc, argv);
  std::string v;
  while (!a.done()) {
    if (a.take_flag("--help") || a.take_flag("-h")) {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (a.take_value("--plugin", &v)) {
      o.plugins.push_back(v);
    } else if (a.take_value("--device", &v)) {
      o.devices.push_back(v);
    } else if (a.take_value("--filter", &v)) {
      o.filters.push_back(v);
    } else if (a.take_value("--json", &v)) {
      o.json = v;
    } else if (a.take_value("--junit", &v)) {
      o.junit = v;
    } else if (a.take_flag("--verify-xfail")) {
      o.verify_xfail = true;
    } else if (a.take_flag("--list")) {
      o.list = true;
    } else if (a.take_value("--timeout", &v)) {
      char* end = nullptr;
      o.timeout = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(o.timeout > 0)) usage_error("--timeout: not a positive number");
    } else if (a.take_value("--seed", &v)) {
      o.seed = parse_u64(v, "--seed");
      o.have_seed = true;
    } else if (a.take_value("--no-device-exit", &v)) {
      uint64_t code = parse_u64(v, "--no-device-exit");
      if (code > 255) usage_error("--no-device-exit: not an exit status (0-255)");
      o.no_device_exit = static_cast<int>(code);
    } else {
      usage_error("unknown argument '" + a.current() + "'");
    }
  }
  return o;
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return buf;
}

Result plugin_result(const std::string& test, const std::string& label, Status st,
                     const std::string& msg) {
  Result r;
  r.suite = "abi";
  r.device = label;
  r.name = "abi." + test + "[" + label + "]";
  r.status = st;
  r.message = msg;
  return r;
}

// The plugins and devices a run covers.
struct Selection {
  PluginInfo plugin;
  std::vector<int> devices;
};

}  // namespace

int main(int argc, char** argv) {
  if (bpc::is_comm_invocation(argc, argv)) return bpc::comm_main(argc, argv);
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--child-discover") || !std::strcmp(argv[i], "--child-group"))
      return child_main(argc, argv);

  Options opt = parse(argc, argv);
  bpc::RunnerOptions ro;
  ro.exe = self_exe();
  if (ro.exe.empty()) {
    std::fprintf(stderr, "bp-conformance: cannot read /proc/self/exe\n");
    return 2;
  }
  ro.timeout_s = opt.timeout;
  ro.filters = opt.filters;
  ro.seed = opt.have_seed
                ? opt.seed
                : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();

  std::vector<bp::DeviceSpec> specs;
  for (const std::string& d : opt.devices) {
    try {
      specs.push_back(bp::parse_device_string(d));
    } catch (const bp::Error& e) {
      usage_error(std::string("--device: ") + e.what());
    }
  }

  bpc::Report report(opt.verify_xfail);
  FILE* out = opt.list ? nullptr : stdout;
  auto emit = [&](const Result& r) {
    if (r.status == Status::fail || bpc::matches_filters(opt.filters, r.name)) report.add(r, out);
  };
  if (!opt.list)
    std::printf("bp-conformance: seed %llu (repeat with --seed %llu)\n",
                static_cast<unsigned long long>(ro.seed), static_cast<unsigned long long>(ro.seed));

  std::vector<PluginInfo> plugins;
  std::string error;
  if (!bpc::discover(ro, opt.plugins, &plugins, &error))
    emit(plugin_result("load", "all", Status::fail, error));

  // Choose plugins and devices.
  std::vector<Selection> selection;
  std::set<std::string> served;
  std::string no_device_reasons;  // "cuda: no CUDA driver; ..." for --no-device-exit
  auto wanted_type = [&](const std::string& type) {
    if (specs.empty()) return true;
    for (const auto& s : specs)
      if (s.type == type) return true;
    return false;
  };
  for (const PluginInfo& p : plugins) {
    const std::string label = p.label();
    if (!p.loaded()) {
      if (!wanted_type(label) && !wanted_type(p.device_type) && opt.plugins.empty()) continue;
      std::string msg = p.decision + ": " + p.path + ": " + p.reason;
      emit(plugin_result("load", label, p.status == "skipped" ? Status::skip : Status::fail, msg));
      continue;
    }
    if (!wanted_type(p.device_type)) continue;
    served.insert(p.device_type);
    Selection sel{p, {}};
    if (specs.empty()) {
      for (int i = 0; i < p.device_count; ++i) sel.devices.push_back(i);
    } else {
      for (const auto& s : specs) {
        if (s.type != p.device_type) continue;
        if (s.index >= p.device_count) {
          emit(plugin_result("select", s.type + ":" + std::to_string(s.index), Status::fail,
                             bpc::format("device %s:%d does not exist: %s has %d device(s)%s",
                                         s.type.c_str(), s.index, p.path.c_str(), p.device_count,
                                         p.reason.empty() ? "" : (" (" + p.reason + ")").c_str())));
          continue;
        }
        sel.devices.push_back(s.index);
      }
    }
    emit(plugin_result(
        "load", label, Status::pass,
        bpc::format("%s: %s %s, ABI %d.%d, %d device(s)", p.path.c_str(), p.name.c_str(),
                    p.version.c_str(), p.abi_major, p.abi_minor, p.device_count)));
    if (p.device_count == 0) {
      const std::string why = p.reason.empty() ? "none found" : p.reason;
      emit(plugin_result("devices", label, Status::skip, "no devices to test: " + why));
      no_device_reasons += (no_device_reasons.empty() ? "" : "; ") + label + ": " + why;
    }
    selection.push_back(sel);
  }
  for (const auto& s : specs) {
    if (served.count(s.type)) continue;
    std::string types;
    for (const PluginInfo& p : plugins)
      if (p.loaded()) types += (types.empty() ? "" : ", ") + p.device_type;
    emit(plugin_result("select", s.type, Status::fail,
                       "no loaded plugin serves device type '" + s.type +
                           "' (loaded: " + (types.empty() ? "none" : types) + ")"));
  }

  if (opt.list) {
    int rc = report.failed() ? 1 : 0;
    for (const Result& r : report.results())
      if (r.status == Status::fail) std::fprintf(stderr, "%s\n", bpc::result_line(r).c_str());
    for (const Selection& sel : selection) {
      auto list = [&](const std::string& suite, int dev) {
        std::vector<bpc::PlanEntry> plan;
        std::string err;
        if (!bpc::list_group(ro, suite, sel.plugin, dev, &plan, &err)) {
          std::fprintf(stderr, "bp-conformance: %s on %s: %s\n", suite.c_str(),
                       sel.plugin.label().c_str(), err.c_str());
          rc = 1;
        }
        for (const auto& p : plan) std::printf("%s\n", p.name.c_str());
      };
      for (const std::string& suite : bpc::plugin_suites()) list(suite, -1);
      for (int d : sel.devices)
        for (const std::string& suite : bpc::device_suites()) list(suite, d);
    }
    return rc;
  }

  for (const Selection& sel : selection) {
    for (const std::string& suite : bpc::plugin_suites())
      bpc::run_group(ro, suite, sel.plugin, -1, emit);
    for (int d : sel.devices)
      for (const std::string& suite : bpc::device_suites())
        bpc::run_group(ro, suite, sel.plugin, d, emit);
  }

  report.print_summary(stdout);
  int rc = report.failed() ? 1 : 0;
  size_t devices_tested = 0;
  for (const Selection& sel : selection) devices_tested += sel.devices.size();
  if (rc == 0 && opt.no_device_exit >= 0 && !selection.empty() && devices_tested == 0) {
    std::printf(
        "bp-conformance: SKIPPED: no device to test (%s); exit status %d "
        "(--no-device-exit)\n",
        no_device_reasons.c_str(), opt.no_device_exit);
    rc = opt.no_device_exit;
  }
  if (!opt.json.empty() && !report.write_json(opt.json, &error)) {
    std::fprintf(stderr, "bp-conformance: --json: %s\n", error.c_str());
    rc = 1;
  }
  if (!opt.junit.empty() && !report.write_junit(opt.junit, &error)) {
    std::fprintf(stderr, "bp-conformance: --junit: %s\n", error.c_str());
    rc = 1;
  }
  return rc;
}
