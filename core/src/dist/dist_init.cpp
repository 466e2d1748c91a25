// The default process group: configuration from the environment, the rendezvous, and
// leaving the group.
//
// Note [Rendezvous]
//   1. Rank and world size come from the options, else the launcher's variables (Note
//      [Launchers] in dist_launch.hpp: bp-run, torchrun, Open MPI, PMIx, MPICH, Slurm).
//   2. The store: the options' init_method, else the launcher's address (Note [Launchers]):
//      file:///dir (a directory every rank sees) or tcp://host:port (rank 0 listens on that
//      port of that address only — tcp://0.0.0.0:port for every interface — unless
//      BACKPLANE_STORE_HOSTED=1 says the launcher hosts it; every connection presents
//      BACKPLANE_STORE_SECRET, Note [Store limits]), else, for a group of one, an in-process
//      store.
//   3. Each rank claims its rank with an atomic add (a second claim is an error in both
//      processes: two processes started with one rank, or a file store left over from another
//      run), posts what it was configured with (world size, collective checks, backend), and
//      waits for every rank's post, comparing each as it arrives: a rank that disagrees fails
//      the rendezvous at once in every rank that sees it, and posts the reason under
//      rdzv/error so that the ranks still waiting fail too. Ranks that never come are named
//      when the timeout passes.
//   Keys live under bp/g<n>/, n counting the groups this process initialised, so a program
//   may destroy and re-create its group with one store (bp-run's).
#include "dist/dist_internal.hpp"

#include <backplane/dist_launch.hpp>

#include <backplane/runtime.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

