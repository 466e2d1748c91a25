// Reading the configuration (Note [Config precedence] in runtime.hpp).
#include "runtime/config_internal.hpp"

#include <backplane/errors.hpp>

#include <toml++/toml.h>
#include <cstdlib>
#include <filesystem>

namespace bp::detail {

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

[[noreturn]] void bad_key(const std::string& file, const toml::node& node, const std::string& key,
                          const std::string& why) {
  throw IOError("config file " + file + ", line " + std::to_string(node.source().begin.line) +
                ", key '" + key + "': " + why);
}

std::vector<std::string> string_list(const std::string& file, const toml::node& node,
                                     const std::string& key) {
  const toml::array* arr = node.as_array();
  if (!arr) bad_key(file, node, key, "expected an array of strings, e.g. [\"cpu\"]");
  std::vector<std::string> out;
  for (const toml::node& item : *arr) {
    auto s = item.value<std::string>();
    if (!s) bad_key(file, item, key, "expected every element to be a string");
    out.push_back(*s);
  }
  return out;
}

std::string sync_mode(const std::string& where, const std::string& v) {
  if (v.empty() || v == "off" || v == "warn" || v == "error") return v == "off" ? "" : v;
  throw IOError(where + ": sync debug mode '" + v + "' is not one of off, warn, error");
}

void read_file(Config& c, const std::string& file) {
  toml::table root;
  try {
    root = toml::parse_file(file);
  } catch (const toml::parse_error& e) {
    throw IOError("config file " + file + ", line " + std::to_string(e.source().begin.line) + ": " +
                  std::string(e.description()));
  }
  c.source = file;
  for (auto&& [k, node] : root) {
    std::string key(k.str());
    if (key == "device") {
      auto v = node.value<std::string>();
      if (!v) bad_key(file, node, key, "expected a device string such as \"cpu:0\"");
      c.default_device = *v;
    } else if (key == "plugins" || key == "matmul" || key == "debug") {
      const toml::table* t = node.as_table();
      if (!t) bad_key(file, node, key, "expected a table [" + key + "]");
      for (auto&& [sk, sn] : *t) {
        std::string sub = key + "." + std::string(sk.str());
        if (sub == "plugins.paths") {
          c.plugin_paths = string_list(file, sn, sub);
        } else if (sub == "plugins.allow") {
          c.allow = string_list(file, sn, sub);
        } else if (sub == "plugins.deny") {
          c.deny = string_list(file, sn, sub);
        } else if (sub == "matmul.allow_tf32") {
          auto v = sn.value<bool>();
          if (!v) bad_key(file, sn, sub, "expected true or false");
          c.allow_tf32 = *v;
        } else if (sub == "debug.sync") {
          auto v = sn.value<std::string>();
          if (!v) bad_key(file, sn, sub, "expected \"off\", \"warn\" or \"error\"");
          c.sync_debug =
              sync_mode("config file " + file + ", line " + std::to_string(sn.source().begin.line) +
                            ", key '" + sub + "'",
                        *v);
        } else {
          bad_key(file, sn, sub,
                  "unknown key; known keys are device, plugins.paths, plugins.allow, "
                  "plugins.deny, matmul.allow_tf32, debug.sync");
        }
      }
    } else {
      bad_key(file, node, key,
              "unknown key; known keys are device, plugins.paths, plugins.allow, plugins.deny, "
              "matmul.allow_tf32, debug.sync");
    }
  }
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

namespace {

// "a directory", "a character device", ... for a path that exists but is not a regular file.
const char* kind_of(std::filesystem::file_type t) {
  using std::filesystem::file_type;
  switch (t) {
    case file_type::directory:
      return "a directory";
    case file_type::character:
      return "a character device";
    case file_type::block:
      return "a block device";
    case file_type::fifo:
      return "a named pipe (FIFO)";
    case file_type::socket:
      return "a socket";
    default:
      return "not a regular file";
  }
}

// True when `path` exists (following symbolic links). A path that exists but is not a regular
// file is an IOError saying what it is: reading a folder or /dev/zero as TOML would otherwise
// pass silently as an empty configuration, and a FIFO would block.
bool config_exists(const std::string& path, const char* origin) {
  std::error_code ec;
  std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) return false;
  if (!std::filesystem::is_regular_file(st))
    throw IOError("config file " + path + origin + " is " + kind_of(st.type()) +
                  ", not a regular file; point it at a TOML file");
  return true;
}

}  // namespace

std::string config_file_path() {
  std::string explicit_path = env("BACKPLANE_CONFIG");
  if (!explicit_path.empty()) {
    if (!config_exists(explicit_path, " (from BACKPLANE_CONFIG)"))
      throw IOError("config file " + explicit_path +
                    " (from BACKPLANE_CONFIG) does not exist; unset BACKPLANE_CONFIG or point it "
                    "at a TOML file");
    return explicit_path;
  }
  if (config_exists("backplane.toml", " (in the working folder)")) return "backplane.toml";
  std::string xdg = env("XDG_CONFIG_HOME");
  if (xdg.empty() && !env("HOME").empty()) xdg = env("HOME") + "/.config";
  if (!xdg.empty()) {
    std::string p = xdg + "/backplane/config.toml";
    if (config_exists(p, "")) return p;
  }
  return "";
}

Config load_config() {
  Config c;
  std::string file = config_file_path();
  if (!file.empty()) read_file(c, file);
  if (std::string v = env("BACKPLANE_DEVICE"); !v.empty()) c.default_device = v;
  if (std::string v = env("BACKPLANE_PLUGINS"); !v.empty()) c.allow = split(v, ',');
  if (std::string v = env("BACKPLANE_ALLOW_TF32"); !v.empty()) {
    if (v != "0" && v != "1") throw IOError("BACKPLANE_ALLOW_TF32='" + v + "' is not 0 or 1");
    c.allow_tf32 = v == "1";
  }
  if (std::string v = env("BACKPLANE_SYNC_DEBUG"); !v.empty())
    c.sync_debug = sync_mode("BACKPLANE_SYNC_DEBUG", v);
  return c;
}

}  // namespace bp::detail

namespace bp {

Config Config::load() {
  return detail::load_config();
}

const Config& config() {
  return detail::settings();
}

}  // namespace bp

namespace bp::detail {

const Config& settings() {
  static const Config* c = new Config(load_config());  // read once; never destroyed
  return *c;
}

std::vector<std::string> env_plugin_path() {
  return split(env("BACKPLANE_PLUGIN_PATH"), ':');
}

}  // namespace bp::detail
