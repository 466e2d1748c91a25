// Note [Child processes]
//   Each test group (one suite on one device, or a plugin-level suite) runs in a child process,
//   so that a plugin that crashes or hangs fails only the test that was running. Children are
//   started by re-executing this program (/proc/self/exe) with hidden arguments rather than by
//   fork alone: the CUDA driver, like other GPU stacks, does not survive a fork after it was
//   initialised, and the parent never loads a plugin at all — even discovery (the load report)
//   happens in a child.
//
//   A child writes records (conformance_protocol.hpp) to descriptor 3, one write per record,
//   so everything it reported before dying reaches the parent. The parent announces nothing
//   until a RESULT arrives; BEGIN tells it which test was running if the child then dies or
//   stops making progress for --timeout seconds (it is killed with SIGKILL). That test is
//   reported as failed with the signal or the timeout, and the group continues in a fresh child
//   from the next index (--start), up to RunnerOptions::max_restarts times. A child's test list
//   depends only on the plugin and the device, so indices agree across restarts; the parent
//   checks the names.
#include "conformance_runner.hpp"

#include "conformance_protocol.hpp"
#include "conformance_suites.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

namespace bpc {

std::string PluginInfo::label() const {
  if (!device_type.empty()) return device_type;
  std::string f = std::filesystem::path(path).filename().string();
  const std::string prefix = "libbackplane-", suffix = ".so";
  if (f.size() > prefix.size() + suffix.size() && f.rfind(prefix, 0) == 0 &&
      f.compare(f.size() - suffix.size(), suffix.size(), suffix) == 0)
    return f.substr(prefix.size(), f.size() - prefix.size() - suffix.size());
  return f;
}

namespace {

struct ChildExit {
  bool timed_out = false;
  bool spawn_failed = false;
  int status = 0;  // from waitpid
  std::string spawn_error;

