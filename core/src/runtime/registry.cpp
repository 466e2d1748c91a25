// Plugin discovery, loading and the load report (Note [Plugin search order] in runtime.hpp).
//
// Note [Plugin lifetime]
//   Plugin libraries are opened with RTLD_NOW | RTLD_LOCAL, once per process whichever
//   registries ask for them (load_library keeps the table of opened libraries), initialised
//   once, and never closed: buffers, streams and kernels they created may be referenced until
//   process exit, and unloading a GPU driver stack while anything is alive is a crash. The
//   process default registry is never destroyed for the same reason (no static-destruction-order
//   hazards at exit); another registry, when destroyed, synchronises and destroys its devices'
//   streams, and its libraries stay open. A plugin that reports no device is told to release
//   what its init loaded (its shutdown slot) at once, since nothing of it can be used.
//
// Note [Plugin table checks]
//   check_plugin_table() is everything the loader verifies in a table before it calls init():
//   the table is large enough to hold the identity fields, the major version is the host's, the
//   table holds every minor-0 slot and each required one is set, the five event slots are all
//   set or all NULL, the size fits the declared minor (it holds every slot of that minor, and
//   a table of a minor the host knows is no larger than the host's; one of a newer minor is at
//   most 64 KiB: a hostile size would make the host read past the table), and the device type
//   is a valid device-string prefix. It reads fields in
//   that order and never past struct_size, so a truncated or hostile table gives a reason, not
//   a crash; tests/fuzz/fuzz_plugin_table.cpp feeds it arbitrary tables.
//
// Note [Exit]
//   At exit (return from main, exit(), Python's SystemExit) the C library runs the exit handlers
//   and the static destructors of every loaded library in the reverse order of their
//   registration. Work still queued on a device may be running on a plugin's own threads then:
//   PoCL compiles a kernel with LLVM and clang on its worker thread at the first launch, and the
//   compiler's statics (some made on that first compile, so registered last and destroyed first)
//   vanished under it (a crash in llvm::vfs::FileSystem::exists). No exit handler can be
//   registered late enough to run before all of them, but glibc's exit() runs the calling
//   thread's thread_local destructors before any exit handler. So the first slow-path call on
//   the process's main thread (the registry's creation, a device's default stream, a kernel
//   lookup) arms a thread_local guard there whose destructor waits for the work queued on every
//   live stream of every device (finish_queued_work, errors dropped); the main thread's
//   thread_local destructors run only when the process exits. For exit() called from another
//   thread, an exit handler does the same; it is registered once every plugin and its
//   dependencies were loaded, and again after each kernel lookup (where a compiler such as
//   PoCL's builds the program and makes its statics), so it runs before the destructors of
//   everything made until then; statics a compile on the plugin's thread makes later may still
//   go first in that case.
#include "runtime/registry.hpp"
#include "runtime/config_internal.hpp"
#include "runtime/fallback.hpp"
#include "runtime/files.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

namespace bp::detail {

namespace fs = std::filesystem;

std::string library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&library_dir), &info) && info.dli_fname) {
    std::error_code ec;
    fs::path p = fs::canonical(info.dli_fname, ec);
    if (!ec) return p.parent_path().string();
  }
  return "";
}

// "libbackplane-cuda.so" -> "cuda"; "" when the file name does not follow the pattern.
std::string plugin_name_from_file(const std::string& path) {
  std::string f = fs::path(path).filename().string();
  const std::string prefix = "libbackplane-", suffix = ".so";
  if (f.size() <= prefix.size() + suffix.size() || f.rfind(prefix, 0) != 0 ||
      f.compare(f.size() - suffix.size(), suffix.size(), suffix) != 0)
    return "";
  return f.substr(prefix.size(), f.size() - prefix.size() - suffix.size());
}

bool is_elf_file(const std::string& path, std::string& why) {
  // O_NONBLOCK: opening a FIFO without a writer must not block (it is refused just below).
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    why = std::string("cannot be opened for reading: ") + std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = std::string("not a regular file (") + file_kind(st.st_mode) + ")";
    ::close(fd);
    return false;
  }
  char magic[4] = {};
  ssize_t got = ::pread(fd, magic, 4, 0);
  ::close(fd);
  if (got < 4 || std::memcmp(magic,
                             "\x7f"
                             "ELF",
                             4) != 0) {
    why = "not an ELF shared object";
    return false;
  }
  return true;
}

