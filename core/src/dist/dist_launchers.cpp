// Rank, world size and rendezvous address from the launcher's variables (Note [Launchers] in
// dist_launch.hpp), and Slurm's compressed host lists.
#include <backplane/dist_launch.hpp>
#include <backplane/dist_store.hpp>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

namespace bp::dist {

namespace {

constexpr long kMaxWorldSize = 1 << 16;

std::string quoted(const char* v) {
  std::string s(v);
  if (s.size() > 64) s = s.substr(0, 64) + "...";
  return "'" + s + "'";
}

// ---- Slurm host lists -------------------------------------------------------------------------

struct Range {
  uint64_t lo = 0, hi = 0;
  size_t width = 0;  // digits of the lower bound: "01-10" keeps two
};
struct Segment {
  std::string literal;        // text before the bracket group (or the tail)
  std::vector<Range> ranges;  // empty: no bracket group
};
using Name = std::vector<Segment>;

RendezvousError bad_list(std::string_view list, size_t pos, const std::string& why) {
  std::string l(list.substr(0, 200));
  return RendezvousError("Slurm host list '" + l + "': " + why + " at character " +
                         std::to_string(pos + 1) +
                         "; expected names such as gpu-[01-04,07],cpu1 (scontrol show hostnames "
                         "expands one)");
}

std::vector<Name> parse_hostlist(std::string_view list) {
  std::vector<Name> names;
  Name cur;
  std::string lit;
  bool any = false;  // the current name has text or a bracket group
  auto end_name = [&](size_t pos) {
    if (!any && lit.empty()) throw bad_list(list, pos, "an empty host name");
    cur.push_back({lit, {}});
    names.push_back(std::move(cur));
    cur.clear();
    lit.clear();
    any = false;
  };
  for (size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (c == ',') {
      end_name(i);
    } else if (c == ']') {
      throw bad_list(list, i, "a ']' without its '['");
    } else if (c == '[') {
      size_t close = list.find(']', i);
      size_t nested = list.find('[', i + 1);
      if (close == std::string_view::npos) throw bad_list(list, i, "an unclosed '['");
      if (nested < close) throw bad_list(list, nested, "a '[' inside brackets");
      Segment seg{lit, {}};
      lit.clear();
      std::string_view body = list.substr(i + 1, close - i - 1);
      size_t start = 0;
      for (;;) {
        size_t comma = body.find(',', start);
        std::string_view item = body.substr(
            start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
        size_t at = i + 1 + start;
        size_t dash = item.find('-');
        std::string_view lo = item.substr(0, dash);
        std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
        auto digits = [](std::string_view s) {
          if (s.empty() || s.size() > 18) return false;
          for (char d : s)
            if (d < '0' || d > '9') return false;
          return true;
        };
        if (!digits(lo) || !digits(hi))
          throw bad_list(list, at,
                         "'" + std::string(item) + "' is not a number or a range of numbers (a-b)");
        Range r;
        r.lo = std::strtoull(std::string(lo).c_str(), nullptr, 10);
        r.hi = std::strtoull(std::string(hi).c_str(), nullptr, 10);
        r.width = lo.size();
        if (r.hi < r.lo)
          throw bad_list(list, at, "the range '" + std::string(item) + "' runs backwards");
        seg.ranges.push_back(r);
        if (comma == std::string_view::npos) break;
        start = comma + 1;
      }
      cur.push_back(std::move(seg));
      any = true;
      i = close;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      throw bad_list(list, i, "white space");
    } else {
      lit += c;
    }
  }
  end_name(list.size());
  return names;
}

std::string number(uint64_t v, size_t width) {
  std::string s = std::to_string(v);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

// ---- the launcher families ----------------------------------------------------------------------

struct Reader {
  const EnvLookup& lookup;
  const char* get(const char* name) const {
    const char* v = lookup ? lookup(name) : nullptr;
    return v && *v ? v : nullptr;
  }
  // An integer from min to max, or a RendezvousError naming the variable, its value and the
  // range.
  int integer(const char* name, const char* v, long min, long max, const std::string& why) const {
    char* end = nullptr;
    errno = 0;
    long n = std::strtol(v, &end, 10);
    if (end == v || *end || errno || n < min || n > max)
      throw RendezvousError(std::string(name) + "=" + quoted(v) + " is not an integer from " +
                            std::to_string(min) + " to " + std::to_string(max) + why);
    return static_cast<int>(n);
  }
};

struct Family {
  const char* launcher;
  const char* rank;
  std::vector<const char*> size;   // the first one set
  std::vector<const char*> local;  // the first one set
  bool either_starts = false;      // the size variable alone also selects the family
};

const Family kFamilies[] = {
    {"bp-run", "BACKPLANE_RANK", {"BACKPLANE_WORLD_SIZE"}, {"BACKPLANE_LOCAL_RANK"}, true},
    {"torchrun", "RANK", {"WORLD_SIZE"}, {"LOCAL_RANK"}},
    {"openmpi", "OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_SIZE"}, {"OMPI_COMM_WORLD_LOCAL_RANK"}},
    {"pmix",
     "PMIX_RANK",
     {"OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE"},
     {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}},
    {"mpich", "PMI_RANK", {"PMI_SIZE"}, {"MPI_LOCALRANKID"}},
    {"slurm", "SLURM_PROCID", {"SLURM_NTASKS"}, {"SLURM_LOCALID"}},
};

std::string joined(const std::vector<const char*>& names, const char* sep) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? sep : "") + std::string(names[i]);
  return s;
}

int parse_port(const Reader& env, const char* name, const char* v) {
  return env.integer(name, v, 1, 65535, " (a TCP port)");
}

// Note [Launchers], the address.
void find_address(const Reader& env, LaunchEnv& le) {
  if (const char* init = env.get("BACKPLANE_INIT")) {
    le.init_method = init;
    le.init_from = "BACKPLANE_INIT";
    return;
  }
  const char* addr = env.get("MASTER_ADDR");
  const char* port_text = env.get("MASTER_PORT");
  std::optional<int> port;
  if (port_text) port = parse_port(env, "MASTER_PORT", port_text);
  std::string host = addr ? addr : "";
  std::string from = addr ? "MASTER_ADDR" : "";
  if (!addr && le.launcher == "slurm") {
    const char* list = env.get("SLURM_JOB_NODELIST");
    const char* list_name = "SLURM_JOB_NODELIST";
    if (!list) {
      list = env.get("SLURM_NODELIST");
      list_name = "SLURM_NODELIST";
    }
    if (list) {
      host = first_slurm_host(list);
      from = std::string("the first host of ") + list_name;
    }
  }
  if (!host.empty() && !port && le.launcher == "slurm") port = kDefaultMasterPort;
  if (host.empty() || !port) {
    if (le.world_size == 1) return;  // a group of one needs no store
    std::string missing = host.empty() && !port ? "MASTER_ADDR and MASTER_PORT are"
                          : host.empty()        ? "MASTER_ADDR is"
                                                : "MASTER_PORT is";
    std::string who = "rank " + std::to_string(le.rank) + " of " + std::to_string(le.world_size) +
                      " (from " + le.variables + ", " + le.launcher + ")";
    std::string hint;
    if (le.launcher == "openmpi" || le.launcher == "pmix" || le.launcher == "mpich")
      hint =
          ": MPI launchers give each rank its rank and size but no rendezvous address; "
          "export MASTER_ADDR=<host of rank 0> and MASTER_PORT=<a free port> to every rank "
          "(mpirun -x MASTER_ADDR -x MASTER_PORT), or BACKPLANE_INIT=tcp://host:port";
    else if (le.launcher == "slurm")
      hint =
          ": neither SLURM_JOB_NODELIST nor MASTER_ADDR names the host of rank 0; export "
          "MASTER_ADDR (and MASTER_PORT, default " +
          std::to_string(kDefaultMasterPort) + ") or BACKPLANE_INIT=tcp://host:port";
    else
      hint = ": set both (torchrun does), or BACKPLANE_INIT=tcp://host:port or file:///dir";
    throw RendezvousError(who + " has no rendezvous address: " + missing + " not set" + hint);
  }
  int p = *port;
  from += port_text ? "/MASTER_PORT" : " and the default port " + std::to_string(p);
  // torchrun's agent store holds MASTER_PORT (PyTorch's workers share it as clients).
  const char* agent = env.get("TORCHELASTIC_USE_AGENT_STORE");
  if (le.launcher == "torchrun" && agent && std::strcmp(agent, "True") == 0) {
    if (p == 65535)
      throw RendezvousError(
          "MASTER_PORT='65535' is held by torchrun's agent store "
          "(TORCHELASTIC_USE_AGENT_STORE=True) and Backplane's store takes "
          "the next port: use a lower MASTER_PORT or BACKPLANE_INIT");
    ++p;
    from += " + 1 (torchrun's agent store holds MASTER_PORT)";
  }
  bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  le.init_method = "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(p);
  le.init_from = from;
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(std::string_view list, size_t max_hosts) {
  std::vector<Name> names = parse_hostlist(list);
  uint64_t total = 0;
  for (const Name& n : names) {
    uint64_t count = 1;
    for (const Segment& s : n)
      if (!s.ranges.empty()) {
        uint64_t k = 0;
        for (const Range& r : s.ranges) k += r.hi - r.lo + 1;
        count = k > max_hosts || count > max_hosts / k ? max_hosts + 1 : count * k;
      }
    total += count;
    if (total > max_hosts)
      throw RendezvousError("Slurm host list '" + std::string(list.substr(0, 200)) +
                            "' names more than " + std::to_string(max_hosts) + " hosts");
  }
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(total));
  for (const Name& n : names) {
    std::vector<std::string> partial{""};
    for (const Segment& s : n) {
      std::vector<std::string> next;
      for (const std::string& p : partial) {
        if (s.ranges.empty()) {
          next.push_back(p + s.literal);
          continue;
        }
        for (const Range& r : s.ranges)
          for (uint64_t v = r.lo; v <= r.hi; ++v)
            next.push_back(p + s.literal + number(v, r.width));
      }
      partial.swap(next);
    }
    for (auto& h : partial) out.push_back(std::move(h));
  }
  return out;
}

std::string first_slurm_host(std::string_view list) {
  std::vector<Name> names = parse_hostlist(list);
  std::string host;
  for (const Segment& s : names.front()) {
    host += s.literal;
    if (!s.ranges.empty()) host += number(s.ranges.front().lo, s.ranges.front().width);
  }
  return host;
}

LaunchEnv launch_env(const EnvLookup& lookup) {
  Reader env{lookup};
  LaunchEnv le;
  for (const Family& f : kFamilies) {
    const char* r = env.get(f.rank);
    const char* size_name = nullptr;
    const char* s = nullptr;
    for (const char* n : f.size)
      if ((s = env.get(n))) {
        size_name = n;
        break;
      }
    if (!r && !(f.either_starts && s)) continue;
    if (!r)
      throw RendezvousError(std::string(size_name) + " is set but " + f.rank +
                            " is not; set both (bp-run does)");
    if (!s)
      throw RendezvousError(std::string(f.rank) + " is set but " + joined(f.size, " or ") +
                            " is not; set both (" + f.launcher + " sets " + f.rank + " and " +
                            f.size.front() + ")");
    le.launcher = f.launcher;
    le.variables = std::string(f.rank) + "/" + size_name;
    le.world_size = env.integer(size_name, s, 1, kMaxWorldSize, "");
    le.rank = env.integer(f.rank, r, 0, INT_MAX, "");
    if (le.rank >= le.world_size)
      throw RendezvousError(std::string(f.rank) + "=" + quoted(r) + " is not below " + size_name +
                            "=" + quoted(s) + ": ranks run from 0 to " +
                            std::to_string(le.world_size - 1));
    le.local_rank = le.rank;
    for (const char* n : f.local)
      if (const char* l = env.get(n)) {
        le.local_rank = env.integer(
            n, l, 0, le.world_size - 1,
            " (a local rank is below " + std::string(size_name) + "=" + quoted(s) + ")");
        le.variables += '/';
        le.variables += n;
        break;
      }
    break;
  }
  if (le.launcher.empty()) le.variables = "no launcher variables (a group of one)";
  find_address(env, le);
  return le;
}

LaunchEnv launch_env() {
  return launch_env([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

}  // namespace bp::dist
