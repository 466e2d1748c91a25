// Plugin discovery, loading and the load report (Note [Plugin search order] in runtime.hpp).
//
// Note [Plugin lifetime]
//   Plugins are opened with RTLD_NOW | RTLD_LOCAL and never closed: buffers, streams and
//   kernels they created may be referenced until process exit, and unloading a GPU driver
//   stack while anything is alive is a crash. The registry itself is intentionally never
//   destroyed for the same reason (no static-destruction-order hazards at exit).
//
// Note [Plugin table checks]
//   check_plugin_table() is everything the loader verifies in a table before it calls init():
//   the table is large enough to hold the identity fields, the major version is the host's, the
//   table holds every minor-0 slot and each required one is set, the five event slots are all
//   set or all NULL, and the device type is a valid device-string prefix. It reads fields in
//   that order and never past struct_size, so a truncated or hostile table gives a reason, not
//   a crash; tests/fuzz/fuzz_plugin_table.cpp feeds it arbitrary tables.
#include "registry.hpp"
#include "config_internal.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

namespace bp::detail {

namespace {

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
std::string name_from_file(const fs::path& p) {
  std::string f = p.filename().string();
  const std::string prefix = "libbackplane-", suffix = ".so";
  if (f.size() <= prefix.size() + suffix.size() || f.rfind(prefix, 0) != 0 ||
      f.compare(f.size() - suffix.size(), suffix.size(), suffix) != 0)
    return "";
  return f.substr(prefix.size(), f.size() - prefix.size() - suffix.size());
}

bool is_elf(const std::string& path, std::string& why) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    why = "cannot be opened for reading";
    return false;
  }
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() < 4 || std::memcmp(magic,
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

bool valid_type(const char* t) {
  if (!t || !*t || !(*t >= 'a' && *t <= 'z')) return false;
  for (const char* c = t; *c; ++c)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return false;
  return true;
}

// Required slots of a minor-0 table, by name, for the report.
const char* missing_required_slot(const bp_plugin_api* a) {
  // clang-format off
#define BP_REQUIRE(slot) \
  if (!a->slot) return #slot;
  BP_REQUIRE(error_free) BP_REQUIRE(init) BP_REQUIRE(device_count)
  BP_REQUIRE(device_properties) BP_REQUIRE(stream_create) BP_REQUIRE(stream_destroy)
  BP_REQUIRE(stream_synchronize) BP_REQUIRE(mem_alloc) BP_REQUIRE(mem_free)
  BP_REQUIRE(memory_stats) BP_REQUIRE(memory_reset_peak) BP_REQUIRE(memset)
  BP_REQUIRE(copy_h2d) BP_REQUIRE(copy_d2h) BP_REQUIRE(copy_d2d) BP_REQUIRE(find_kernel)
  BP_REQUIRE(launch)
#undef BP_REQUIRE
      // clang-format on
      return nullptr;
}

std::string version_string(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
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

PluginReport Registry::load_candidate(const std::string& path) {
  PluginReport r;
  r.path = path;
  r.status = PluginReport::Status::failed;
  r.decision = "failed";
  std::string why;
  if (!is_elf(path, why)) {
    r.reason = why;
    return r;
  }
  dlerror();
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    r.reason = explain_dlerror(path, e ? e : "unknown error");
    return r;
  }
  auto get = reinterpret_cast<bp_plugin_get_api_fn>(dlsym(h, BP_PLUGIN_ENTRY_SYMBOL));
  if (!get) {
    r.reason = "missing entry symbol " + std::string(BP_PLUGIN_ENTRY_SYMBOL) +
               " (is it a Backplane plugin built with BP_SDK_DEFINE_PLUGIN or exporting it?)";
    dlclose(h);
    return r;
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
    return r;
  }
  const char* reason = "";
  int32_t n = api->device_count(&reason);
  r.device_count = n < 0 ? 0 : n;
  if (r.device_count == 0)
    r.reason = std::string("0 devices because ") + (reason && *reason ? reason : "none found");
  r.status = PluginReport::Status::loaded;
  r.decision = "loaded";
  r.api = api;
  return r;
}

Registry::Registry() {
  const Config& cfg = settings();
  std::vector<std::string> entries = env_plugin_path();
  for (const auto& p : cfg.plugin_paths) entries.push_back(p);
  std::string own = library_dir();
  if (!own.empty()) entries.push_back(own + "/backplane/plugins");

  std::vector<std::string> candidates;
  std::set<std::string> seen;
  for (const auto& e : entries) {
    std::error_code ec;
    if (fs::is_directory(e, ec)) {
      std::vector<std::string> files;
      for (const auto& f : fs::directory_iterator(e, ec))
        if (!name_from_file(f.path()).empty()) files.push_back(f.path().string());
      std::sort(files.begin(), files.end());
      for (auto& f : files)
        if (seen.insert(fs::weakly_canonical(f, ec).string()).second) candidates.push_back(f);
    } else if (fs::exists(e, ec)) {
      if (seen.insert(fs::weakly_canonical(e, ec).string()).second) candidates.push_back(e);
    } else {
      PluginReport r;
      r.path = e;
      r.status = PluginReport::Status::skipped;
      r.decision = "skipped";
      r.reason = "no such file or directory";
      report_.push_back(std::move(r));
    }
  }

  auto skip = [this](const std::string& path, const std::string& name, std::string reason) {
    PluginReport r;
    r.path = path;
    r.name = name;
    r.status = PluginReport::Status::skipped;
    r.decision = "skipped";
    r.reason = std::move(reason);
    report_.push_back(std::move(r));
  };
  std::set<std::string> types;
  for (const auto& path : candidates) {
    std::string name = name_from_file(path);
    auto listed = [&](const std::vector<std::string>& l) {
      return std::find(l.begin(), l.end(), name) != l.end();
    };
    if (!name.empty() && !cfg.allow.empty() && !listed(cfg.allow)) {
      skip(path, name, "not in the allow list (BACKPLANE_PLUGINS or plugins.allow)");
      continue;
    }
    if (!name.empty() && listed(cfg.deny)) {
      skip(path, name, "in the deny list (plugins.deny)");
      continue;
    }
    if (!name.empty()) {
      auto prev = std::find_if(plugins_.begin(), plugins_.end(),
                               [&](const auto& p) { return p->api->name && name == p->api->name; });
      if (prev != plugins_.end()) {
        skip(path, name, "shadowed by " + (*prev)->path + " (earlier in the search order)");
        continue;
      }
    }
    PluginReport r = load_candidate(path);
    if (r.status == PluginReport::Status::loaded) {
      if (types.count(r.device_type)) {
        r.status = PluginReport::Status::skipped;
        r.decision = "skipped";
        r.reason = "device type '" + r.device_type + "' is already served by another plugin";
        r.api = nullptr;
      } else {
        register_plugin(r);
        if (r.status == PluginReport::Status::loaded) types.insert(r.device_type);
      }
    }
    report_.push_back(r);
  }
}

void Registry::register_plugin(PluginReport& r) {
  auto p = std::make_unique<Plugin>();
  p->path = r.path;
  p->api = r.api;
  p->has_minor1 = r.api->abi_minor >= 1 && r.api->struct_size > BP_API_MINOR1_OFFSET;
  p->no_devices_reason = r.device_count == 0 ? r.reason : "";
  Plugin& plugin = *p;
  plugins_.push_back(std::move(p));
  try {
    for (int i = 0; i < r.device_count; ++i)
      plugin.devices.push_back(std::make_unique<PluginDevice>(plugin, i));
  } catch (const Error& e) {
    plugin.devices.clear();
    r.status = PluginReport::Status::failed;
    r.decision = "failed";
    r.reason = std::string("reading device properties failed: ") + e.what();
    r.device_count = 0;
    plugin.no_devices_reason = r.reason;
  }
}

Registry& Registry::get() {
  static Registry* r = new Registry();  // never destroyed: Note [Plugin lifetime]
  return *r;
}

std::vector<Device*> Registry::devices() const {
  std::vector<Device*> out;
  for (const auto& p : plugins_)
    for (const auto& d : p->devices) out.push_back(d.get());
  return out;
}

Plugin* Registry::plugin_for_type(std::string_view type) const {
  for (const auto& p : plugins_)
    if (p->api->device_type == type && !p->devices.empty()) return p.get();
  for (const auto& p : plugins_)
    if (p->api->device_type == type) return p.get();
  return nullptr;
}

const PluginReport* Registry::report_for_type(std::string_view type) const {
  const PluginReport* best = nullptr;
  for (const auto& r : report_) {
    if (r.device_type == type || r.name == type) {
      if (!best || r.status == PluginReport::Status::loaded) best = &r;
    }
  }
  return best;
}

std::vector<std::string> Registry::known_types() const {
  std::vector<std::string> out;
  for (const auto& p : plugins_) out.push_back(p->api->device_type);
  return out;
}

}  // namespace bp::detail