namespace bp::dist {

using internal::Clock;
using internal::Group;
using std::chrono::milliseconds;

namespace {

std::mutex g_mu;
// Never destroyed: a process that exits without destroy_process_group must not join threads
// from static destructors (its store connection closing tells the other ranks).
ProcessGroup* g_default = nullptr;
int g_generation = 0;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

struct InitMethod {
  enum class Kind { none, file, tcp } kind = Kind::none;
  std::string path, host;
  int port = 0;
  std::string text;
};

InitMethod parse_init(const std::string& s, const std::string& from) {
  InitMethod m;
  m.text = s;
  auto bad = [&](const std::string& why) -> RendezvousError {
    return RendezvousError(from + "='" + s + "' " + why +
                           "; expected file:///absolute/dir or tcp://host:port");
  };
  if (s.rfind("file://", 0) == 0) {
    m.kind = InitMethod::Kind::file;
    m.path = s.substr(7);
    if (m.path.empty() || m.path[0] != '/') throw bad("does not name an absolute path");
    return m;
  }
  if (s.rfind("tcp://", 0) == 0) {
    m.kind = InitMethod::Kind::tcp;
    std::string rest = s.substr(6);
    size_t colon;
    if (!rest.empty() && rest[0] == '[') {
      size_t close = rest.find(']');
      if (close == std::string::npos) throw bad("has an unclosed '['");
      m.host = rest.substr(1, close - 1);
      colon = close + 1;
      if (colon >= rest.size() || rest[colon] != ':') throw bad("has no port");
    } else {
      colon = rest.rfind(':');
      if (colon == std::string::npos) throw bad("has no port");
      m.host = rest.substr(0, colon);
    }
    std::string port = rest.substr(colon + 1);
    while (!port.empty() && port.back() == '/') port.pop_back();
    char* end = nullptr;
    long p = std::strtol(port.c_str(), &end, 10);
    if (m.host.empty()) throw bad("has no host");
    if (port.empty() || *end || p < 1 || p > 65535) throw bad("has no port between 1 and 65535");
    m.port = static_cast<int>(p);
    return m;
  }
  throw bad("is not a rendezvous address");
}

milliseconds timeout_from(const InitOptions& o) {
  if (o.timeout.count() > 0) return o.timeout;
  if (const char* v = env("BACKPLANE_DIST_TIMEOUT")) {
    char* end = nullptr;
    double sec = std::strtod(v, &end);
    // 1 ms to a year: inf, 1e300 (overflowing milliseconds) and 1e-9 (0 ms) are refused here.
    if (*end || !(sec >= 0.001 && sec <= 31536000.0))
      throw RendezvousError(std::string("BACKPLANE_DIST_TIMEOUT='") + std::string(v).substr(0, 64) +
                            "' is not a number of seconds from 0.001 to 31536000");
    return milliseconds(static_cast<int64_t>(sec * 1000));
  }
  return milliseconds(300000);
}

// Every connection to a TCP store presents BACKPLANE_STORE_SECRET (bp-run
// generates one for its ranks; several hosts export one value on each).
std::string store_secret() {
  const char* v = env("BACKPLANE_STORE_SECRET");
  if (!v)
    throw RendezvousError(
        "BACKPLANE_STORE_SECRET is not set: a tcp:// rendezvous needs the same secret of 16 to "
        "1024 characters on every rank (bp-run sets one; across hosts export e.g. the output of "
        "`openssl rand -hex 16` on each)");
  size_t n = std::strlen(v);
  if (n < 16 || n > 1024)
    throw RendezvousError("BACKPLANE_STORE_SECRET has " + std::to_string(n) +
                          " characters; it needs 16 to 1024");
  return v;
}

void parse_backend(Group& g, const std::string& spec) {
  g.backend_spec = spec;
  if (spec.empty()) return;
  if (spec.find(':') == std::string::npos) {
    g.backend_all = spec;
    return;
  }
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t c = item.find(':');
    if (c == std::string::npos || c == 0 || c + 1 == item.size())
      throw DistError("backend '" + spec + "': '" + item +
                      "' is not type:plugin (e.g. cpu:gloo,cuda:nccl)");
    g.backend_for_type[item.substr(0, c)] = item.substr(c + 1);
  }
}

// Every communicator plugin the backend option names exists (a typo such as "ncl" must not
// silently mean Gloo); BackendUnavailable listing those found otherwise.
void check_backend_names(const Group& g, const char* from) {
  std::vector<std::string> names;
  if (!g.backend_all.empty()) names.push_back(g.backend_all);
  for (const auto& [type, name] : g.backend_for_type) names.push_back(name);
  if (names.empty()) return;
  const auto& reg = bp::detail::CommRegistry::get();
  for (const auto& n : names) {
    if (reg.find(n)) continue;
    std::string found;
    for (const auto& p : reg.plugins()) found += (found.empty() ? "" : ", ") + p.report.name;
    throw BackendUnavailable(std::string(from) + "='" + g.backend_spec.substr(0, 64) +
                             "': no communicator plugin '" + n.substr(0, 64) +
                             "' was found (found: " + (found.empty() ? "none" : found) +
                             "); bp-smi lists them");
  }
}

std::string hostname() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

std::map<std::string, std::string> parse_fields(const std::string& s) {
  std::map<std::string, std::string> m;
  std::stringstream ss(s);
  std::string kv;
  while (std::getline(ss, kv, ';')) {
    size_t e = kv.find('=');
    if (e != std::string::npos) m[kv.substr(0, e)] = kv.substr(e + 1);
  }
  return m;
}

std::string rank_list(const std::vector<int>& r) {
  std::string s;
  for (size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + std::to_string(r[i]);
  return s;
}

// Note [Rendezvous] step 3.
void rendezvous(Group& g, const std::string& where) {
  Store& st = *g.store;
  std::string base = g.prefix + "rdzv/";
  auto fail_all = [&](const std::string& msg) {
    try {
      if (!st.try_get(base + "error"))
        st.set(base + "error", "rank " + std::to_string(g.rank) + ": " + msg);
    } catch (const Error&) {
    }
    throw RendezvousError("rendezvous at " + where + " failed on rank " + std::to_string(g.rank) +
                          ": " + msg);
  };
  int64_t claims = st.add(base + "claim/" + std::to_string(g.rank), 1);
  if (claims != 1)
    fail_all("rank " + std::to_string(g.rank) +
             " was claimed twice: two processes were started with the same rank, or the store "
             "holds state from an earlier run (give file:// a fresh directory)");
  std::string mine = "world_size=" + std::to_string(g.size) +
                     ";check=" + std::to_string(static_cast<int>(g.check_mode)) +
                     ";backend=" + g.backend_spec + ";host=" + hostname() +
                     ";pid=" + std::to_string(::getpid());
  st.set(base + "rank/" + std::to_string(g.rank), mine);
  auto me = parse_fields(mine);
  std::vector<std::string> keys;
  for (int r = 0; r < g.size; ++r) keys.push_back(base + "rank/" + std::to_string(r));
  std::vector<bool> seen(static_cast<size_t>(g.size), false);
  auto compare = [&](int r, const std::string& v) {
    auto f = parse_fields(v);
    auto differs = [&](const char* field, const char* what) {
      if (f[field] != me[field])
        fail_all("rank " + std::to_string(r) + " (pid " + f["pid"] + " on " + f["host"] + ") has " +
                 what + " " + (f[field].empty() ? "''" : f[field]) + ", rank " +
                 std::to_string(g.rank) + " has " + (me[field].empty() ? "''" : me[field]));
    };
    differs("world_size", "world size");
    differs("check",
            "collective check mode (BACKPLANE_DIST_CHECK; 0 off, 1 first call, 2 every call)");
    differs("backend", "backend");
    seen[static_cast<size_t>(r)] = true;
  };
  auto deadline = Clock::now() + g.timeout;
  for (;;) {
    try {
      auto values = st.get(keys, milliseconds(100));
      for (int r = 0; r < g.size; ++r) compare(r, values[static_cast<size_t>(r)]);
      return;
    } catch (const StoreTimeout&) {
    }
    if (auto e = st.try_get(base + "error"))
      throw RendezvousError("rendezvous at " + where + " failed: " + *e);
    for (int r = 0; r < g.size; ++r)
      if (!seen[static_cast<size_t>(r)])
        if (auto v = st.try_get(keys[static_cast<size_t>(r)])) compare(r, *v);
    if (Clock::now() >= deadline) {
      std::vector<int> missing, joined;
      for (int r = 0; r < g.size; ++r)
        (seen[static_cast<size_t>(r)] ? joined : missing).push_back(r);
      throw RendezvousError(
          "rendezvous at " + where + ": rank(s) " + rank_list(missing) + " did not join within " +
          std::to_string(static_cast<double>(g.timeout.count()) / 1000.0).substr(0, 6) +
          " s (world size " + std::to_string(g.size) + "; joined: " + rank_list(joined) + ")");
    }
  }
}

}  // namespace

void internal::watch_liveness(Group& g) {
  g.liveness_store = g.store->clone();
  g.liveness_store->set_on_disconnect(g.gone_key(g.rank), std::to_string(::getpid()));
  g.monitor_store->set_on_disconnect(
      g.abort_key(), internal::encode_failure(
                         internal::FailKind::peer,
                         "rank " + std::to_string(g.rank) + " (pid " + std::to_string(::getpid()) +
                             ") exited without leaving the process group: its connection to the "
                             "rendezvous store closed"));
}

// ---- ProcessGroup accessors -------------------------------------------------------------------

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;
int ProcessGroup::rank() const noexcept {
  return impl_->g->rank;
}
int ProcessGroup::size() const noexcept {
  return impl_->g->size;
}
int ProcessGroup::local_rank() const noexcept {
  return impl_->g->local_rank;
}
std::chrono::milliseconds ProcessGroup::timeout() const noexcept {
  return impl_->g->timeout;
}
Store& ProcessGroup::store() {
  return *impl_->g->store;
}
void ProcessGroup::abort(const std::string& reason) {
  impl_->g->fail(internal::FailKind::peer,
                 "aborted by rank " + std::to_string(rank()) + ": " + reason);
}

// ---- init / destroy ---------------------------------------------------------------------------

void init_process_group(const InitOptions& options) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_default)
    throw DistError("init_process_group: a process group is already initialised (rank " +
                    std::to_string(g_default->rank()) + " of " + std::to_string(g_default->size()) +
                    "); call destroy_process_group first");
  auto g = std::make_shared<Group>();
  LaunchEnv info;
  if (options.rank >= 0 || options.world_size >= 0) {
    if (options.rank < 0 || options.world_size < 1)
      throw RendezvousError("init_process_group: give both rank and world_size (got rank " +
                            std::to_string(options.rank) + ", world_size " +
                            std::to_string(options.world_size) + ")");
    info.rank = options.rank;
    info.world_size = options.world_size;
    info.local_rank = -1;
    info.variables = "InitOptions";
  } else {
    // The options' address stands in for BACKPLANE_INIT, so that it is not asked for.
    info = launch_env([&](const char* name) -> const char* {
      if (!options.init_method.empty() && std::strcmp(name, "BACKPLANE_INIT") == 0)
        return options.init_method.c_str();
      return std::getenv(name);
    });
  }
  if (info.rank >= info.world_size)
    throw RendezvousError("rank " + std::to_string(info.rank) + " (from " + info.variables +
                          ") is not below the world size " + std::to_string(info.world_size));
  g->rank = info.rank;
  g->size = info.world_size;
  g->local_rank = info.local_rank >= 0 ? info.local_rank : info.rank;
  g->timeout = timeout_from(options);
  g->check_mode = options.check_collectives ? options.checks : CollectiveChecks::off;
  if (const char* chk = env("BACKPLANE_DIST_CHECK"); chk && *chk) {
    if (std::strcmp(chk, "0") == 0)
      g->check_mode = CollectiveChecks::off;
    else if (std::strcmp(chk, "1") == 0)
      g->check_mode = CollectiveChecks::first_call;
    else if (std::strcmp(chk, "full") == 0)
      g->check_mode = CollectiveChecks::every_call;
    else
      throw RendezvousError(std::string("BACKPLANE_DIST_CHECK='") + std::string(chk).substr(0, 64) +
                            "' is not 0 (no descriptor checks), 1 (each signature's first call, "
                            "the default) or full (every call)");
  }
  g->check = g->check_mode != CollectiveChecks::off;
  if (const char* fr = env("BACKPLANE_DIST_FLIGHT_RECORDER"); fr && *fr) {
    char* end = nullptr;
    long long n = std::strtoll(fr, &end, 10);
    if (*end != '\0' || n < 0 || n > 1000000)
      throw RendezvousError(std::string("BACKPLANE_DIST_FLIGHT_RECORDER='") +
                            std::string(fr).substr(0, 64) +
                            "' is not a number of operations from 0 (off) to 1000000");
    g->flight.set_capacity(static_cast<size_t>(n));
  }
  if (const char* nb = env("BACKPLANE_DIST_NONBLOCKING"); nb && *nb) {
    if (std::strcmp(nb, "0") != 0 && std::strcmp(nb, "1") != 0)
      throw RendezvousError(std::string("BACKPLANE_DIST_NONBLOCKING='") +
                            std::string(nb).substr(0, 64) +
                            "' is not 0 (blocking communicators, the default) or 1");
    g->nonblocking = std::strcmp(nb, "1") == 0;
  } else {
    g->nonblocking = options.nonblocking;
  }
  std::string backend = options.backend;
  if (backend.empty())
    if (const char* b = env("BACKPLANE_DIST_BACKEND")) backend = b;
  parse_backend(*g, backend);
  if (g->size > 1)
    check_backend_names(
        *g, options.backend.empty() ? "BACKPLANE_DIST_BACKEND" : "InitOptions::backend");
  g->prefix = "bp/g" + std::to_string(g_generation) + "/";

  // The store (Note [Rendezvous] step 2).
  std::string init = options.init_method, from = "init_method";
  if (init.empty() && info.variables != "InitOptions") {
    init = info.init_method;
    from = info.init_from;
  } else if (init.empty()) {
    if (const char* v = env("BACKPLANE_INIT")) {
      init = v;
      from = "BACKPLANE_INIT";
    } else if (env("MASTER_ADDR") && env("MASTER_PORT")) {
      init = std::string("tcp://") + env("MASTER_ADDR") + ":" + env("MASTER_PORT");
      from = "MASTER_ADDR/MASTER_PORT";
    }
  }
  std::string where = "memory";
  if (init.empty()) {
    if (g->size > 1)
      throw RendezvousError(
          "init_process_group: rank " + std::to_string(g->rank) + " of " + std::to_string(g->size) +
          " has no rendezvous: set BACKPLANE_INIT=file:///shared/dir or tcp://host:port (bp-run "
          "sets it), or MASTER_ADDR and MASTER_PORT");
    g->store = std::make_unique<MemoryStore>();
  } else {
    InitMethod m = parse_init(init, from);
    where = m.text;
    if (m.kind == InitMethod::Kind::file) {
      g->store = std::make_unique<FileStore>(m.path);
    } else {
      std::string secret = store_secret();
      const char* hosted = env("BACKPLANE_STORE_HOSTED");
      if (g->rank == 0 && !(hosted && std::strcmp(hosted, "1") == 0))
        g->server = std::make_unique<TcpStoreServer>(m.host, m.port, secret);
      g->store = std::make_unique<TcpStore>(m.host, m.port, g->timeout, secret);
    }
  }
  if (g->size > 1) {
    g->monitor_store = g->store->clone();
    rendezvous(*g, where);
    internal::watch_liveness(*g);
  }
  internal::debug_log(
      g.get(),
      "joined: rank " + std::to_string(g->rank) + " of " + std::to_string(g->size) + " through " +
          where + " (" +
          (info.launcher.empty() ? info.variables : info.launcher + ": " + info.variables) + ")");
  g->start_monitor();
  ++g_generation;
  auto impl = std::make_unique<ProcessGroup::Impl>();
  impl->g = std::move(g);
  g_default = new ProcessGroup(std::move(impl));
}