// Turns dlerror()'s text into "dependency libfoo.so.1 not found" when that is what it says.
std::string explain_dlerror(const std::string& path, const std::string& err) {
  const std::string marker = ": cannot open shared object file";
  size_t pos = err.find(marker);
  if (pos != std::string::npos) {
    std::string lib = err.substr(0, pos);
    size_t colon = lib.rfind(": ");
    if (colon != std::string::npos) lib = lib.substr(colon + 2);
    if (lib != path && fs::path(lib).filename() != fs::path(path).filename())
      return "dependency " + lib + " not found (" + err + ")";
  }
  return "dlopen failed: " + err;
}

void* open_library(const std::string& path, const char* entry_symbol, const char* hint,
                   void** out_entry, std::string& reason) {
  *out_entry = nullptr;
  if (!is_elf_file(path, reason)) return nullptr;
  dlerror();
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    reason = explain_dlerror(path, e ? e : "unknown error");
    return nullptr;
  }
  *out_entry = dlsym(h, entry_symbol);
  if (!*out_entry) {
    reason = "missing entry symbol " + std::string(entry_symbol) + " (" + hint + ")";
    dlclose(h);
    return nullptr;
  }
  return h;
}

bool is_comm_plugin_name(const std::string& name) {
  return name.rfind("comm-", 0) == 0;
}

std::vector<std::string> plugin_search_entries() {
  std::vector<std::string> entries = RegistryOptions::from_environment().plugin_paths;
  std::string own = library_dir();
  if (!own.empty()) entries.push_back(own + "/backplane/plugins");
  return entries;
}

