// bp-run: starts N local processes of one program as the ranks of a process group (like
// torchrun), forwards their output line by line with a rank prefix, and stops the others with
// a clear message when one fails; its exit status is the failing rank's.
//
//   bp-run -n 4 ./train --epochs 3
//
// Note [bp-run rendezvous]
//   By default bp-run hosts the process group's TCP store itself, on 127.0.0.1 and a port the
//   kernel picks (port 0, so two runs never race for a port), and gives the ranks
//   BACKPLANE_INIT=tcp://127.0.0.1:<port> with BACKPLANE_STORE_HOSTED=1 and a fresh random
//   BACKPLANE_STORE_SECRET (one from bp-run's environment is used instead; several hosts need
//   the same one, so --nnodes > 1 with a tcp:// --init requires it). A store hosted by the
//   launcher outlives any rank, so the others learn at once that one died (its connection
//   closed). --init file:///dir or tcp://host:port hands the ranks that address instead (rank 0
//   then hosts a tcp:// store), which is how several hosts meet: one bp-run per host with
//   --nnodes and --node-rank.
#include <backplane/dist_store.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

const char* kUsage =
    "usage: bp-run -n N [options] program [args...]\n"
    "\n"
    "Starts N processes of `program` as ranks of one Backplane process group (like torchrun).\n"
    "Each gets BACKPLANE_RANK, BACKPLANE_WORLD_SIZE, BACKPLANE_LOCAL_RANK,\n"
    "BACKPLANE_LOCAL_WORLD_SIZE and BACKPLANE_INIT; their output is forwarded line by line\n"
    "as '[rank R] ...'. When a rank fails, the others are stopped (SIGTERM, then SIGKILL after\n"
    "--grace seconds) and bp-run exits with the failing rank's status (128+signal for a\n"
    "signal).\n"
    "\n"
    "  -n, --nproc N        processes on this host (required)\n"
    "  --nnodes M           hosts taking part, each running one bp-run (default 1)\n"
    "  --node-rank K        this host's index 0..M-1 (default 0): ranks K*N .. K*N+N-1\n"
    "  --init URL           the rendezvous: file:///shared/dir or tcp://host:port (needed when\n"
    "                       --nnodes > 1); default: bp-run hosts a TCP store on 127.0.0.1\n"
    "  --timeout S          BACKPLANE_DIST_TIMEOUT for the ranks, in seconds\n"
    "  --grace S            seconds between SIGTERM and SIGKILL when stopping ranks, 0 to 3600\n"
    "                       (default 5)\n"
    "  --no-prefix          forward output without the '[rank R] ' prefix\n"
    "  --keep-going         do not stop the other ranks when one fails (each ends by its\n"
    "                       own errors or timeouts); the exit status is still the first\n"
    "                       failure's\n"
    "  -h, --help           this text\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "bp-run: %s\n\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

int parse_count(const std::string& s, const char* what, int min) {
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end || v < min || v > 100000)
    usage_error(std::string(what) + " needs an integer >= " + std::to_string(min) + ", got '" + s +
                "'");
  return static_cast<int>(v);
}

