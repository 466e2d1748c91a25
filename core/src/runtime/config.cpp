// Reading the configuration (Note [Config precedence] in runtime.hpp).
#include "runtime/config_internal.hpp"

#include <backplane/abi/op_list.h>
#include <backplane/errors.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
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

// Note [Fallback policy] in runtime.hpp: "error", "warn" or "allow".
std::string fallback_mode(const std::string& where, const std::string& v) {
  if (v == "error" || v == "warn" || v == "allow") return v;
  throw IOError(where + ": fallback policy '" + v.substr(0, 64) +
                "' is not one of error, warn, allow");
}

bool is_op_name(const std::string& name) {
#define BP_X(n, ...) \
  if (name == #n) return true;
  BP_OP_CATALOGUE(BP_X)
#undef BP_X
  return false;
}

std::string sync_mode(const std::string& where, const std::string& v) {
  if (v.empty() || v == "off" || v == "warn" || v == "error") return v == "off" ? "" : v;
  throw IOError(where + ": sync debug mode '" + v + "' is not one of off, warn, error");
}

// The limits of a config file (Note [Config precedence]), checked on the raw bytes before
// toml++ parses them: its parser recurses once per dotted part of a key or table header.
constexpr size_t kMaxConfigBytes = 1u << 20, kMaxConfigLine = 64u << 10;
constexpr int kMaxDottedParts = 64;

std::string read_bounded(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw IOError(
        "config file " + file + " cannot be opened for reading: " + std::strerror(errno) +
        (errno == EACCES ? " (this user may not read it; check its mode and owner)" : ""));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw IOError("config file " + file + " cannot be read: " + std::strerror(errno));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > kMaxConfigBytes)
      throw IOError("config file " + file + " is larger than " + std::to_string(kMaxConfigBytes) +
                    " bytes; a Backplane config has a few keys");
  }
  // Count, per line, the dots outside strings and comments (a dotted key or table header has
  // one per part; a float value has one); multi-line strings span lines.
  int line = 1, dots = 0;
  size_t line_start = 0;
  enum { code, basic, literal, ml_basic, ml_literal, comment } st = code;
  for (size_t i = 0; i < text.size(); ++i) {
    char ch = text[i];
    if (ch == '\n') {
      if (i - line_start > kMaxConfigLine)
        throw IOError("config file " + file + ", line " + std::to_string(line) +
                      " is longer than " + std::to_string(kMaxConfigLine) + " bytes");
      ++line;
      line_start = i + 1;
      dots = 0;
      if (st == comment || st == basic || st == literal) st = code;
      continue;
    }
    auto triple = [&](char q) { return text.compare(i, 3, std::string(3, q)) == 0; };
    switch (st) {
      case code:
        if (ch == '#')
          st = comment;
        else if (triple('"'))
          st = ml_basic, i += 2;
        else if (triple('\''))
          st = ml_literal, i += 2;
        else if (ch == '"')
          st = basic;
        else if (ch == '\'')
          st = literal;
        else if (ch == '.' && ++dots > kMaxDottedParts)
          throw IOError("config file " + file + ", line " + std::to_string(line) +
                        ": a key of more than " + std::to_string(kMaxDottedParts) +
                        " dotted parts; Backplane's keys have two");
        break;
      case basic:
        if (ch == '\\')
          ++i;
        else if (ch == '"')
          st = code;
        break;
      case literal:
        if (ch == '\'') st = code;
        break;
      case ml_basic:
        if (ch == '\\')
          ++i;
        else if (triple('"'))
          st = code, i += 2;
        break;
      case ml_literal:
        if (triple('\'')) st = code, i += 2;
        break;
      case comment:
        break;
    }
  }
  if (text.size() - line_start > kMaxConfigLine)
    throw IOError("config file " + file + ", line " + std::to_string(line) + " is longer than " +
                  std::to_string(kMaxConfigLine) + " bytes");
  return text;
}