namespace {

// A device plugin's name from its file name; communicator plugins (libbackplane-comm-*.so) have
// a report of their own (comm_registry.cpp), so they give "".
std::string name_from_file(const fs::path& p) {
  std::string name = plugin_name_from_file(p.string());
  return is_comm_plugin_name(name) ? "" : name;
}

bool valid_type(const char* t) {
  if (!t || !*t || !(*t >= 'a' && *t <= 'z')) return false;
  for (const char* c = t; *c; ++c)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return false;
  return true;
}

// Required slots of a minor-0 table, by name, for the report.
const char* missing_required_slot(const bp_plugin_api* a) {
#define BP_REQUIRE(slot) \
  if (!a->slot) return #slot;
  BP_PLUGIN_REQUIRED_SLOTS(BP_REQUIRE)
#undef BP_REQUIRE
  return nullptr;
}

std::string version_string(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

// A library opened and checked once (Note [Plugin lifetime]).
struct OpenedLibrary {
  void* handle;
  PluginReport report;       // as the first load saw it
  const bp_plugin_api* api;  // nullptr when init failed
};
std::mutex g_libraries_mutex;
std::vector<OpenedLibrary>& opened_libraries() {         // guarded by g_libraries_mutex
  static auto* libs = new std::vector<OpenedLibrary>();  // never destroyed
  return *libs;
}

}  // namespace

std::string check_plugin_table(const bp_plugin_api* api, PluginReport& r) {
  constexpr size_t kMinor0Size = BP_API_MINOR1_OFFSET;
  if (api->struct_size < offsetof(bp_plugin_api, version) + sizeof(api->version))
    return "plugin table is too small (" + std::to_string(api->struct_size) + " bytes)";
  r.abi_major = api->abi_major;
  r.abi_minor = api->abi_minor;
  r.name = api->name ? api->name : "";
  r.device_type = api->device_type ? api->device_type : "";
  r.version = api->version ? api->version : "";
  if (api->abi_major != BP_ABI_MAJOR)
    return "ABI " + version_string(api->abi_major, api->abi_minor) + " vs host " +
           version_string(BP_ABI_MAJOR, BP_ABI_MINOR) +
           ": major versions differ; rebuild the plugin against this Backplane";
  if (api->struct_size < kMinor0Size)
    return "plugin table of " + std::to_string(api->struct_size) +
           " bytes is smaller than ABI 1.0 requires (" + std::to_string(kMinor0Size) + ")";
  // Where each minor's table ends (minors 4, 5, 7 and 8 appended ops and attributes, no slot).
  const size_t minor_end[] = {BP_API_MINOR1_OFFSET,  BP_API_MINOR2_OFFSET,  BP_API_MINOR3_OFFSET,
                              BP_API_MINOR6_OFFSET,  BP_API_MINOR6_OFFSET,  BP_API_MINOR6_OFFSET,
                              sizeof(bp_plugin_api), sizeof(bp_plugin_api), sizeof(bp_plugin_api)};
  static_assert(BP_ABI_MINOR == 8, "a new minor adds its end to minor_end");
  const uint32_t known = std::min<uint32_t>(api->abi_minor, BP_ABI_MINOR);
  const size_t most = api->abi_minor <= BP_ABI_MINOR ? sizeof(bp_plugin_api) : size_t{64} << 10;
  if (api->struct_size < minor_end[known] || api->struct_size > most)
    return "plugin table of " + std::to_string(api->struct_size) + " bytes does not fit ABI " +
           version_string(api->abi_major, api->abi_minor) + " (" +
           std::to_string(minor_end[known]) + " to " + std::to_string(most) + " bytes)";
  if (const char* slot = missing_required_slot(api))
    return std::string("required slot '") + slot + "' is NULL";
  bool ev_any = api->event_create || api->event_destroy || api->event_record ||
                api->stream_wait_event || api->event_synchronize;
  bool ev_all = api->event_create && api->event_destroy && api->event_record &&
                api->stream_wait_event && api->event_synchronize;
  if (ev_any && !ev_all) return "event slots must be all set or all NULL";
  if (!valid_type(api->device_type))
    return "device type '" + r.device_type + "' is not lower-case [a-z][a-z0-9_]*";
  return "";
}

PluginReport load_library(const std::string& path, const bp_plugin_api** out_api) {
  *out_api = nullptr;
  PluginReport r;
  r.path = path;
  r.status = PluginReport::Status::failed;
  r.decision = "failed";
  void* entry = nullptr;
  void* h =
      open_library(path, BP_PLUGIN_ENTRY_SYMBOL,
                   "is it a Backplane plugin built with BP_SDK_DEFINE_PLUGIN or exporting it?",
                   &entry, r.reason);
  if (!h) return r;
  auto get = reinterpret_cast<bp_plugin_get_api_fn>(entry);
  std::lock_guard<std::mutex> lock(g_libraries_mutex);
  for (const OpenedLibrary& lib : opened_libraries()) {
    if (lib.handle != h) continue;
    dlclose(h);  // drops this call's reference; the first one keeps the library open
    PluginReport again = lib.report;
    again.path = path;
    *out_api = lib.api;
    return again;
  }
  const bp_plugin_api* api = get(BP_ABI_MAJOR, BP_ABI_MINOR);
  if (!api) {
    r.reason = std::string(BP_PLUGIN_ENTRY_SYMBOL) + " returned no table for host ABI " +
               version_string(BP_ABI_MAJOR, BP_ABI_MINOR);
    dlclose(h);
    return r;
  }
  r.reason = check_plugin_table(api, r);
  if (!r.reason.empty()) {
    dlclose(h);
    return r;
  }
  if (bp_error* e = api->init()) {
    r.reason = std::string("init failed: ") + (e->message ? e->message : "");
    if (e->native_name && *e->native_name) r.reason += std::string(" [") + e->native_name + "]";
    api->error_free(e);
    // Not closed: init may have started threads or loaded drivers (Note [Plugin lifetime]).
    opened_libraries().push_back({h, r, nullptr});
    return r;
  }
  const char* reason = "";
  int32_t n = api->device_count(&reason);
  r.device_count = n < 0 ? 0 : n;
  if (r.device_count == 0) {
    r.reason = std::string("0 devices because ") + (reason && *reason ? reason : "none found");
    if (api->shutdown) api->shutdown();  // Note [Plugin lifetime]
  }
  r.status = PluginReport::Status::loaded;
  r.decision = "loaded";
  opened_libraries().push_back({h, r, api});
  *out_api = api;
  return r;
}

// Note [Plugin probes]
//   A plugin's init runs in the process that loads it, so one that crashes, aborts or loops
//   takes that process with it; BACKPLANE_PLUGINS (an allow list) or plugins.deny keeps it out.
//   A tool that must survive any plugin (bp-smi) sets RegistryOptions::probe_seconds: each
//   plugin is then loaded first in a forked child that exits at once, and one whose child was
//   killed by a signal, ended the process itself (exit() in init, or a sanitizer's report) or
//   was still running after the time is reported ("init crashed with SIGSEGV", "init ended
//   the process with exit status 1", "init did not return within 10 s") and not loaded in the
//   process. A fork without
//   exec copies only the calling thread, hence "for single-threaded tools".
std::string probe_in_child(const std::string& path, double seconds) {
  pid_t pid = ::fork();
  if (pid < 0) return "";  // cannot probe: load as usual
  if (pid == 0) {
    const bp_plugin_api* api = nullptr;
    (void)load_library(path, &api);
    ::_exit(0);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  const std::string advice =
      " in a probe process; not loaded (leave it out with BACKPLANE_PLUGINS or plugins.deny)";
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return "";
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      char text[32];
      std::snprintf(text, sizeof text, "%g", seconds);
      return std::string("init did not return within ") + text + " s" + advice;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status))
    return WEXITSTATUS(status) == 0 ? ""
                                    : "init ended the process with exit status " +
                                          std::to_string(WEXITSTATUS(status)) + advice;
  if (!WIFSIGNALED(status)) return "";
  const int sig = WTERMSIG(status);
  const char* abbrev = ::sigabbrev_np(sig);
  return "init crashed with SIG" + std::string(abbrev ? abbrev : std::to_string(sig).c_str()) +
         " (" + ::strsignal(sig) + ")" + advice;
}