  bool clean() const {
    return !timed_out && !spawn_failed && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  std::string describe(double timeout_s) const {
    if (spawn_failed) return "could not be started: " + spawn_error;
    if (timed_out) return format("timed out after %g s and was killed", timeout_s);
    if (WIFSIGNALED(status)) {
      int sig = WTERMSIG(status);
      const char* abbrev = sigabbrev_np(sig);
      return format("crashed with signal %d (SIG%s: %s)", sig, abbrev ? abbrev : "?",
                    strsignal(sig));
    }
    if (WIFEXITED(status)) return format("exited with status %d", WEXITSTATUS(status));
    return "ended abnormally";
  }
};

// Spawns exe with args, records on descriptor 3; calls on_record for each record. The child
// is killed when no record arrives for timeout_s.
ChildExit spawn_child(const std::string& exe, const std::vector<std::string>& args,
                      double timeout_s,
                      const std::function<void(const std::vector<std::string>&)>& on_record) {
  ChildExit ex;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    ex.spawn_failed = true;
    ex.spawn_error = std::string("pipe2: ") + std::strerror(errno);
    return ex;
  }
  std::vector<std::string> all = {exe};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    ex.spawn_failed = true;
    ex.spawn_error = std::string("fork: ") + std::strerror(errno);
    close(fds[0]);
    close(fds[1]);
    return ex;
  }
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec. Whatever a plugin prints goes to
    // stderr: the parent's stdout carries the report alone.
    dup2(STDERR_FILENO, STDOUT_FILENO);
    if (fds[1] == 3) {
      fcntl(3, F_SETFD, 0);
    } else if (dup2(fds[1], 3) < 0) {
      _exit(127);
    }
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  using clock = std::chrono::steady_clock;
  auto deadline = clock::now() + std::chrono::duration<double>(timeout_s);
  std::string pending;
  char buf[65536];
  bool eof = false;
  while (!eof) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0) {
      ex.timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      eof = true;
      break;
    }
    pending.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      deadline = clock::now() + std::chrono::duration<double>(timeout_s);
      on_record(split_record(line));
    }
  }
  close(fds[0]);
  if (!ex.timed_out) {
    // The descriptor closed: the child is exiting. Give it the rest of the timeout to do so.
    for (;;) {
      pid_t w = waitpid(pid, &ex.status, WNOHANG);
      if (w == pid) return ex;
      if (w < 0 && errno != EINTR) return ex;
      if (clock::now() > deadline) {
        ex.timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  kill(pid, SIGKILL);
  while (waitpid(pid, &ex.status, 0) < 0 && errno == EINTR) {
  }
  return ex;
}

std::vector<std::string> group_args(const RunnerOptions& opt, const std::string& suite,
                                    const PluginInfo& plugin, int device_index, size_t start,
                                    bool list_only) {
  std::vector<std::string> a = {"--child-group",  suite,
                                "--plugin",       plugin.path,
                                "--device-index", std::to_string(device_index),
                                "--child-fd",     "3",
                                "--seed",         std::to_string(opt.seed),
                                "--start",        std::to_string(start)};
  for (const auto& f : opt.filters) {
    a.push_back("--filter");
    a.push_back(f);
  }
  if (list_only) a.push_back("--list-only");
  return a;
}

std::string group_label(const std::string& suite, const PluginInfo& plugin, int device_index) {
  return is_plugin_suite(suite) ? plugin.label()
                                : plugin.label() + ":" + std::to_string(device_index);
}

Result group_result(const std::string& suite, const std::string& test, const std::string& label,
                    Status st, const std::string& msg) {
  Result r;
  r.suite = suite;
  r.device = label;
  r.name = suite + "." + test + "[" + label + "]";
  r.status = st;
  r.message = msg;
  return r;
}

PluginInfo plugin_from_record(const std::vector<std::string>& f) {
  PluginInfo p;
  p.path = f[1];
  p.status = f[2];
  p.decision = f[3];
  p.reason = f[4];
  p.name = f[5];
  p.device_type = f[6];
  p.version = f[7];
  p.abi_major = std::atoi(f[8].c_str());
  p.abi_minor = std::atoi(f[9].c_str());
  p.device_count = std::atoi(f[10].c_str());
  return p;
}

}  // namespace

bool discover(const RunnerOptions& opt, const std::vector<std::string>& paths,
              std::vector<PluginInfo>* out, std::string* error) {
  auto once = [&](const std::vector<std::string>& files, std::vector<PluginInfo>* got, bool* done) {
    std::vector<std::string> args = {"--child-discover", "--child-fd", "3"};
    for (const auto& f : files) {
      args.push_back("--plugin");
      args.push_back(f);
    }
    return spawn_child(opt.exe, args, opt.timeout_s, [&](const std::vector<std::string>& f) {
      if (f[0] == "PLUGIN" && f.size() >= 11) got->push_back(plugin_from_record(f));
      if (f[0] == "DONE") *done = true;
    });
  };
  if (paths.empty()) {
    bool done = false;
    ChildExit ex = once({}, out, &done);
    if (!ex.clean() || !done) {
      *error = "loading the plugins (in a child process) " + ex.describe(opt.timeout_s) +
               "; rerun with --plugin PATH for each plugin to find which one";
      return false;
    }
    return true;
  }
  for (const std::string& p : paths) {
    bool done = false;
    std::vector<PluginInfo> got;
    ChildExit ex = once({p}, &got, &done);
    if (ex.clean() && done && got.size() == 1) {
      out->push_back(got[0]);
      continue;
    }
    PluginInfo bad;
    bad.path = p;
    bad.status = "failed";
    bad.decision = "failed";
    bad.reason = "the process loading it " + ex.describe(opt.timeout_s) +
                 " (in dlopen, bp_plugin_get_api, init or device_count)";
    out->push_back(bad);
  }
  return true;
}

void run_group(const RunnerOptions& opt, const std::string& suite, const PluginInfo& plugin,
               int device_index, const std::function<void(const Result&)>& emit) {
  const std::string label = group_label(suite, plugin, device_index);
  std::vector<PlanEntry> plan;
  std::vector<bool> reported;
  bool have_plan = false;
  size_t start = 0;
  int restarts = 0;
  for (;;) {
    std::vector<PlanEntry> this_plan;
    long current = -1;
    bool done = false;
    std::string setup;
    ChildExit ex = spawn_child(opt.exe, group_args(opt, suite, plugin, device_index, start, false),
                               opt.timeout_s, [&](const std::vector<std::string>& f) {
                                 const std::string& kind = f[0];
                                 if (kind == "PLAN" && f.size() >= 6) {
                                   this_plan.push_back({f[2], f[3], f[4], f[5]});
                                   if (!have_plan) {
                                     plan.push_back(this_plan.back());
                                     reported.push_back(false);
                                   }
                                 } else if (kind == "BEGIN" && f.size() >= 2) {
                                   current = std::atol(f[1].c_str());
                                 } else if (kind == "RESULT" && f.size() >= 5) {
                                   size_t i = static_cast<size_t>(std::atol(f[1].c_str()));
                                   if (i >= plan.size()) return;
                                   Result r;
                                   r.name = plan[i].name;
                                   r.suite = plan[i].suite;
                                   r.device = plan[i].device;
                                   r.dtype = plan[i].dtype;
                                   if (!parse_status(f[2], &r.status)) {
                                     r.status = Status::fail;
                                     r.message = "internal: unknown status '" + f[2] + "'; ";
                                   }
                                   r.seconds = std::atof(f[3].c_str());
                                   r.message += f[4];
                                   reported[i] = true;
                                   current = -1;
                                   emit(r);
                                 } else if (kind == "SETUP" && f.size() >= 2) {
                                   setup = f[1];
                                 } else if (kind == "DONE") {
                                   done = true;
                                 }
                               });
    if (!setup.empty()) {
      emit(group_result(suite, "setup", label, Status::fail, setup));
      return;
    }
    if (!have_plan) {
      have_plan = true;
      if (this_plan.empty() && ex.clean() && done) return;  // the filter selected nothing
      if (this_plan.empty()) {
        emit(group_result(
            suite, "setup", label, Status::fail,
            "the group's process " + ex.describe(opt.timeout_s) + " before listing its tests"));
        return;
      }
    } else {
      bool same = this_plan.size() == plan.size();
      for (size_t i = 0; same && i < plan.size(); ++i) same = this_plan[i].name == plan[i].name;
      if (!same) {
        emit(group_result(suite, "harness", label, Status::fail,
                          "the test list changed between child processes; stopping the group"));
        return;
      }
    }
    if (ex.clean() && done) return;
    const std::string why = ex.describe(opt.timeout_s);
    if (current >= 0 && static_cast<size_t>(current) < plan.size()) {
      Result r;
      const PlanEntry& p = plan[static_cast<size_t>(current)];
      r.name = p.name;
      r.suite = p.suite;
      r.device = p.device;
      r.dtype = p.dtype;
      r.status = Status::fail;
      r.message = "the test's process " + why +
                  " while running it; the group goes on in a new "
                  "process";
      reported[static_cast<size_t>(current)] = true;
      emit(r);
      start = static_cast<size_t>(current) + 1;
    } else if (done) {
      emit(group_result(suite, "exit", label, Status::fail,
                        "the group's process " + why + " after its last test"));
      return;
    } else {
      emit(group_result(suite, "harness", label, Status::fail,
                        "the group's process " + why + " between tests"));
      while (start < plan.size() && reported[start]) ++start;
    }
    if (start >= plan.size()) return;
    if (++restarts > opt.max_restarts) {
      for (size_t i = start; i < plan.size(); ++i) {
        if (reported[i]) continue;
        Result r;
        r.name = plan[i].name;
        r.suite = plan[i].suite;
        r.device = plan[i].device;
        r.dtype = plan[i].dtype;
        r.status = Status::skip;
        r.message = format("not run: the group's process failed %d times", restarts);
        emit(r);
      }
      return;
    }
  }
}

bool list_group(const RunnerOptions& opt, const std::string& suite, const PluginInfo& plugin,
                int device_index, std::vector<PlanEntry>* out, std::string* error) {
  bool done = false;
  std::string setup;
  ChildExit ex = spawn_child(opt.exe, group_args(opt, suite, plugin, device_index, 0, true),
                             opt.timeout_s, [&](const std::vector<std::string>& f) {
                               if (f[0] == "PLAN" && f.size() >= 6)
                                 out->push_back({f[2], f[3], f[4], f[5]});
                               else if (f[0] == "SETUP" && f.size() >= 2)
                                 setup = f[1];
                               else if (f[0] == "DONE")
                                 done = true;
                             });
  if (!setup.empty()) {
    *error = setup;
    return false;
  }
  if (!ex.clean() || !done) {
    *error = "listing the tests " + ex.describe(opt.timeout_s);
    return false;
  }
  return true;
}

}  // namespace bpc
