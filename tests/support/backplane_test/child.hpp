// Running a command, or this test binary again, in a child process: for settings a process
// reads once (BACKPLANE_LAUNCH_BLOCKING, a plugin's init variables, the default registry).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace bp_test {

struct ChildResult {
  int status = -1;     // as pclose returns it
  std::string output;  // standard output and error together
  bool exited_zero() const { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  // The exit status, or 128 + the signal that ended it (as a shell reports it).
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
};

// Runs a shell command line (popen), collecting its standard output, and its standard error too
// unless merge_stderr is false.
inline ChildResult run_command(const std::string& cmd, bool merge_stderr = true) {
  ChildResult r;
  const std::string line = merge_stderr ? cmd + " 2>&1" : cmd;
  FILE* p = ::popen(line.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed for: " + cmd);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  r.status = ::pclose(p);
  return r;
}

// Runs this test binary again as `env ENV_ASSIGNMENTS <self> --gtest_filter=FILTER EXTRA`
// (ENV_ASSIGNMENTS e.g. "BACKPLANE_LAUNCH_BLOCKING=1"; EXTRA further gtest flags).
inline ChildResult rerun_self(const std::string& env_assignments, const std::string& filter,
                              const std::string& extra = "") {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  return run_command("env " + env_assignments + " '" + self + "' --gtest_filter=" + filter +
                     (extra.empty() ? "" : " " + extra));
}

}  // namespace bp_test
