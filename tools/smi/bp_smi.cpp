// bp-smi: every plugin Backplane considered (path, version, load decision or the reason it
// failed), the communicator plugins (the device types they serve, the library they found or
// why they cannot run), and every device (name, memory used/total, the backend serving it), the way
// nvidia-smi shows one vendor's GPUs. `--json` prints the same for scripts. `--watch [seconds]`
// redraws the device table every interval until interrupted, like `nvidia-smi -l`.
#include <backplane/abi/comm_abi.h>
#include <backplane/backplane.hpp>
#include <backplane/dist.hpp>

#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

namespace {

const char* status_name(bp::PluginReport::Status s) {
  switch (s) {
    case bp::PluginReport::Status::loaded:
      return "loaded";
    case bp::PluginReport::Status::failed:
      return "failed";
    case bp::PluginReport::Status::skipped:
      return "skipped";
  }
  return "?";
}

// The default device, or why it cannot be resolved (a bad BACKPLANE_DEVICE, say).
std::string default_device_or_error() {
  try {
    return bp::default_device().str();
  } catch (const bp::Error& e) {
    return std::string("error: ") + e.what();
  }
}

// A driver's or plugin's string for the terminal: control characters (an ESC starting a colour
// or cursor sequence) shown as '?', so a device name cannot rewrite the screen.
std::string printable(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return out;
}

std::string mib(uint64_t bytes) {
  return std::to_string(bytes >> 20) + "MiB";
}

struct DeviceRow {
  bp::Device* dev;
  uint64_t total, free_now;
  bp::MemoryStats stats;
};

std::vector<DeviceRow> device_rows() {
  std::vector<DeviceRow> rows;
  for (bp::Device* d : bp::devices()) {
    DeviceRow r{d, d->properties().total_memory, d->free_memory(), d->memory_stats()};
    rows.push_back(r);
  }
  return rows;
}

int print_json() {
  nlohmann::json j;
  const bp::PluginAbiVersion abi = bp::plugin_abi_version();
  j["abi"] = std::to_string(abi.major) + "." + std::to_string(abi.minor);
  j["plugins"] = nlohmann::json::array();
  for (const auto& r : bp::load_report()) {
    j["plugins"].push_back(
        {{"path", r.path},
         {"name", r.name},
         {"device_type", r.device_type},
         {"version", r.version},
         {"abi", std::to_string(r.abi_major) + "." + std::to_string(r.abi_minor)},
         {"status", status_name(r.status)},
         {"decision", r.decision},
         {"reason", r.reason},
         {"devices", r.device_count}});
  }
  j["comm_abi"] = std::to_string(BP_COMM_ABI_MAJOR) + "." + std::to_string(BP_COMM_ABI_MINOR);
  j["comm_plugins"] = nlohmann::json::array();
  for (const auto& r : bp::dist::comm_load_report()) {
    j["comm_plugins"].push_back(
        {{"path", r.path},
         {"name", r.name},
         {"device_types", r.device_types},
         {"version", r.version},
         {"abi", std::to_string(r.abi_major) + "." + std::to_string(r.abi_minor)},
         {"status", status_name(r.status)},
         {"decision", r.decision},
         {"available", r.available},
         {"library", r.library},
         {"capabilities", bp::dist::comm_capability_names(r.capabilities)},
         {"capability_note", r.capability_note},
         {"reason", r.reason}});
  }
  j["devices"] = nlohmann::json::array();
  for (const auto& row : device_rows()) {
    const bp::DeviceProperties& p = row.dev->properties();
    j["devices"].push_back({{"device", row.dev->str()},
                            {"backend", row.dev->backend_name()},
                            {"name", p.name},
                            {"vendor", p.vendor},
                            {"uuid", p.uuid},
                            {"pci_bus_id", p.pci_bus_id},
                            {"memory_total", row.total},
                            {"memory_used", row.total - std::min(row.total, row.free_now)},
                            {"memory_free", row.free_now},
                            {"backplane_allocated", row.stats.allocated},
                            {"backplane_reserved", row.stats.reserved},
                            {"compute_capability", std::to_string(p.compute_major) + "." +
                                                       std::to_string(p.compute_minor)},
                            {"cores", p.cores}});
  }
  j["default_device"] = default_device_or_error();
  std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return 0;
}

void print_devices(const std::vector<DeviceRow>& rows) {
  std::printf("  %-10s %-8s %-40s %22s %12s %12s\n", "device", "backend", "name",
              "memory used/total", "bp alloc", "bp reserved");
  for (const auto& row : rows) {
    const bp::DeviceProperties& p = row.dev->properties();
    uint64_t used = row.total - std::min(row.total, row.free_now);
    std::string mem = mib(used) + " / " + mib(row.total);
    std::printf("  %-10s %-8s %-40.40s %22s %12s %12s\n", row.dev->str().c_str(),
                row.dev->backend_name().c_str(), printable(p.name).c_str(), mem.c_str(),
                mib(row.stats.allocated).c_str(), mib(row.stats.reserved).c_str());
    if (!p.pci_bus_id.empty() || p.compute_major)
      std::printf("  %-10s %-8s bus %s, compute %d.%d, %d cores, %s\n", "", "",
                  p.pci_bus_id.c_str(), p.compute_major, p.compute_minor, p.cores, p.uuid.c_str());
  }
  if (rows.empty()) std::printf("  (none)\n");
}

// The allocator statistics other processes publish (Note [Published allocator statistics] in
// core/src/profiler/stats_publisher.cpp); files of processes that are gone are removed.
void print_published() {
  namespace fs = std::filesystem;
  const std::string dir = bp::stats_publish_dir();
  std::printf("  Backplane processes (BACKPLANE_PUBLISH_STATS=1, %s)\n", dir.c_str());
  std::printf("  %-8s %-16s %-10s %12s %12s %10s\n", "pid", "command", "device", "bp alloc",
              "bp reserved", "updated");
  int shown = 0;
  std::error_code ec;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // Only a folder of this user's, and only its regular files (a planted link or FIFO is
  // neither followed nor removed): Note [Private folders] in core/src/runtime/files.hpp.
  struct stat dst {};
  if (::lstat(dir.c_str(), &dst) == 0 && (!S_ISDIR(dst.st_mode) || dst.st_uid != ::geteuid())) {
    std::printf("  (not read: %s is not a directory of this user's)\n", dir.c_str());
    return;
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const fs::path& p = entry.path();
    if (p.extension() != ".json" || !entry.is_regular_file(ec) || entry.is_symlink(ec)) continue;
    char* end = nullptr;
    long pid = std::strtol(p.stem().c_str(), &end, 10);
    if (!end || *end || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      fs::remove(p, ec);  // its process is gone
      continue;
    }
    nlohmann::json j;
    try {
      std::ifstream f(p);
      j = nlohmann::json::parse(f);
      double age = now - j.at("time").get<double>();
      for (const auto& d : j.at("devices")) {
        std::printf("  %-8ld %-16.16s %-10s %12s %12s %8.1f s\n", pid,
                    j.at("command").get<std::string>().c_str(),
                    d.at("device").get<std::string>().c_str(),
                    mib(d.at("allocated").get<uint64_t>()).c_str(),
                    mib(d.at("reserved").get<uint64_t>()).c_str(), age);
        ++shown;
      }
      // Note [Fallback policy] in runtime.hpp: what the process ran as a fallback.
      if (j.contains("fallbacks"))
        for (const auto& f : j.at("fallbacks"))
          std::printf(
              "  %-8ld   fallback: %s %s (%s) x%llu, %llu bytes copied, %.3f ms: %s\n", pid,
              f.at("device").get<std::string>().c_str(), f.at("op").get<std::string>().c_str(),
              f.at("dtype").get<std::string>().c_str(),
              static_cast<unsigned long long>(f.at("count").get<uint64_t>()),
              static_cast<unsigned long long>(f.at("bytes_copied").get<uint64_t>()),
              f.at("seconds").get<double>() * 1e3, f.at("action").get<std::string>().c_str());
    } catch (const std::exception&) {
      continue;  // being replaced, or not ours
    }
  }
  if (!shown) std::printf("  (none: run a program with BACKPLANE_PUBLISH_STATS=1 to list it)\n");
}

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_interrupt(int) {
  g_stop = 1;
}

// Note [bp-smi --watch]: the device table every `seconds` until SIGINT or SIGTERM; on a terminal
// the screen is cleared before each table, otherwise tables follow each other, each opened by a
// line with the time. "memory used/total" is the device's (all processes); "bp alloc" and "bp
// reserved" are what this process's Backplane allocators hold; below, what other Backplane
// programs publish (BACKPLANE_PUBLISH_STATS=1). Exit status 0 when interrupted.
int watch(double seconds) {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const bool tty = isatty(STDOUT_FILENO) != 0;
  const auto period = std::chrono::duration<double>(seconds);
  for (int64_t n = 1; !g_stop; ++n) {
    auto rows = device_rows();
    std::time_t now = std::time(nullptr);
    char stamp[64];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
    if (tty) std::printf("\033[H\033[2J");
    std::printf("bp-smi --watch %g: %s, refresh %lld (Ctrl-C stops)\n", seconds, stamp,
                static_cast<long long>(n));
    print_devices(rows);
    print_published();
    std::printf("\n");
    std::fflush(stdout);
    auto until = std::chrono::steady_clock::now() + period;
    while (!g_stop && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("bp-smi: stopped\n");
  return 0;
}

int print_table() {
  const bp::PluginAbiVersion abi = bp::plugin_abi_version();
  std::printf("Backplane (plugin ABI %u.%u)\n\n", abi.major, abi.minor);
  std::printf("Plugins\n");
  for (const auto& r : bp::load_report()) {
    std::printf("  %-8s %-10s %s", status_name(r.status), r.name.empty() ? "-" : r.name.c_str(),
                r.path.c_str());
    if (!r.version.empty())
      std::printf("  (v%s, ABI %u.%u)", r.version.c_str(), r.abi_major, r.abi_minor);
    std::printf("\n");
    if (r.status == bp::PluginReport::Status::loaded)
      std::printf("           %d device(s)%s%s\n", r.device_count, r.reason.empty() ? "" : ": ",
                  r.reason.c_str());
    else
      std::printf("           %s\n", r.reason.c_str());
  }
  std::printf("\nCommunicator plugins (comm ABI %d.%d)\n", BP_COMM_ABI_MAJOR, BP_COMM_ABI_MINOR);
  auto comms = bp::dist::comm_load_report();
  for (const auto& r : comms) {
    std::string types;
    for (const auto& t : r.device_types) types += (types.empty() ? "" : ",") + t;
    std::printf("  %-8s %-10s %s", status_name(r.status), r.name.empty() ? "-" : r.name.c_str(),
                r.path.c_str());
    if (!r.version.empty())
      std::printf("  (v%s, comm ABI %u.%u)", r.version.c_str(), r.abi_major, r.abi_minor);
    std::printf("\n");
    if (r.status == bp::PluginReport::Status::loaded) {
      std::printf("           serves %s: %s\n", types.c_str(),
                  r.available ? r.library.c_str() : r.reason.c_str());
      std::printf("           can: %s%s%s\n",
                  bp::dist::comm_capability_names(r.capabilities).c_str(),
                  r.capability_note.empty() ? "" : " — ", r.capability_note.c_str());
    } else
      std::printf("           %s\n", r.reason.c_str());
  }
  if (comms.empty()) std::printf("  (none found)\n");
  auto rows = device_rows();
  std::printf("\nDevices\n");
  print_devices(rows);
  std::printf("\nDefault device: %s\n", default_device_or_error().c_str());
  return 0;
}

}  // namespace

namespace {

// Note [bp-smi in one pass]
//   bp-smi survives any plugin (Note [Plugin probes] in core/src/runtime/registry.cpp), but
//   probing each plugin in a child and then loading it again here opens every plugin twice, and
//   opening one can cost 0.1 s (PoCL maps LLVM). So the listing first runs once, in one child
//   process without probes, its stdout and stderr kept in memory files: when that child exits,
//   having finished its listing (a flag in memory shared with bp-smi, set just before it exits),
//   whatever its status, its output is bp-smi's. Only when it is killed by a signal (a plugin's
//   init crashed), ends without finishing (a plugin's init called exit(), or a sanitizer's
//   report ended it) or has not finished within the probe time (one hangs) does bp-smi list
//   again here, probing each plugin, which names the one that crashed, exited or hung. A user's
//   BACKPLANE_PROBE_PLUGINS and --watch keep the probing path.
bool copy_out(int from, int to) {
  if (::lseek(from, 0, SEEK_SET) != 0) return false;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(from, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = ::write(to, buf + off, static_cast<size_t>(n - off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      off += w;
    }
  }
}

std::optional<int> list_in_one_pass(bool json, double seconds) {
  const int out = ::memfd_create("bp-smi-stdout", MFD_CLOEXEC);
  const int err = ::memfd_create("bp-smi-stderr", MFD_CLOEXEC);
  void* shared =
      ::mmap(nullptr, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  auto* finished = shared == MAP_FAILED ? nullptr : static_cast<volatile int*>(shared);
  auto close_both = [&] {
    if (out >= 0) ::close(out);
    if (err >= 0) ::close(err);
    if (finished) ::munmap(shared, sizeof(int));
  };
  if (out < 0 || err < 0 || !finished) {
    close_both();
    return std::nullopt;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    close_both();
    return std::nullopt;
  }
  if (pid == 0) {
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::unsetenv("BACKPLANE_PROBE_PLUGINS");
    int rc = 1;
    try {
      rc = json ? print_json() : print_table();
    } catch (const bp::Error& e) {
      std::fprintf(stderr, "bp-smi: %s\n", e.what());
    }
    std::fflush(stdout);
    std::fflush(stderr);
    *finished = 1;
    ::_exit(rc);  // nothing of the plugins is torn down: the parent has the answer
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      close_both();
      return std::nullopt;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      close_both();
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::optional<int> rc;
  if (WIFEXITED(status) && *finished && copy_out(out, STDOUT_FILENO) &&
      copy_out(err, STDERR_FILENO))
    rc = WEXITSTATUS(status);
  close_both();
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  double watch_seconds = 0;  // 0: no --watch
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else if (!std::strcmp(argv[i], "--watch") || !std::strcmp(argv[i], "-l")) {
      watch_seconds = 2.0;
      if (i + 1 < argc && argv[i + 1][0] != '-') {
        char* end = nullptr;
        double v = std::strtod(argv[i + 1], &end);
        if (!end || *end || !(v >= 0.05 && v <= 86400)) {
          std::fprintf(stderr,
                       "bp-smi: --watch '%s' is not a number of seconds between 0.05 and 86400\n",
                       argv[i + 1]);
          return 2;
        }
        watch_seconds = v;
        ++i;
      }
    } else if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      std::printf(
          "usage: bp-smi [--json | --watch [seconds]]\n  Lists Backplane plugins (with load "
          "decisions), communicator plugins and devices (name, memory, backend).\n"
          "  --watch [seconds]  redraw the device table every interval (default 2) until Ctrl-C\n");
      return 0;
    } else {
      std::fprintf(stderr,
                   "bp-smi: unknown argument '%s' (expected --json, --watch [seconds] or --help)\n",
                   argv[i]);
      return 2;
    }
  }
  if (json && watch_seconds > 0) {
    std::fprintf(stderr, "bp-smi: --json and --watch do not go together; pick one\n");
    return 2;
  }
  // bp-smi survives any plugin: Note [bp-smi in one pass]; the environment may choose another
  // probe time.
  const char* chosen = std::getenv("BACKPLANE_PROBE_PLUGINS");
  if (watch_seconds == 0 && !(chosen && *chosen))
    if (std::optional<int> rc = list_in_one_pass(json, 10.0)) return *rc;
  ::setenv("BACKPLANE_PROBE_PLUGINS", "10", 0);
  try {
    if (watch_seconds > 0) return watch(watch_seconds);
    return json ? print_json() : print_table();
  } catch (const bp::Error& e) {
    std::fprintf(stderr, "bp-smi: %s\n", e.what());
    return 1;
  }
}
