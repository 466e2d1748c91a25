// The communicator suite's parent (Note [Communicator suite processes] in conformance_comm.hpp):
// arguments, the store, one child per rank, merging their result lines into one report.
#include "conformance_comm.hpp"
#include "conformance_harness.hpp"

#include "conformance_report.hpp"

#include <backplane/dist_store.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace bpc {

namespace {

const char* kUsage =
    "usage: bp-conformance --comm NAME|PATH.so [--world-size N] [--comm-device TYPE:I]\n"
    "                      [--filter GLOB]... [--json FILE] [--junit FILE] [--timeout S]\n"
    "                      [--seed N] [--list]\n"
    "\n"
    "Tests a communicator plugin (libbackplane-comm-<name>.so) through its C table with N rank\n"
    "processes on this host: every collective, dtype and reduction against a float64 host\n"
    "reference, odd sizes and offsets, empty buffers, point to point, barriers, work handles,\n"
    "error objects, and a timeout followed by an abort.\n"
    "\n"
    "  --comm P          a plugin name from the search path (gloo) or a file (./libx.so)\n"
    "  --world-size N    ranks to start (default 2)\n"
    "  --comm-device D   the memory to reduce (default: the plugin's first device type, :0)\n"
    "  --timeout S       a rank that makes no progress for S seconds fails (default 120)\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "bp-conformance: %s\n\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  return buf;
}

struct Parsed {
  CommChildOptions child;
  bool is_child = false, list = false, have_seed = false;
  std::string json, junit;
};

Parsed parse(int argc, char** argv) {
  Parsed p;
  p.child.world = 2;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      size_t eq = a.find('=');
      if (eq != std::string::npos) return a.substr(eq + 1);
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    std::string key = a.substr(0, a.find('='));
    if (key == "--comm") {
      p.child.plugin = value();
    } else if (key == "--comm-child") {
      p.is_child = true;
    } else if (key == "--world-size") {
      p.child.world = std::atoi(value().c_str());
      if (p.child.world < 1 || p.child.world > 64) usage_error("--world-size needs 1..64");
    } else if (key == "--rank") {
      p.child.rank = std::atoi(value().c_str());
    } else if (key == "--store-port") {
      p.child.store_port = std::atoi(value().c_str());
    } else if (key == "--comm-device") {
      p.child.device = value();
    } else if (key == "--filter") {
      p.child.filters.push_back(value());
    } else if (key == "--timeout") {
      p.child.timeout_s = std::atof(value().c_str());
      if (!(p.child.timeout_s > 0)) usage_error("--timeout needs a positive number");
    } else if (key == "--seed") {
      p.child.seed = std::strtoull(value().c_str(), nullptr, 0);
      p.have_seed = true;
    } else if (key == "--json") {
      p.json = value();
    } else if (key == "--junit") {
      p.junit = value();
    } else if (a == "--list") {
      p.list = p.child.list = true;
    } else if (a == "-h" || a == "--help") {
      std::printf("%s", kUsage);
      std::exit(0);
    } else {
      usage_error("unknown argument '" + a + "' in --comm mode");
    }
  }
  if (p.child.plugin.empty()) usage_error("--comm needs a plugin name or path");
  return p;
}

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int fd = -1;
  std::string buf;
  bool exited = false;
  int status = 0;
};

struct Merged {
  std::string name;
  std::vector<std::string> status;  // per rank, "" until reported
  std::vector<std::string> message;
  double seconds = 0;
};

std::string signal_text(int status) {
  if (WIFSIGNALED(status))
    return format("was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  if (WIFEXITED(status)) return format("exited with status %d", WEXITSTATUS(status));
  return "stopped";
}

}  // namespace

bool is_comm_invocation(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--comm-child" || a == "--comm" || a.rfind("--comm=", 0) == 0) return true;
  }
  return false;
}