std::vector<int> ProcessGroup::shrink(const std::vector<int>& excluded_ranks) {
  std::vector<int> dropped;
  impl_->g = internal::shrink(impl_->g, excluded_ranks, dropped);
  return dropped;
}

std::vector<int> shrink_group(const std::vector<int>& excluded_ranks) {
  return group().shrink(excluded_ranks);
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_default != nullptr;
}

ProcessGroup& group() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_default)
    throw DistError("no process group is initialised: call bp::dist::init_process_group() first");
  return *g_default;
}

void internal::release_operations(Group& g, Clock::time_point deadline) {
  // Operations still running: wait for them (bounded), then release their handles.
  std::vector<std::shared_ptr<Work::State>> live;
  {
    std::lock_guard<std::mutex> l(g.mu);
    for (auto& p : g.live)
      if (auto w = p.lock()) live.push_back(std::move(w));
  }
  for (auto& w : live) {
    try {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (!g.failed.load()) Work(w).wait(std::max(left, milliseconds(0)));
    } catch (const Error&) {
    }
  }
  // Dropped Works alike (Note [Dropped works]): until they are done, the group failed (an
  // orphan that outlives the timeout fails it) or the deadline passed.
  for (;;) {
    g.reap_orphans(*g.store);
    {
      std::lock_guard<std::mutex> l(g.mu);
      if (g.orphans.empty() || g.failed.load() || Clock::now() >= deadline) break;
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  g.stop_monitor();
  bool incomplete = false;
  for (auto& w : live) {
    std::lock_guard<std::mutex> l(w->mu);
    if (!w->complete && w->handle) incomplete = true;
  }
  {
    std::lock_guard<std::mutex> l(g.mu);
    if (!g.orphans.empty()) incomplete = true;  // aborted below before they are waited for
  }
  if (incomplete && !g.failed.load())
    g.fail(internal::FailKind::generic, "destroy_process_group with operations still running");
  if (incomplete || g.failed.load())
    for (auto& [type, c] : g.comms)
      if (bp_error* e = c->api->comm_abort(c->comm)) bp::detail::take_comm_error(c->api, e);
  for (auto& w : live) {
    std::lock_guard<std::mutex> l(w->mu);
    if (w->handle) {
      // Bounded: aborted operations complete promptly (comm_abi.h).
      if (!w->complete) w->comm->api->work_wait(w->handle, 1000);
      w->comm->api->work_free(w->handle);
      w->handle = nullptr;
    }
    w->detached = !w->complete;
  }
  {
    std::vector<internal::Orphan> orphans;
    {
      std::lock_guard<std::mutex> l(g.mu);
      orphans.swap(g.orphans);
    }
    for (auto& o : orphans) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      if (bp_error* e = o.api->work_wait(o.handle, std::max<int64_t>(left, 1000)))
        bp::detail::take_comm_error(o.api, e);
      o.api->work_free(o.handle);
    }
  }
  for (auto& [type, c] : g.comms)
    if (bp_error* e = c->api->comm_destroy(c->comm)) bp::detail::take_comm_error(c->api, e);
  {
    std::lock_guard<std::mutex> l(g.mu);
    g.abortable.clear();
  }
  g.comms.clear();
}

void destroy_process_group() {
  std::unique_ptr<ProcessGroup> pg;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_default) throw DistError("destroy_process_group: no process group is initialised");
    pg.reset(g_default);
    g_default = nullptr;
  }
  Group& g = *pg->impl().g;
  auto deadline = Clock::now() + g.timeout;
  // Tell the others that this rank leaves, as its next collective: a rank still calling
  // collectives meets a MismatchError rather than a hang.
  if (g.size > 1 && g.check && !g.failed.load()) {
    std::lock_guard<std::recursive_mutex> l(g.issue_mu);
    internal::Check c;
    c.kind = internal::Check::Kind::leave;
    c.seq = ++g.seq;
    c.descriptor = "destroy_process_group (left the group)";
    g.enqueue(std::move(c));
  }
  internal::release_operations(g, deadline);
  // Leave the store: the last rank clears a file store; the rank hosting a TCP store keeps it
  // up until the others have left (bounded), so their last requests are answered.
  if (g.size > 1) {
    try {
      // Left, not dead: survivors agreeing on a shrink need not wait for this rank.
      g.store->set(g.gone_key(g.rank), "left");
      g.monitor_store->leave();
      g.liveness_store->leave();
      int64_t left = g.store->add(g.prefix + "left", 1);
      if (auto* fs = dynamic_cast<FileStore*>(g.store.get()); fs && left == g.size) fs->clear();
      if (g.server) {
        auto until = Clock::now() + (g.failed.load() ? milliseconds(2000)
                                                     : std::min(g.timeout, milliseconds(30000)));
        while (g.store->add(g.prefix + "left", 0) < g.size && Clock::now() < until)
          std::this_thread::sleep_for(milliseconds(20));
      }
    } catch (const Error&) {
    }
  }
  internal::debug_log(&g, "left the process group");
}

// ---- shorthands ---------------------------------------------------------------------------------

int get_rank() {
  return group().rank();
}
int get_world_size() {
  return group().size();
}
int get_local_rank() {
  return group().local_rank();
}

Device& local_device(std::string_view type) {
  int n = num_devices(type);
  if (n == 0) return bp::device("cpu:0");
  int local = is_initialized() ? group().local_rank() : 0;
  return bp::device(std::string(type) + ":" + std::to_string(local % n));
}

Work all_reduce(const Tensor& t, ReduceOp op) {
  return group().all_reduce(t, op);
}
Work broadcast(const Tensor& t, int root) {
  return group().broadcast(t, root);
}
Work all_gather(const Tensor& out, const Tensor& in) {
  return group().all_gather(out, in);
}
Work reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) {
  return group().reduce_scatter(out, in, op);
}
Work send(const Tensor& t, int dst) {
  return group().send(t, dst);
}
Work recv(const Tensor& t, int src) {
  return group().recv(t, src);
}
std::vector<Work> batch_isend_irecv(const std::vector<ProcessGroup::P2POp>& ops) {
  return group().batch_isend_irecv(ops);
}
void barrier() {
  group().barrier();
}

}  // namespace bp::dist
