// Note [Published allocator statistics]
//   bp-smi runs in a process of its own, so it cannot ask another program's allocators what they
//   hold. A program started with BACKPLANE_PUBLISH_STATS=1 writes, twice a second from a thread of
//   its own, <stats_publish_dir()>/<pid>.json: its pid, command name and per device the
//   allocator's allocated, reserved and peak bytes (the plugin's memory statistics). The thread
//   starts when the process's registry is created (after its plugins are loaded) and the file
//   is removed at normal exit; bp-smi --watch lists the files of live processes and ignores
//   (and removes) those of processes that are gone. Off (the default) nothing of this runs.
//   Without XDG_RUNTIME_DIR the folder is /tmp/backplane-stats-<uid>, a name anyone can take
//   first: it is used only as a private folder (Note [Private folders] in runtime/files.hpp),
//   and every file in any stats folder is opened relative to it with O_NOFOLLOW.
#include "runtime/files.hpp"
#include "runtime/registry.hpp"

#include <backplane/profiler.hpp>
#include <backplane/runtime.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace bp {

std::string stats_publish_dir() {
  if (const char* d = std::getenv("BACKPLANE_STATS_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x)
    return std::string(x) + "/backplane-stats";
  return "/tmp/backplane-stats-" + std::to_string(::getuid());
}

namespace detail {

namespace {

// The folder's descriptor and this process's file name in it.
int g_dir_fd = -1;
std::string& published_file() {
  static std::string* f = new std::string;
  return *f;
}

std::string command_name() {
  std::ifstream f("/proc/self/comm");
  std::string s;
  std::getline(f, s);
  return s;
}

void publish_once(Registry& reg, const std::string& name) {
  nlohmann::json devs = nlohmann::json::array();
  for (Device* d : reg.loaded_devices()) {
    MemoryStats m = d->memory_stats();
    devs.push_back({{"device", d->str()},
                    {"allocated", m.allocated},
                    {"reserved", m.reserved},
                    {"peak_allocated", m.peak_allocated},
                    {"num_allocs", m.num_allocs},
                    {"total_allocs", m.total_allocs}});
  }
  nlohmann::json fallbacks = nlohmann::json::array();  // Note [Fallback policy]
  for (const FallbackStats& f : fallback_stats())
    fallbacks.push_back({{"device", f.device},
                         {"op", f.op},
                         {"dtype", f.dtype},
                         {"action", f.action},
                         {"count", f.count},
                         {"bytes_copied", f.bytes_copied},
                         {"seconds", f.seconds}});
  nlohmann::json j = {
      {"pid", static_cast<int64_t>(::getpid())},
      {"command", name},
      {"time",
       std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
      {"devices", std::move(devs)},
      {"fallbacks", std::move(fallbacks)}};
  const std::string& name_in_dir = published_file();
  std::string tmp = name_in_dir + ".tmp";
  std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  ::unlinkat(g_dir_fd, tmp.c_str(), 0);
  int fd =
      ::openat(g_dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return;
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = ::close(fd) == 0 && ok;
  if (ok) ::renameat(g_dir_fd, tmp.c_str(), g_dir_fd, name_in_dir.c_str());
}

void remove_published() {
  ::unlinkat(g_dir_fd, published_file().c_str(), 0);
}

}  // namespace

void maybe_publish_stats(Registry& reg) {
  const char* on = std::getenv("BACKPLANE_PUBLISH_STATS");
  if (!on || std::string(on) != "1") return;
  std::string dir = stats_publish_dir();
  const char* chosen = std::getenv("BACKPLANE_STATS_DIR");
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  std::string why;
  if ((chosen && *chosen) || (xdg && *xdg)) {
    // A folder the user chose or their private runtime folder.
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    g_dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (g_dir_fd < 0) why = "cannot open " + dir + ": " + std::strerror(errno);
  } else {
    g_dir_fd = open_private_dir(dir, why);  // in /tmp: Note [Private folders]
  }
  if (g_dir_fd < 0) {
    std::fprintf(stderr, "backplane: BACKPLANE_PUBLISH_STATS: %s; not publishing\n", why.c_str());
    return;
  }
  published_file() = std::to_string(::getpid()) + ".json";
  std::string name = command_name();
  std::atexit(remove_published);
  std::thread([&reg, name] {
    for (;;) {
      try {
        publish_once(reg, name);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "backplane: BACKPLANE_PUBLISH_STATS: %s\n", e.what());
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  }).detach();
}

}  // namespace detail
}  // namespace bp