RegistryOptions options_from(const Config& c) {
  RegistryOptions o;
  o.plugin_paths = env_plugin_path();
  for (const auto& p : c.plugin_paths) o.plugin_paths.push_back(p);
  o.allow = c.allow;
  o.deny = c.deny;
  o.default_device = c.default_device;
  const char* env = std::getenv("BACKPLANE_DEVICE");
  o.default_device_origin = env && *env ? "BACKPLANE_DEVICE" : "config file " + c.source;
  if (const char* v = std::getenv("BACKPLANE_PROBE_PLUGINS"); v && *v) {
    char* end = nullptr;
    double sec = std::strtod(v, &end);
    if (*end || !(sec >= 0.1 && sec <= 3600))
      throw IOError("BACKPLANE_PROBE_PLUGINS='" + std::string(v).substr(0, 64) +
                    "' is not a number of seconds from 0.1 to 3600");
    o.probe_seconds = sec;
  }
  return o;
}

// ---- RegistryState ---------------------------------------------------------------------------

// Note [Loading on demand]
//   Opening a plugin costs what its library and its dependencies cost to map and initialise (the
//   CUDA runtime and a driver probe, an OpenCL ICD loader that opens every vendor's library), so
//   a registry opens none when it is made. Its constructor only lists the candidate files of the
//   search order, applies the allow and deny lists, and learns from each file name
//   (libbackplane-<type>.so) or from a manifest beside it (<file>.manifest holding
//   `device_type = "npu"`, for files named otherwise) which device type it announces. A plugin
//   is opened when a device of its type is first asked for (device, try_device, num_devices,
//   all_devices, is_available; the default device too), and every candidate is opened when
//   something lists everything: devices(), report(), load_report(), load_plugins(), bp-smi,
//   bp-conformance. Within a type the search order still decides: the first candidate that
//   loads wins and later ones are skipped unopened. A candidate whose type is unknown is opened
//   with any type asked for; a type that no candidate announces opens all of them (a plugin
//   whose file name does not say its type is still found, on that slower path).
//   Threads: loading is serialised by load_mu; `candidates` never grows after construction and
//   each candidate's plugin pointer is published once with release order, so lookups of loaded
//   plugins (plugin_for_type, devices) take no lock.
void RegistryState::register_plugin(Candidate& c, PluginReport& r, const bp_plugin_api* a) {
  auto p = std::make_unique<Plugin>();
  p->path = r.path;
  p->api = a;
  p->registry = this;
  // Note [ABI versioning]: a minor-2 slot is read only when the table declares minor 2 and
  // its struct_size covers the slot.
  p->has_minor2 = BP_API_HAS_SLOT(a, 2, find_kernel_id);
  if (BP_API_HAS_SLOT(a, 2, buffer_native)) p->native.buffer_native = a->buffer_native;
  if (BP_API_HAS_SLOT(a, 2, stream_native)) p->native.stream_native = a->stream_native;
  if (BP_API_HAS_SLOT(a, 2, buffer_import)) p->native.buffer_import = a->buffer_import;
  if (BP_API_HAS_SLOT(a, 2, stream_import)) p->native.stream_import = a->stream_import;
  // Note [Native graphs]: all five slots or none; a partial set is treated as none.
  if (BP_API_HAS_SLOT(a, 3, graph_destroy) && a->graph_begin_capture && a->graph_end_capture &&
      a->graph_instantiate && a->graph_launch && a->graph_destroy)
    p->graph = {a->graph_begin_capture, a->graph_end_capture, a->graph_instantiate, a->graph_launch,
                a->graph_destroy};
  p->no_devices_reason = r.device_count == 0 ? r.reason : "";
  try {
    for (int i = 0; i < r.device_count; ++i)
      p->devices.push_back(Access::make_device(std::make_unique<DeviceState>(*p, i)));
  } catch (const Error& e) {
    p->devices.clear();
    r.status = PluginReport::Status::failed;
    r.decision = "failed";
    r.reason = std::string("reading device properties failed: ") + e.what();
    r.device_count = 0;
    p->no_devices_reason = r.reason;
  }
  c.plugin.store(p.get(), std::memory_order_release);
  owned.push_back(std::move(p));
}

