// Start-up cost of Backplane programs (issue 29; Note [Loading on demand] in
// core/src/runtime/registry.cpp): each case is started as a fresh process --runs times (after
// one unmeasured warm-up run), and one JSON line per case gives the median and minimum wall time
// from fork to exit and the largest peak resident set size (the child's rusage ru_maxrss), with
// the goal beside it. Cases:
//   cpp_trivial      bp-startup-trivial: one CPU op and a read, every plugin installed
//   python_first_op  python3 -c "import backplane; one op and a read" (skipped with the reason
//                    when `import backplane` fails, e.g. without PYTHONPATH)
//   bp_smi           bp-smi: every plugin loaded and every device listed
//   cuda_first_op    (only with --case) bp-startup-trivial cuda:0: the first cuda op
//   cuda_first_op_all_plugins  (only with --case) the same after opening every plugin, as
//                    before plugins were loaded on demand
// Usage: bp-bench-startup [--runs N] [--python EXE] [--case NAME]...
// The programs are found beside this one (bin/; bp-smi also in the build tree's tools/). The
// environment is passed on unchanged, so BACKPLANE_PLUGINS, BACKPLANE_PLUGIN_PATH and PYTHONPATH
// apply to every case.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

struct Case {
  std::string name;
  std::vector<std::string> argv;
  double goal_ms;
  double goal_rss_mib;  // 0: none
};

struct Run {
  double ms = 0;
  double rss_mib = 0;
  int status = 0;
};

Run run_once(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("bp-bench-startup: fork");
    std::exit(2);
  }
  if (pid == 0) {
    if (std::FILE* null = std::freopen("/dev/null", "w", stdout)) (void)null;
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "bp-bench-startup: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  Run r;
  struct rusage ru {};
  while (::wait4(pid, &r.status, 0, &ru) < 0 && errno == EINTR) {
  }
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.rss_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;  // KiB on Linux
  return r;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string command_line(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 10;
  std::string python = "python3";
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (a == "--python" && i + 1 < argc) {
      python = argv[++i];
    } else if (a == "--case" && i + 1 < argc) {
      only.push_back(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--runs N] [--python EXE] [--case NAME]...\n", argv[0]);
      return 2;
    }
  }
  if (runs < 1 || runs > 1000) {
    std::fprintf(stderr, "bp-bench-startup: --runs must be 1 to 1000\n");
    return 2;
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path here = fs::canonical("/proc/self/exe", ec).parent_path();
  // bp-smi is built into tools/ of the build tree and installed beside the other programs.
  fs::path smi = here / "bp-smi";
  if (!fs::exists(smi) && fs::exists(here.parent_path() / "tools" / "bp-smi"))
    smi = here.parent_path() / "tools" / "bp-smi";
  const std::string first_op =
      "import backplane as bp\nt = bp.ones([4]) + 1.0\nassert t.tolist()[3] == 2.0\n";
  std::vector<Case> cases = {
      {"cpp_trivial", {(here / "bp-startup-trivial").string()}, 30, 30},
      {"python_first_op", {python, "-c", first_op}, 100, 60},
      {"bp_smi", {smi.string()}, 150, 0},
      // Issue 29: the first cuda op no slower than before plugins loaded on demand (the second
      // case opens every plugin first, as that did). No goal of their own (0); run only when
      // asked for, on a machine with a GPU.
      {"cuda_first_op", {(here / "bp-startup-trivial").string(), "cuda:0"}, 0, 0},
      {"cuda_first_op_all_plugins",
       {(here / "bp-startup-trivial").string(), "cuda:0", "--all-plugins"},
       0,
       0},
  };
  if (const char* v = std::getenv("PYTHONDONTWRITEBYTECODE"); v && *v)
    std::fprintf(stderr,
                 "bp-bench-startup: PYTHONDONTWRITEBYTECODE is set, so every python_first_op run "
                 "compiles backplane's Python sources (an installed package has them compiled; "
                 "unset it to measure that)\n");
  int failed = 0;
  for (const Case& c : cases) {
    const bool asked = std::find(only.begin(), only.end(), c.name) != only.end();
    if (only.empty() ? c.goal_ms == 0 : !asked) continue;  // goal-less cases only when asked
    Run warm = run_once(c.argv);                           // also: does it run at all?
    if (!WIFEXITED(warm.status) || WEXITSTATUS(warm.status) != 0) {
      std::printf("{\"bench\": \"startup\", \"case\": \"%s\", \"skipped\": %s}\n", c.name.c_str(),
                  json_string(command_line(c.argv) + " exited with status " +
                              std::to_string(WIFEXITED(warm.status) ? WEXITSTATUS(warm.status)
                                                                    : 128 + WTERMSIG(warm.status)))
                      .c_str());
      ++failed;
      continue;
    }
    std::vector<double> ms;
    double rss = 0;
    for (int k = 0; k < runs; ++k) {
      Run r = run_once(c.argv);
      ms.push_back(r.ms);
      rss = std::max(rss, r.rss_mib);
    }
    std::sort(ms.begin(), ms.end());
    const double median = runs % 2 ? ms[runs / 2] : (ms[runs / 2 - 1] + ms[runs / 2]) / 2;
    std::printf(
        "{\"bench\": \"startup\", \"case\": \"%s\", \"runs\": %d, \"median_ms\": %.1f, "
        "\"min_ms\": %.1f, \"max_rss_mib\": %.1f, \"goal_ms\": %.0f, \"goal_rss_mib\": %.0f, "
        "\"within_goal\": %s}\n",
        c.name.c_str(), runs, median, ms.front(), rss, c.goal_ms, c.goal_rss_mib,
        c.goal_ms == 0                                                          ? "null"
        : median <= c.goal_ms && (c.goal_rss_mib == 0 || rss <= c.goal_rss_mib) ? "true"
                                                                                : "false");
    std::fflush(stdout);
  }
  return failed ? 1 : 0;
}