// A number of seconds in [min, max] (inclusive) or a usage error naming the option.
double parse_seconds(const std::string& s, const char* what, double min, double max,
                     bool min_inclusive) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  bool in_range = min_inclusive ? v >= min : v > min;
  if (s.empty() || *end || errno || !(in_range && v <= max))
    usage_error(std::string(what) + " needs a number of seconds " + (min_inclusive ? ">= " : "> ") +
                std::to_string(static_cast<int>(min)) +
                " and <= " + std::to_string(static_cast<int>(max)) + ", got '" + s + "'");
  return v;
}

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out = -1, err = -1;  // read ends
  std::string out_buf, err_buf;
  bool exited = false;
  int status = 0;
};

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) {
  g_signal = sig;
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Note [Forwarding output]
//   A rank's output is forwarded a line at a time with its prefix; '\r' ends a line too, so a
//   progress bar redrawn with '\r' shows as it goes. Only the bytes that arrived are scanned,
//   and a line longer than kMaxLine (binary data, a huge line) is forwarded in pieces of that
//   size, so the launcher's memory and time stay linear and bounded whatever a rank writes.
constexpr size_t kMaxLine = 64 * 1024;

// Forwards the complete lines of `buf` to `fd` with the prefix, and the rest too when it reached
// kMaxLine or with `flush`. `buf` holds only an unfinished line before new bytes are appended.
void forward(std::string& buf, size_t scanned, int fd, const std::string& prefix, bool flush) {
  size_t start = 0;
  for (size_t i = scanned; i < buf.size(); ++i) {
    char ch = buf[i];
    if (ch == '\r' && i + 1 < buf.size() && buf[i + 1] == '\n') continue;  // "\r\n" is one end
    if (ch != '\n' && ch != '\r' && i + 1 - start < kMaxLine) continue;
    std::string piece = buf.substr(start, i + 1 - start);
    if (ch != '\n' && ch != '\r') piece += '\n';
    write_all(fd, prefix + piece);
    start = i + 1;
  }
  buf.erase(0, start);
  if (flush && !buf.empty()) {
    write_all(fd, prefix + buf + "\n");
    buf.clear();
  }
}

// Stops and reaps the first `count` children (a start that failed half-way): SIGKILL, as
// they have not got far enough to need a grace period, then waitpid so none is orphaned.
void stop_started(std::vector<Child>& children, int count) {
  for (int k = 0; k < count; ++k) {
    Child& c = children[static_cast<size_t>(k)];
    ::kill(-c.pid, SIGKILL);
    ::kill(c.pid, SIGKILL);
  }
  for (int k = 0; k < count; ++k) {
    Child& c = children[static_cast<size_t>(k)];
    int status = 0;
    while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (c.out >= 0) ::close(c.out);
    if (c.err >= 0) ::close(c.err);
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  return "stopped";
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = 0, nnodes = 1, node_rank = 0;
  double grace = 5;
  std::string init, timeout;
  bool prefix = true, keep_going = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> std::string {
      std::string n = name;
      if (a.size() > n.size() && a.compare(0, n.size() + 1, n + "=") == 0)
        return a.substr(n.size() + 1);
      if (i + 1 >= argc) usage_error(n + " needs a value");
      return argv[++i];
    };
    auto is = [&](const char* name) {
      std::string n = name;
      return a == n || a.rfind(n + "=", 0) == 0;
    };
    if (a == "-h" || a == "--help") {
      std::printf("%s", kUsage);
      return 0;
    } else if (is("-n") || is("--nproc")) {
      nproc = parse_count(value(a.rfind("--", 0) == 0 ? "--nproc" : "-n"), "-n", 1);
    } else if (is("--nnodes")) {
      nnodes = parse_count(value("--nnodes"), "--nnodes", 1);
    } else if (is("--node-rank")) {
      node_rank = parse_count(value("--node-rank"), "--node-rank", 0);
    } else if (is("--init")) {
      init = value("--init");
    } else if (is("--timeout")) {
      timeout = value("--timeout");
      parse_seconds(timeout, "--timeout", 0, 31536000, false);
    } else if (is("--grace")) {
      grace = parse_seconds(value("--grace"), "--grace", 0, 3600, true);
    } else if (a == "--no-prefix") {
      prefix = false;
    } else if (a == "--keep-going") {
      keep_going = true;
    } else if (a == "--") {
      ++i;
      break;
    } else if (!a.empty() && a[0] == '-') {
      usage_error("unknown option '" + a + "'");
    } else {
      break;
    }
  }
  if (nproc < 1) usage_error("-n N is required");
  if (i >= argc) usage_error("no program to run");
  if (node_rank >= nnodes)
    usage_error("--node-rank " + std::to_string(node_rank) + " is not below --nnodes " +
                std::to_string(nnodes));
  if (nnodes > 1 && init.empty())
    usage_error(
        "--nnodes > 1 needs --init tcp://host:port (or file:///shared/dir) that every "
        "host can reach");

  if (!init.empty() && init.rfind("tcp://", 0) != 0 && init.rfind("file:///", 0) != 0)
    usage_error("--init needs tcp://host:port or file:///absolute/dir, got '" + init + "'");

  // The store (Note [bp-run rendezvous]).
  std::unique_ptr<bp::dist::TcpStoreServer> server;
  bool hosted = false;
  std::string secret;
  if (const char* s = std::getenv("BACKPLANE_STORE_SECRET"); s && *s) secret = s;
  if (secret.empty() && nnodes > 1 && init.rfind("tcp://", 0) == 0)
    usage_error(
        "--nnodes > 1 with a tcp:// --init needs BACKPLANE_STORE_SECRET (16 to 1024 characters, "
        "the same on every host, e.g. from `openssl rand -hex 16`)");
  if (init.empty()) {
    try {
      if (secret.empty()) secret = bp::dist::generate_store_secret();
      server = std::make_unique<bp::dist::TcpStoreServer>("127.0.0.1", 0, secret);
    } catch (const bp::Error& e) {
      std::fprintf(stderr, "bp-run: %s\n", e.what());
      return 1;
    }
    init = "tcp://127.0.0.1:" + std::to_string(server->port());
    hosted = true;
  }

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (secret.empty() && init.rfind("tcp://", 0) == 0) {
    try {
      secret = bp::dist::generate_store_secret();
    } catch (const bp::Error& e) {
      std::fprintf(stderr, "bp-run: %s\n", e.what());
      return 1;
    }
  }

  int world = nproc * nnodes;
  std::vector<Child> children(static_cast<size_t>(nproc));
  for (int local = 0; local < nproc; ++local) {
    Child& c = children[static_cast<size_t>(local)];
    c.rank = node_rank * nproc + local;
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    const char* failed = nullptr;
    pid_t pid = -1;
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
      failed = "pipe";
    else if ((pid = ::fork()) < 0)
      failed = "fork";
    if (failed) {
      int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1]})
        if (fd >= 0) ::close(fd);
      std::fprintf(stderr, "bp-run: %s failed for rank %d: %s; stopping the %d rank(s) started\n",
                   failed, c.rank, std::strerror(e), local);
      stop_started(children, local);
      return 1;
    }
    if (pid == 0) {
      ::setpgid(0, 0);  // its own process group: stopping a rank stops what it started
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      setenv("BACKPLANE_RANK", std::to_string(c.rank).c_str(), 1);
      setenv("BACKPLANE_WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("BACKPLANE_LOCAL_RANK", std::to_string(local).c_str(), 1);
      setenv("BACKPLANE_LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("BACKPLANE_INIT", init.c_str(), 1);
      if (hosted)
        setenv("BACKPLANE_STORE_HOSTED", "1", 1);
      else
        unsetenv("BACKPLANE_STORE_HOSTED");
      if (!timeout.empty()) setenv("BACKPLANE_DIST_TIMEOUT", timeout.c_str(), 1);
      if (!secret.empty()) setenv("BACKPLANE_STORE_SECRET", secret.c_str(), 1);
      ::execvp(argv[i], argv + i);
      std::fprintf(stderr, "bp-run: cannot run '%s': %s\n", argv[i], std::strerror(errno));
      ::_exit(127);
    }
    ::setpgid(pid, pid);
    ::close(out[1]);
    ::close(err[1]);
    c.pid = pid;
    c.out = out[0];
    c.err = err[0];
  }

  int first_failure = -1;  // index into children
  int result = 0;
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  bool killed = false;
  auto all_exited_at = std::chrono::steady_clock::time_point::max();
  auto stop_others = [&](const std::string& why) {
    if (stopping) return;
    stopping = true;
    std::string msg = "bp-run: " + why + "; stopping the other ranks\n";
    write_all(2, msg);
    for (auto& c : children)
      if (!c.exited) ::kill(-c.pid, SIGTERM);
    stop_deadline = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(grace * 1000));
  };

  for (;;) {
    if (g_signal && !stopping) {
      result = 128 + g_signal;
      stop_others("received signal " + std::to_string(g_signal) + " (" + strsignal(g_signal) + ")");
    }
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, bool>> owners;  // (child, is_err)
    for (auto& c : children) {
      if (c.out >= 0) {
        fds.push_back({c.out, POLLIN, 0});
        owners.push_back({&c, false});
      }
      if (c.err >= 0) {
        fds.push_back({c.err, POLLIN, 0});
        owners.push_back({&c, true});
      }
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!fds[k].revents) continue;
      Child& c = *owners[k].first;
      bool is_err = owners[k].second;
      std::string& buf = is_err ? c.err_buf : c.out_buf;
      std::string pre = prefix ? "[rank " + std::to_string(c.rank) + "] " : "";
      char tmp[65536];
      ssize_t n = ::read(fds[k].fd, tmp, sizeof tmp);
      if (n > 0) {
        size_t scanned = buf.size();
        buf.append(tmp, static_cast<size_t>(n));
        forward(buf, scanned, is_err ? 2 : 1, pre, false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        forward(buf, buf.size(), is_err ? 2 : 1, pre, true);
        ::close(fds[k].fd);
        (is_err ? c.err : c.out) = -1;
      }
    }
    // Reap.
    for (auto& c : children) {
      if (c.exited) continue;
      int status = 0;
      pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r != c.pid) continue;
      c.exited = true;
      c.status = status;
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && keep_going) {
        write_all(2, "bp-run: rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) +
                         ") " + describe_status(status) + "\n");
        if (first_failure < 0) {
          first_failure = static_cast<int>(&c - children.data());
          result = exit_code(status);
        }
      } else if (!ok && !stopping) {
        first_failure = static_cast<int>(&c - children.data());
        result = exit_code(status);
        stop_others("rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) + ") " +
                    describe_status(status));
      } else if (!ok && stopping && first_failure >= 0) {
        write_all(2,
                  "bp-run: rank " + std::to_string(c.rank) + " " + describe_status(status) + "\n");
      }
    }
    bool all_exited = true, pipes_open = false;
    for (auto& c : children) {
      all_exited = all_exited && c.exited;
      pipes_open = pipes_open || c.out >= 0 || c.err >= 0;
    }
    if (all_exited && !pipes_open) break;
    if (stopping && !killed && std::chrono::steady_clock::now() >= stop_deadline) {
      killed = true;
      for (auto& c : children)
        if (!c.exited) {
          write_all(2, "bp-run: rank " + std::to_string(c.rank) + " did not stop within " +
                           std::to_string(grace) + " s; killing it\n");
          ::kill(-c.pid, SIGKILL);
        }
    }
    auto now = std::chrono::steady_clock::now();
    if (all_exited && all_exited_at == std::chrono::steady_clock::time_point::max())
      all_exited_at = now;
    if (all_exited && pipes_open && now - all_exited_at > std::chrono::seconds(2)) {
      // Processes the ranks started still hold the pipes: do not wait for them forever.
      for (auto& c : children) {
        if (c.out >= 0) ::close(c.out);
        if (c.err >= 0) ::close(c.err);
        c.out = c.err = -1;
      }
    }
  }
  if (first_failure >= 0) {
    const Child& c = children[static_cast<size_t>(first_failure)];
    write_all(2, "bp-run: failed: rank " + std::to_string(c.rank) + " " +
                     describe_status(c.status) + "\n");
  }
  return result;
}