void RegistryState::load_candidate(Candidate& c) {
  if (c.done.load(std::memory_order_relaxed)) return;
  PluginReport& line = report[c.line];
  auto skip = [&](std::string reason) {
    line.status = PluginReport::Status::skipped;
    line.decision = "skipped";
    line.reason = std::move(reason);
    c.done.store(true, std::memory_order_release);
  };
  for (const Candidate& o : candidates) {
    const Plugin* p = o.plugin.load(std::memory_order_acquire);
    if (!p || &o == &c) continue;
    if (!c.name.empty() && p->api->name && c.name == p->api->name)
      return skip("shadowed by " + p->path + " (earlier in the search order)");
    if (!c.type.empty() && c.type == p->api->device_type)
      return skip("device type '" + c.type + "' is already served by another plugin (" + p->path +
                  ")");
  }
  if (options.probe_seconds > 0) {  // Note [Plugin probes]
    std::string why = probe_in_child(c.path, options.probe_seconds);
    if (!why.empty()) {
      line.status = PluginReport::Status::failed;
      line.decision = "failed";
      line.reason = std::move(why);
      c.done.store(true, std::memory_order_release);
      return;
    }
  }
  const bp_plugin_api* api = nullptr;
  PluginReport r = load_library(c.path, &api);
  if (r.status == PluginReport::Status::loaded) {
    if (plugin_for_type(r.device_type)) {
      r.status = PluginReport::Status::skipped;
      r.decision = "skipped";
      r.reason = "device type '" + r.device_type + "' is already served by another plugin";
    } else {
      register_plugin(c, r, api);
    }
    // Note [Exit]: after this plugin and its dependencies were loaded.
    std::atexit(finish_queued_work_at_exit);
  }
  if (!c.manifest_error.empty())
    r.reason +=
        (r.reason.empty() ? "manifest ignored: " : "; manifest ignored: ") + c.manifest_error;
  line = std::move(r);
  c.done.store(true, std::memory_order_release);
}

