// Communicator plugins: found in the device plugins' search order (Note [Plugin search order]),
// filtered by the same allow/deny lists (names "comm-<name>"), checked like device plugins
// (ELF, dlopen with missing dependencies named, entry symbol, ABI major, table size, required
// slots), never unloaded (Note [Plugin lifetime] in registry.cpp).
#include "dist/comm_registry.hpp"
#include "dist/host/comm_host.hpp"
#include "runtime/config_internal.hpp"
#include "runtime/registry.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <set>

namespace bp::detail {

namespace {

namespace fs = std::filesystem;

std::string version_string(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

const char* missing_required_slot(const bp_comm_api* a) {
#define BP_REQUIRE(slot) \
  if (!a->slot) return #slot;
  BP_COMM_REQUIRED_SLOTS(BP_REQUIRE)
#undef BP_REQUIRE
  return nullptr;
}

bool valid_type(const char* t) {
  if (!t || !*t || !(*t >= 'a' && *t <= 'z')) return false;
  for (const char* c = t; *c; ++c)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return false;
  return true;
}

}  // namespace

bool CommPlugin::serves(std::string_view device_type) const {
  const auto& t = report.device_types;
  return std::find(t.begin(), t.end(), device_type) != t.end();
}

dist::CommPluginReport CommRegistry::load_candidate(const std::string& path,
                                                    const bp_comm_api** out_api) {
  *out_api = nullptr;
  dist::CommPluginReport r;
  r.path = path;
  r.status = PluginReport::Status::failed;
  r.decision = "failed";
  void* entry = nullptr;
  void* h = open_library(path, BP_COMM_ENTRY_SYMBOL,
                         "is it a communicator plugin built against backplane/comm_abi.h?", &entry,
                         r.reason);
  if (!h) return r;
  auto get = reinterpret_cast<bp_comm_get_api_fn>(entry);
  const bp_comm_api* api = get(BP_COMM_ABI_MAJOR, BP_COMM_ABI_MINOR);
  if (!api) {
    r.reason = std::string(BP_COMM_ENTRY_SYMBOL) + " returned no table for host comm ABI " +
               version_string(BP_COMM_ABI_MAJOR, BP_COMM_ABI_MINOR);
    dlclose(h);
    return r;
  }
  if (api->struct_size < offsetof(bp_comm_api, device_types) + sizeof(api->device_types)) {
    r.reason = "communicator table is too small (" + std::to_string(api->struct_size) + " bytes)";
    dlclose(h);
    return r;
  }
  r.abi_major = api->abi_major;
  r.abi_minor = api->abi_minor;
  r.name = api->name ? api->name : "";
  r.version = api->version ? api->version : "";
  if (api->device_types)
    for (const char* const* t = api->device_types; *t; ++t) r.device_types.emplace_back(*t);
  if (api->abi_major != BP_COMM_ABI_MAJOR) {
    r.reason = "comm ABI " + version_string(api->abi_major, api->abi_minor) + " vs host " +
               version_string(BP_COMM_ABI_MAJOR, BP_COMM_ABI_MINOR) +
               ": major versions differ; rebuild the plugin against this Backplane";
    dlclose(h);
    return r;
  }
  if (api->struct_size < offsetof(bp_comm_api, capabilities)) {
    // Minors 0 and 1 end before capabilities; minor 2 appends after (read only when present).
    r.reason = "communicator table of " + std::to_string(api->struct_size) +
               " bytes is smaller than comm ABI 1.0 requires (" +
               std::to_string(offsetof(bp_comm_api, capabilities)) + ")";
    dlclose(h);
    return r;
  }
  if (const char* slot = missing_required_slot(api)) {
    r.reason = std::string("required slot '") + slot + "' is NULL";
    dlclose(h);
    return r;
  }
  if (!api->group_start != !api->group_end) {
    r.reason = "group_start and group_end must be both set or both NULL";
    dlclose(h);
    return r;
  }
  if (r.name.empty() || !valid_type(api->name)) {
    r.reason = "plugin name '" + r.name + "' is not lower-case [a-z][a-z0-9_]*";
    dlclose(h);
    return r;
  }
  if (r.device_types.empty()) {
    r.reason = "the plugin declares no device types";
    dlclose(h);
    return r;
  }
  for (const auto& t : r.device_types)
    if (!valid_type(t.c_str())) {
      r.reason = "device type '" + t + "' is not lower-case [a-z][a-z0-9_]*";
      dlclose(h);
      return r;
    }
  if (bp_error* e = api->init()) {
    r.reason = "init failed: " + take_comm_error(api, e);
    return r;  // not closed: init may have started threads (Note [Plugin lifetime])
  }
  const char* reason = "";
  r.available = api->available(&reason) != 0;
  r.library = r.available && reason ? reason : "";
  if (!r.available)
    r.reason = std::string("unavailable: ") + (reason && *reason ? reason : "no reason given");
  if (api->abi_minor >= 2 &&
      api->struct_size >= offsetof(bp_comm_api, capabilities) + sizeof(api->capabilities) &&
      api->capabilities) {
    const char* note = "";
    r.capabilities = api->capabilities(&note);
    r.capability_note = note ? note : "";
  } else {
    r.capabilities = BP_COMM_CAP_ABORT_ANY_THREAD | BP_COMM_CAP_REINIT;
    r.capability_note = "a comm ABI " + version_string(api->abi_major, api->abi_minor) +
                        " plugin: no comm_shrink (comm ABI 1.2)";
  }
  r.status = PluginReport::Status::loaded;
  r.decision = "loaded";
  *out_api = api;
  return r;
}

CommRegistry::CommRegistry() {
  const Config& cfg = settings();
  std::vector<std::string> candidates;
  std::set<std::string> seen;
  for (const auto& e : plugin_search_entries()) {
    std::error_code ec;
    std::vector<std::string> files;
    if (fs::is_directory(e, ec)) {
      for (const auto& f : fs::directory_iterator(e, ec))
        if (is_comm_plugin_name(plugin_name_from_file(f.path().string())))
          files.push_back(f.path().string());
      std::sort(files.begin(), files.end());
    } else if (fs::exists(e, ec) && is_comm_plugin_name(plugin_name_from_file(e))) {
      files.push_back(e);
    }
    for (auto& f : files)
      if (seen.insert(fs::weakly_canonical(f, ec).string()).second) candidates.push_back(f);
  }
  auto skip = [this](const std::string& path, const std::string& name, std::string reason) {
    dist::CommPluginReport r;
    r.path = path;
    r.name = name;
    r.status = PluginReport::Status::skipped;
    r.decision = "skipped";
    r.reason = std::move(reason);
    report_.push_back(std::move(r));
  };
  for (const auto& path : candidates) {
    std::string file_name = plugin_name_from_file(path);  // "comm-gloo"
    std::string name = file_name.substr(5);
    auto listed = [&](const std::vector<std::string>& l) {
      return std::find(l.begin(), l.end(), file_name) != l.end();
    };
    if (!cfg.allow.empty() && !listed(cfg.allow)) {
      skip(path, name,
           "not in the allow list (BACKPLANE_PLUGINS or plugins.allow; add '" + file_name + "')");
      continue;
    }
    if (listed(cfg.deny)) {
      skip(path, name, "in the deny list (plugins.deny)");
      continue;
    }
    if (const CommPlugin* prev = find(name)) {
      skip(path, name, "shadowed by " + prev->report.path + " (earlier in the search order)");
      continue;
    }
    const bp_comm_api* api = nullptr;
    dist::CommPluginReport r = load_candidate(path, &api);
    if (api) {
      if (find(r.name)) {
        r.status = PluginReport::Status::skipped;
        r.decision = "skipped";
        r.reason = "a communicator plugin named '" + r.name + "' is already loaded";
      } else {
        plugins_.push_back(CommPlugin{api, r});
      }
    }
    report_.push_back(std::move(r));
  }
}

CommRegistry& CommRegistry::get() {
  static CommRegistry* r = new CommRegistry();  // never destroyed: Note [Plugin lifetime]
  return *r;
}

const CommPlugin* CommRegistry::find(std::string_view name) const {
  for (const auto& p : plugins_)
    if (p.report.name == name) return &p;
  return nullptr;
}

std::string take_comm_error(const bp_comm_api* api, bp_error* err, int32_t* out_code) {
  std::string text = err->message ? err->message : "(no message)";
  if (err->native_name && *err->native_name) text += std::string(" [") + err->native_name + "]";
  if (out_code) *out_code = err->code;
  api->error_free(err);
  return text;
}

void throw_comm_error(const bp_comm_api* api, bp_error* err, const std::string& context) {
  int32_t code = 0;
  std::string native = err->native_name ? err->native_name : "";
  std::string plugin = err->plugin && *err->plugin ? err->plugin : (api->name ? api->name : "?");
  std::string msg = context + ": " + plugin + ": " + take_comm_error(api, err, &code);
  switch (code) {
    case BP_COMM_ERROR_TIMEOUT:
      throw dist::TimeoutError(msg);
    case BP_COMM_ERROR_REMOTE:
    case BP_COMM_ERROR_ABORTED:
      throw dist::PeerError(msg);
    case BP_ERROR_UNAVAILABLE:
      throw dist::BackendUnavailable(msg);
    case BP_ERROR_OUT_OF_MEMORY:
      throw OutOfMemory(msg);
    default:
      throw dist::DistError(msg);
  }
}

}  // namespace bp::detail

namespace bp::dist {

std::vector<CommPluginReport> comm_load_report() {
  return detail::CommRegistry::get().report();
}

CommPluginReport inspect_comm_plugin(const std::string& path) {
  const bp_comm_api* api = nullptr;
  return detail::CommRegistry::load_candidate(path, &api);
}

}  // namespace bp::dist

namespace bp::host {

LoadedCommPlugin load_comm_plugin(const std::string& path_or_name) {
  LoadedCommPlugin out;
  if (path_or_name.find('/') != std::string::npos) {
    out.report = detail::CommRegistry::load_candidate(path_or_name, &out.api);
    return out;
  }
  const auto& reg = detail::CommRegistry::get();
  for (const auto& r : reg.report())
    if (r.name == path_or_name) out.report = r;
  if (const detail::CommPlugin* p = reg.find(path_or_name)) out.api = p->api;
  return out;
}

}  // namespace bp::host