int comm_main(int argc, char** argv) {
  Parsed p = parse(argc, argv);
  if (p.is_child) return comm_child_main(p.child);
  if (!p.have_seed)
    p.child.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  std::printf("bp-conformance: communicator suite, plugin %s, %d rank(s), seed %llu\n",
              p.child.plugin.c_str(), p.child.world, static_cast<unsigned long long>(p.child.seed));
  std::fflush(stdout);
  std::unique_ptr<bp::dist::TcpStoreServer> server;
  try {
    // The ranks inherit the secret (Note [Store limits]).
    if (const char* s = std::getenv("BACKPLANE_STORE_SECRET"); !s || !*s)
      ::setenv("BACKPLANE_STORE_SECRET", bp::dist::generate_store_secret().c_str(), 1);
    server = std::make_unique<bp::dist::TcpStoreServer>("127.0.0.1", 0,
                                                        std::getenv("BACKPLANE_STORE_SECRET"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bp-conformance: %s\n", e.what());
    return 1;
  }
  std::string exe = self_exe();
  // The core tests join a bp::dist group through this store (hosted here), with the plugin
  // found by the registry: a plugin given as a file goes first in the search path.
  ::setenv("BACKPLANE_STORE_HOSTED", "1", 1);
  if (p.child.plugin.find('/') != std::string::npos) {
    const char* old = std::getenv("BACKPLANE_PLUGIN_PATH");
    std::string path = p.child.plugin + (old && *old ? std::string(":") + old : "");
    ::setenv("BACKPLANE_PLUGIN_PATH", path.c_str(), 1);
  }
  std::vector<Child> kids(static_cast<size_t>(p.child.world));
  for (int r = 0; r < p.child.world; ++r) {
    int fds[2];
    if (::pipe(fds) != 0) {
      std::perror("bp-conformance: pipe");
      return 1;
    }
    std::vector<std::string> args = {exe,
                                     "--comm-child",
                                     "--comm",
                                     p.child.plugin,
                                     "--world-size",
                                     std::to_string(p.child.world),
                                     "--rank",
                                     std::to_string(r),
                                     "--store-port",
                                     std::to_string(server->port()),
                                     "--seed",
                                     std::to_string(p.child.seed),
                                     "--timeout",
                                     std::to_string(p.child.timeout_s)};
    if (!p.child.device.empty()) args.insert(args.end(), {"--comm-device", p.child.device});
    for (const auto& f : p.child.filters) args.insert(args.end(), {"--filter", f});
    if (p.list) args.push_back("--list");
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("bp-conformance: fork");
      return 1;
    }
    if (pid == 0) {
      ::dup2(fds[1], 1);
      ::close(fds[0]);
      ::close(fds[1]);
      std::vector<char*> av;
      for (auto& s : args) av.push_back(s.data());
      av.push_back(nullptr);
      ::execv(exe.c_str(), av.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    kids[static_cast<size_t>(r)] = Child{r, pid, fds[0], "", false, 0};
  }

  std::vector<Merged> merged;
  std::map<std::string, size_t> index;
  auto record = [&](int rank, const std::string& line) {
    // R \t name \t status \t seconds \t message
    std::vector<std::string> f;
    size_t start = 0;
    for (int k = 0; k < 4; ++k) {
      size_t tab = line.find('\t', start);
      if (tab == std::string::npos) return;
      f.push_back(line.substr(start, tab - start));
      start = tab + 1;
    }
    f.push_back(line.substr(start));
    if (f[0] != "R") return;
    auto it = index.find(f[1]);
    if (it == index.end()) {
      it = index.emplace(f[1], merged.size()).first;
      Merged m;
      m.name = f[1];
      m.status.assign(static_cast<size_t>(p.child.world), "");
      m.message.assign(static_cast<size_t>(p.child.world), "");
      merged.push_back(std::move(m));
    }
    Merged& m = merged[it->second];
    m.status[static_cast<size_t>(rank)] = f[2];
    m.message[static_cast<size_t>(rank)] = f[4];
    m.seconds = std::max(m.seconds, std::atof(f[3].c_str()));
  };
  auto last_progress = std::chrono::steady_clock::now();
  bool timed_out = false;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Child*> who;
    for (auto& k : kids)
      if (k.fd >= 0) {
        fds.push_back({k.fd, POLLIN, 0});
        who.push_back(&k);
      }
    if (fds.empty()) break;
    ::poll(fds.data(), fds.size(), 200);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      char tmp[65536];
      ssize_t n = ::read(fds[i].fd, tmp, sizeof tmp);
      Child& k = *who[i];
      if (n > 0) {
        last_progress = std::chrono::steady_clock::now();
        k.buf.append(tmp, static_cast<size_t>(n));
        size_t nl;
        while ((nl = k.buf.find('\n')) != std::string::npos) {
          record(k.rank, k.buf.substr(0, nl));
          k.buf.erase(0, nl + 1);
        }
      } else {
        ::close(k.fd);
        k.fd = -1;
      }
    }
    if (std::chrono::steady_clock::now() - last_progress >
        std::chrono::duration<double>(p.child.timeout_s)) {
      timed_out = true;
      for (auto& k : kids)
        if (k.fd >= 0) ::kill(k.pid, SIGKILL);
    }
  }
  for (auto& k : kids) {
    ::waitpid(k.pid, &k.status, 0);
    k.exited = true;
  }

  Report report(false);
  for (const Merged& m : merged) {
    Result r;
    r.name = m.name;
    r.suite = "comm";
    r.device = p.child.plugin;
    r.seconds = m.seconds;
    r.status = Status::pass;
    bool all_skip = true;
    for (int rank = 0; rank < p.child.world; ++rank) {
      const std::string& st = m.status[static_cast<size_t>(rank)];
      if (st != "SKIP") all_skip = false;
      if (st == "FAIL" || st.empty()) {
        r.status = Status::fail;
        const Child& k = kids[static_cast<size_t>(rank)];
        r.message = st.empty()
                        ? format("rank %d never reported it: the rank %s%s", rank,
                                 timed_out ? "made no progress for the timeout and " : "",
                                 signal_text(k.status).c_str())
                        : format("rank %d: %s", rank, m.message[static_cast<size_t>(rank)].c_str());
        break;
      }
    }
    if (r.status == Status::pass && all_skip) {
      r.status = Status::skip;
      r.message = m.message[0];
    }
    if (p.list) {
      std::printf("%s\n", r.name.c_str());
      continue;
    }
    report.add(r, stdout);
  }
  // A rank that crashed or timed out after its last line.
  for (const auto& k : kids)
    if (!p.list && !(WIFEXITED(k.status) && WEXITSTATUS(k.status) == 0)) {
      Result r;
      r.name = format("comm.rank[%s,rank %d]", p.child.plugin.c_str(), k.rank);
      r.suite = "comm";
      r.device = p.child.plugin;
      r.status = Status::fail;
      r.message = "the rank " + signal_text(k.status) +
                  (timed_out ? " (stopped after --timeout without progress)" : "");
      report.add(r, stdout);
    }
  if (p.list) return 0;
  report.print_summary(stdout);
  std::string err;
  if (!p.json.empty() && !report.write_json(p.json, &err))
    std::fprintf(stderr, "bp-conformance: %s\n", err.c_str());
  if (!p.junit.empty() && !report.write_junit(p.junit, &err))
    std::fprintf(stderr, "bp-conformance: %s\n", err.c_str());
  return report.failed() ? 1 : 0;
}

}  // namespace bpc