void RegistryState::ensure_type(std::string_view type) {
  if (all_loaded.load(std::memory_order_acquire)) return;
  auto may_serve = [&](const Candidate& c) { return c.type.empty() || c.type == type; };
  bool pending = false;
  for (const Candidate& c : candidates)
    pending = pending || (!c.done.load(std::memory_order_acquire) && may_serve(c));
  if (!pending && plugin_for_type(type)) return;
  {
    std::lock_guard<std::mutex> lock(load_mu);
    for (Candidate& c : candidates)
      if (may_serve(c)) load_candidate(c);
  }
  if (!plugin_for_type(type)) load_all();
}

void RegistryState::load_all() {
  if (all_loaded.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(load_mu);
  for (Candidate& c : candidates) load_candidate(c);
  all_loaded.store(true, std::memory_order_release);
}

std::vector<Device*> RegistryState::devices() const {
  std::vector<Device*> out;
  for (const Candidate& c : candidates)
    if (const Plugin* p = c.plugin.load(std::memory_order_acquire))
      for (const auto& d : p->devices) out.push_back(d.get());
  return out;
}

Plugin* RegistryState::plugin_for_type(std::string_view type) const {
  Plugin* without_devices = nullptr;
  for (const Candidate& c : candidates) {
    Plugin* p = c.plugin.load(std::memory_order_acquire);
    if (!p || p->api->device_type != type) continue;
    if (!p->devices.empty()) return p;
    if (!without_devices) without_devices = p;
  }
  return without_devices;
}

const PluginReport* RegistryState::report_for_type(std::string_view type) {
  std::lock_guard<std::mutex> lock(load_mu);
  const PluginReport* best = nullptr;
  for (const auto& r : report) {
    if (r.device_type == type || r.name == type) {
      if (!best || r.status == PluginReport::Status::loaded) best = &r;
    }
  }
  return best;
}

std::vector<std::string> RegistryState::known_types() const {
  std::vector<std::string> out;
  for (const Candidate& c : candidates)
    if (const Plugin* p = c.plugin.load(std::memory_order_acquire))
      out.push_back(p->api->device_type);
  return out;
}

std::string RegistryState::device_list() const {
  std::string out;
  for (Device* d : devices()) out += (out.empty() ? "" : ", ") + d->str();
  return out.empty() ? "none" : out;
}

std::string manifest_device_type(const std::string& path, std::string& why) {
  const std::string file = path + ".manifest";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return "";
  std::ifstream in(file);
  std::string text, type;
  int n = 0;
  while (std::getline(in, text)) {
    ++n;
    if (n > 64 || text.size() > 4096) {
      why = file + ": longer than a manifest may be (64 lines of 4 KiB)";
      return "";
    }
    size_t hash = text.find('#');
    if (hash != std::string::npos) text.resize(hash);
    auto trim = [](std::string v) {
      const char* ws = " \t\r";
      size_t b = v.find_first_not_of(ws), e = v.find_last_not_of(ws);
      return b == std::string::npos ? std::string() : v.substr(b, e - b + 1);
    };
    text = trim(text);
    if (text.empty()) continue;
    size_t eq = text.find('=');
    std::string key = eq == std::string::npos ? text : trim(text.substr(0, eq));
    std::string value = eq == std::string::npos ? "" : trim(text.substr(eq + 1));
    if (key != "device_type" || value.size() < 3 || value.front() != '"' || value.back() != '"' ||
        !valid_type(value.substr(1, value.size() - 2).c_str())) {
      why = file + " line " + std::to_string(n) +
            ": expected device_type = \"<type>\" (lower-case [a-z][a-z0-9_]*), got '" +
            text.substr(0, 80) + "'";
      return "";
    }
    type = value.substr(1, value.size() - 2);
  }
  return type;
}

}  // namespace bp::detail

// ---- Registry --------------------------------------------------------------------------------