void read_file(Config& c, const std::string& file, bool implicit) {
  toml::table root;
  std::string text = read_bounded(file);
  try {
    root = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    throw IOError("config file " + file + ", line " + std::to_string(e.source().begin.line) + ": " +
                  std::string(e.description()));
  }
  c.source = file;
  for (auto&& [k, node] : root) {
    std::string key(k.str());
    if (key == "device") {
      auto v = node.value_exact<std::string>();
      if (!v || v->empty()) bad_key(file, node, key, "expected a device string such as \"cpu:0\"");
      c.default_device = *v;
    } else if (key == "fallback") {
      const toml::table* t = node.as_table();
      if (!t) bad_key(file, node, key, "expected a table [fallback]");
      auto where = [&](const toml::node& n, const std::string& k) {
        return "config file " + file + ", line " + std::to_string(n.source().begin.line) +
               ", key '" + k + "'";
      };
      for (auto&& [sk, sn] : *t) {
        std::string sub = "fallback." + std::string(sk.str());
        if (sub == "fallback.policy") {
          auto v = sn.value_exact<std::string>();
          if (!v) bad_key(file, sn, sub, "expected \"error\", \"warn\" or \"allow\"");
          c.fallback = fallback_mode(where(sn, sub), *v);
        } else if (sub == "fallback.ops") {
          const toml::table* ops = sn.as_table();
          if (!ops) bad_key(file, sn, sub, "expected a table [fallback.ops] of op = \"policy\"");
          for (auto&& [ok, on] : *ops) {
            std::string op(ok.str()), full = sub + "." + op;
            if (!is_op_name(op))
              bad_key(file, on, full,
                      "'" + op + "' is not an op of the catalogue (conv2d, matmul, relu, ...)");
            auto v = on.value_exact<std::string>();
            if (!v) bad_key(file, on, full, "expected \"error\", \"warn\" or \"allow\"");
            c.fallback_ops.emplace_back(op, fallback_mode(where(on, full), *v));
          }
        } else {
          bad_key(file, sn, sub, "unknown key; known keys are fallback.policy, fallback.ops.<op>");
        }
      }
    } else if (key == "plugins" || key == "matmul" || key == "debug") {
      const toml::table* t = node.as_table();
      if (!t) bad_key(file, node, key, "expected a table [" + key + "]");
      for (auto&& [sk, sn] : *t) {
        std::string sub = key + "." + std::string(sk.str());
        if (sub == "plugins.paths") {
          const char* trust = std::getenv("BACKPLANE_TRUST_LOCAL_CONFIG");
          if (implicit && !(trust && std::string(trust) == "1"))
            bad_key(file, sn, sub,
                    "a config file found implicitly in the working folder may not add plugin "
                    "folders (their code would run in every program started here); to trust it, "
                    "set BACKPLANE_CONFIG=" +
                        file + " or BACKPLANE_TRUST_LOCAL_CONFIG=1");
          c.plugin_paths = string_list(file, sn, sub);
        } else if (sub == "plugins.allow") {
          c.allow = string_list(file, sn, sub);
        } else if (sub == "plugins.deny") {
          c.deny = string_list(file, sn, sub);
        } else if (sub == "matmul.allow_tf32") {
          auto v = sn.value_exact<bool>();  // not 1 or 0: a boolean, as TOML has them
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
              "matmul.allow_tf32, debug.sync, fallback.policy, fallback.ops.<op>");
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

// Why `path` cannot be examined (stat failed with `err`, neither ENOENT nor ENOTDIR): for a
// folder on the path this user may not search, that folder; otherwise the system's reason.
std::string unreachable_reason(const std::string& path, int err) {
  if (err == EACCES) {
    // The first folder along the path that this user cannot search (enter).
    std::filesystem::path so_far;
    for (const auto& part : std::filesystem::path(path).parent_path()) {
      so_far /= part;
      if (::access(so_far.c_str(), X_OK) != 0)
        return "permission denied: this user may not search the folder " + so_far.string() +
               " (it lacks the x permission for this user), so whether the file exists cannot "
               "be known";
    }
    return "permission denied: a folder on the path may not be searched by this user";
  }
  return std::strerror(err);
}

// True when `path` exists (following symbolic links). A path that exists but is not a regular
// file is an IOError saying what it is: reading a folder or /dev/zero as TOML would otherwise
// pass silently as an empty configuration, and a FIFO would block. A path that cannot be
// examined (a folder on it this user may not search, a loop of symbolic links) is an IOError
// saying why when `named` (BACKPLANE_CONFIG); an implicit place that cannot be examined is
// passed over, as one without a file (a HOME of mode 000 stops no program).
bool config_exists(const std::string& path, const char* origin, bool named = false) {
  struct ::stat raw;
  if (::stat(path.c_str(), &raw) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR || !named) return false;
    throw IOError("config file " + path + origin +
                  " cannot be reached: " + unreachable_reason(path, err) +
                  "; unset BACKPLANE_CONFIG or point it at a TOML "
                  "file this user can read");
  }
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
    if (!config_exists(explicit_path, " (from BACKPLANE_CONFIG)", true))
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
  if (!file.empty())
    read_file(c, file, file == "backplane.toml" && env("BACKPLANE_CONFIG").empty());
  if (std::string v = env("BACKPLANE_DEVICE"); !v.empty()) c.default_device = v;
  if (std::string v = env("BACKPLANE_PLUGINS"); !v.empty()) c.allow = split(v, ',');
  if (std::string v = env("BACKPLANE_ALLOW_TF32"); !v.empty()) {
    if (v != "0" && v != "1") throw IOError("BACKPLANE_ALLOW_TF32='" + v + "' is not 0 or 1");
    c.allow_tf32 = v == "1";
  }
  if (std::string v = env("BACKPLANE_SYNC_DEBUG"); !v.empty())
    c.sync_debug = sync_mode("BACKPLANE_SYNC_DEBUG", v);
  if (std::string v = env("BACKPLANE_FALLBACK"); !v.empty())
    c.fallback = fallback_mode("BACKPLANE_FALLBACK", v);
  if (std::string v = env("BACKPLANE_LAUNCH_BLOCKING"); !v.empty()) {
    if (v != "0" && v != "1")
      throw IOError("BACKPLANE_LAUNCH_BLOCKING='" + v.substr(0, 64) + "' is not 0 or 1");
    c.launch_blocking = v == "1";
  }
  if (std::string v = env("BACKPLANE_FALLBACK_REPORT"); !v.empty()) {
    if (v != "0" && v != "1")
      throw IOError("BACKPLANE_FALLBACK_REPORT='" + v.substr(0, 64) + "' is not 0 or 1");
    c.fallback_report = v == "1";
  }
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