namespace bp {

using detail::Plugin;
using detail::RegistryState;

RegistryOptions RegistryOptions::from_environment() {
  return detail::options_from(Config::load());
}

Registry::Registry(RegistryOptions options)
    : s_(std::make_unique<RegistryState>(std::move(options))) {
  namespace fs = std::filesystem;
  RegistryState& st = *s_;
  const RegistryOptions& opt = st.options;
  std::vector<std::string> entries = opt.plugin_paths;
  if (opt.search_library_dir) {
    std::string own = detail::library_dir();
    if (!own.empty()) entries.push_back(own + "/backplane/plugins");
  }

  std::vector<std::string> candidates;
  std::set<std::string> seen;
  for (const auto& e : entries) {
    std::error_code ec;
    if (fs::is_directory(e, ec)) {
      std::vector<std::string> files;
      for (const auto& f : fs::directory_iterator(e, ec))
        if (!detail::name_from_file(f.path()).empty()) files.push_back(f.path().string());
      std::sort(files.begin(), files.end());
      for (auto& f : files)
        if (seen.insert(fs::weakly_canonical(f, ec).string()).second) candidates.push_back(f);
    } else if (fs::exists(e, ec)) {
      if (detail::is_comm_plugin_name(detail::plugin_name_from_file(e))) continue;
      if (seen.insert(fs::weakly_canonical(e, ec).string()).second) candidates.push_back(e);
    } else {
      PluginReport r;
      r.path = e;
      r.status = PluginReport::Status::skipped;
      r.decision = "skipped";
      r.reason = "no such file or directory";
      st.report.push_back(std::move(r));
    }
  }

  auto skip = [&st](const std::string& path, const std::string& name, std::string reason) {
    PluginReport r;
    r.path = path;
    r.name = name;
    r.status = PluginReport::Status::skipped;
    r.decision = "skipped";
    r.reason = std::move(reason);
    st.report.push_back(std::move(r));
  };
  // Note [Loading on demand]: nothing is opened here.
  for (const auto& path : candidates) {
    std::string name = detail::name_from_file(path);
    auto listed = [&](const std::vector<std::string>& l) {
      return std::find(l.begin(), l.end(), name) != l.end();
    };
    if (!name.empty() && !opt.allow.empty() && !listed(opt.allow)) {
      skip(path, name, "not in the allow list (BACKPLANE_PLUGINS or plugins.allow)");
      continue;
    }
    if (!name.empty() && listed(opt.deny)) {
      skip(path, name, "in the deny list (plugins.deny)");
      continue;
    }
    std::string manifest_error;
    std::string type = detail::manifest_device_type(path, manifest_error);
    if (type.empty() && manifest_error.empty()) type = name;
    detail::Candidate& c = st.candidates.emplace_back();
    c.path = path;
    c.name = name;
    c.type = std::move(type);
    c.manifest_error = manifest_error;
    c.line = st.report.size();
    PluginReport r;
    r.path = path;
    r.name = name;
    r.device_type = c.type;
    r.status = PluginReport::Status::skipped;
    r.decision = "not loaded";
    r.reason = manifest_error.empty()
                   ? "not asked for yet (loaded when a " +
                         (c.type.empty() ? std::string("device") : c.type) + " device is)"
                   : manifest_error + "; loaded when any device type is asked for";
    st.report.push_back(std::move(r));
  }
}

Registry::~Registry() = default;

Registry& Registry::process_default() {
  // Never destroyed: Note [Plugin lifetime].
  static Registry* r = [] {
    auto* reg = new Registry(detail::options_from(detail::settings()));
    detail::maybe_publish_stats(*reg);
    detail::arm_fallback_report();  // before finish_queued_work's handler: printed after it
    std::atexit(detail::finish_queued_work_at_exit);  // Note [Exit]
    detail::arm_exit_guard();
    return reg;
  }();
  return *r;
}

const std::vector<PluginReport>& Registry::report() const {
  s_->load_all();
  return s_->report;
}

std::vector<Device*> Registry::devices() const {
  s_->load_all();
  return s_->devices();
}

std::vector<Device*> Registry::loaded_devices() const {
  return s_->devices();
}

std::vector<Device*> Registry::devices(DeviceKind kind) const {
  s_->load_all();
  std::vector<Device*> out;
  for (Device* d : s_->devices())
    if (d->properties().kind == kind) out.push_back(d);
  return out;
}

Device& Registry::device(std::string_view spec) {
  DeviceSpec s = parse_device_string(spec);
  RegistryState& st = *s_;
  st.ensure_type(s.type);
  Plugin* p = st.plugin_for_type(s.type);
  if (!p) {
    st.load_all();  // the message lists every type and device
    std::string msg = "unknown device type '" + s.type + "' in '" + std::string(spec) + "'";
    if (const PluginReport* r = st.report_for_type(s.type))
      msg += ": plugin " + r->path + " " + r->decision + ": " + r->reason;
    std::string known;
    for (const auto& t : st.known_types()) known += (known.empty() ? "" : ", ") + t;
    msg += "; known device types: " + (known.empty() ? std::string("none") : known) +
           "; devices: " + st.device_list();
    throw DeviceError(msg);
  }
  if (p->devices.empty()) {
    st.load_all();
    throw DeviceError(std::string(spec) + " is not available: " + p->no_devices_reason +
                      " (plugin " + p->path + "); devices: " + st.device_list());
  }
  if (s.index >= static_cast<int>(p->devices.size())) {
    st.load_all();
    throw DeviceError("device " + s.type + ":" + std::to_string(s.index) +
                      " does not exist: index out of range, " + s.type + " has " +
                      std::to_string(p->devices.size()) +
                      " device(s); devices: " + st.device_list());
  }
  return *p->devices[s.index];
}

namespace {
// The type of "cuda" or "cuda:1" (a whole device string is accepted where a type is asked for);
// DeviceError for a malformed string. `index` is -1 without one.
std::string type_of(std::string_view spec, int& index) {
  index = -1;
  if (spec.find(':') == std::string_view::npos) return std::string(spec);
  DeviceSpec s = parse_device_string(spec);
  index = s.index;
  return s.type;
}
}  // namespace

int Registry::num_devices(std::string_view spec) const {
  int index;
  const std::string type = type_of(spec, index);
  s_->ensure_type(type);
  Plugin* p = s_->plugin_for_type(type);
  return p ? static_cast<int>(p->devices.size()) : 0;
}

Device& Registry::try_device(std::string_view spec) {
  DeviceSpec s = parse_device_string(spec);
  s_->ensure_type(s.type);
  Plugin* p = s_->plugin_for_type(s.type);
  if (p && s.index < static_cast<int>(p->devices.size())) return *p->devices[s.index];
  return device("cpu:0");
}

std::vector<Device*> Registry::all_devices(std::string_view type) {
  std::vector<Device*> out;
  s_->ensure_type(type);
  if (Plugin* p = s_->plugin_for_type(type))
    for (const auto& d : p->devices) out.push_back(d.get());
  if (out.empty()) out.push_back(&device("cpu:0"));
  return out;
}

Availability Registry::is_available(std::string_view spec) const {
  int index;
  const std::string type = type_of(spec, index);
  s_->ensure_type(type);
  Plugin* p = s_->plugin_for_type(type);
  if (p && index >= static_cast<int>(p->devices.size()) && !p->devices.empty())
    return {false, type + " has " + std::to_string(p->devices.size()) + " device(s); " + type +
                       ":" + std::to_string(index) + " does not exist"};
  if (p && !p->devices.empty()) return {true, ""};
  if (p) return {false, p->no_devices_reason};
  if (const PluginReport* r = s_->report_for_type(type))
    return {false, "plugin " + r->path + " " + r->decision + ": " + r->reason};
  return {false, "no plugin provides device type '" + std::string(type) + "'"};
}

Device& Registry::default_device() {
  if (Device* d = s_->default_device.load(std::memory_order_acquire)) return *d;
  const RegistryOptions& o = s_->options;
  Device* d = nullptr;
  if (!o.default_device.empty()) {
    try {
      d = &device(o.default_device);
    } catch (const DeviceError& e) {
      throw DeviceError("default device from " +
                        (o.default_device_origin.empty() ? std::string("the registry options")
                                                         : o.default_device_origin) +
                        ": " + e.what());
    }
  } else {
    d = &device("cpu:0");
  }
  s_->default_device.store(d, std::memory_order_release);
  return *d;
}

void Registry::set_default_device(Device& d) {
  s_->default_device.store(&d, std::memory_order_release);
}

void Registry::synchronize() {
  for (Device* d : s_->devices()) d->synchronize();  // a plugin not loaded has no work
}

}  // namespace bp
