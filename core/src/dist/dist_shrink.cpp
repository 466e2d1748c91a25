// Fault recovery: the surviving ranks of a group agree on who is left and continue as a smaller
// group (ProcessGroup::shrink).
//
// Note [Shrinking]
//   Keys under the old group's prefix + "shrink/":
//   1. Each survivor posts alive/<old rank> = the excluded list it was given ("" for none).
//   2. Membership. With a list: the members are the ranks not in it; a survivor waits for
//      every member's post, and a post with another list fails the shrink in every rank (the
//      reason under error). Without a list: a rank is dead once the old group's gone/<rank> is
//      set (the store sets it when that rank's liveness connection closes without leaving;
//      destroy_process_group sets it on the way out); a survivor waits until every rank has posted
//      or is dead, at most the timeout (a file store cannot tell death: the timeout decides).
//   3. The first survivor done with step 2 (an atomic add on decide) writes members = the ranks
//      it saw alive and not dead; every survivor reads that, so all agree even when a rank
//      died during step 2 or the timeout ran out. A survivor left out (it came too late), or
//      given a list that names it, gets a RendezvousError.
//   4. The new group: prefix <old prefix>s/ (a new store epoch), rank = position among the
//      members, sequence numbers from 0, its own store connections (a rank hosting the store
//      keeps hosting it) with a new monitor and liveness watch. Communicators: where the
//      old group has not failed and the plugin has BP_COMM_CAP_SHRINK, comm_shrink of the old
//      one (NCCL's ncclCommShrink); otherwise, if it has BP_COMM_CAP_REINIT, a new one is
//      created on first use among the members under the new prefix (Gloo: a new context);
//      otherwise BackendUnavailable quoting the plugin's reason.
//   5. The old group is released: its operations end (its communicators were aborted when it
//      failed; a shrunk parent is aborted too, as the excluded ranks never join its teardown),
//      its communicators are destroyed and its connections leave the store.
#include "dist/dist_internal.hpp"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <sstream>
#include <thread>

namespace bp::dist::internal {

namespace {

std::string list_text(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) v.push_back(std::stoi(item));
  return v;
}

template <typename Slot>
bool has_slot(const bp_comm_api* api, size_t offset, Slot slot) {
  return api->abi_minor >= 2 && api->struct_size >= offset + sizeof(slot) && slot != nullptr;
}

// The vendor ordinal and DLPack type of a device's memory, read from a one-byte buffer.
NativeBuffer memory_location(Device& dev) {
  std::shared_ptr<Buffer> b = dev.allocator().allocate(1);
  return b->native(0);
}

// The plugin's bp_comm_capability bits; 1.0 plugins: abort from any thread and re-init.
uint64_t capabilities_of(const bp_comm_api* api, std::string& reason) {
  if (!has_slot(api, offsetof(bp_comm_api, capabilities), api->capabilities)) {
    reason = "comm ABI " + std::to_string(api->abi_major) + "." + std::to_string(api->abi_minor) +
             " plugin: comm_shrink is comm ABI 1.2";
    return BP_COMM_CAP_ABORT_ANY_THREAD | BP_COMM_CAP_REINIT;
  }
  const char* r = "";
  uint64_t bits = api->capabilities(&r);
  reason = r ? r : "";
  return bits;
}

struct Agreement {
  std::vector<int> members;  // old ranks, ascending
  std::vector<int> dropped;
};

// Note [Shrinking] steps 1 to 3.
Agreement agree(Group& old, const std::vector<int>& excluded_in) {
  Store& st = *old.store;
  const std::string base = old.prefix + "shrink/";
  std::vector<int> excluded = excluded_in;
  std::sort(excluded.begin(), excluded.end());
  for (size_t i = 0; i < excluded.size(); ++i) {
    int r = excluded[i];
    if (r < 0 || r >= old.size)
      throw RendezvousError("shrink: excluded rank " + std::to_string(r) +
                            " is not a rank of the group (0 to " + std::to_string(old.size - 1) +
                            ")");
    if (i && excluded[i - 1] == r)
      throw RendezvousError("shrink: rank " + std::to_string(r) + " is excluded twice");
    if (r == old.rank)
      throw RendezvousError("shrink: rank " + std::to_string(r) +
                            " is in excluded_ranks but called shrink; the excluded ranks do not "
                            "call it");
  }
  if (static_cast<int>(excluded.size()) >= old.size)
    throw RendezvousError("shrink: excluding every rank leaves no group");
  const bool listed = !excluded.empty();
  const std::string mine = list_text(excluded);
  auto fail_all = [&](const std::string& msg) -> RendezvousError {
    try {
      if (!st.try_get(base + "error"))
        st.set(base + "error", "rank " + std::to_string(old.rank) + ": " + msg);
    } catch (const Error&) {
    }
    return RendezvousError("shrink on " + old.where() + " failed: " + msg);
  };
  st.set(base + "alive/" + std::to_string(old.rank), mine);
  debug_log(&old, "shrink: waiting for the survivors" +
                      (listed ? " (excluding " + mine + ")" : std::string()));

  std::vector<int> state(static_cast<size_t>(old.size), 0);  // 0 unknown, 1 alive, 2 dead
  state[static_cast<size_t>(old.rank)] = 1;
  auto deadline = Clock::now() + old.timeout;
  std::optional<std::string> decided;
  for (;;) {
    if ((decided = st.try_get(base + "members"))) break;
    if (auto e = st.try_get(base + "error"))
      throw RendezvousError("shrink on " + old.where() + " failed: " + *e);
    bool complete = true;
    for (int r = 0; r < old.size; ++r) {
      int& s = state[static_cast<size_t>(r)];
      bool member = !std::binary_search(excluded.begin(), excluded.end(), r);
      if (listed && !member) continue;
      if (s != 2 && !listed && st.try_get(old.gone_key(r))) s = 2;
      if (s == 0) {
        if (auto v = st.try_get(base + "alive/" + std::to_string(r))) {
          if (*v != mine)
            throw fail_all("rank " + std::to_string(r) + " excludes [" + *v + "], rank " +
                           std::to_string(old.rank) + " excludes [" + mine +
                           "]; every survivor must pass the same excluded_ranks");
          s = 1;
        }
      }
      if (s == 0) complete = false;
    }
    if (complete || Clock::now() >= deadline) {
      if (listed && !complete) {
        std::vector<int> missing;
        for (int r = 0; r < old.size; ++r)
          if (state[static_cast<size_t>(r)] == 0 &&
              !std::binary_search(excluded.begin(), excluded.end(), r))
            missing.push_back(r);
        throw fail_all("rank(s) " + list_text(missing) + " did not call shrink within " +
                       seconds(old.timeout));
      }
      if (st.add(base + "decide", 1) == 1) {
        std::vector<int> members;
        for (int r = 0; r < old.size; ++r)
          if (state[static_cast<size_t>(r)] == 1 &&
              (listed || !st.try_get(old.gone_key(r)) || r == old.rank))
            members.push_back(r);
        st.set(base + "members", list_text(members));
      }
      decided = st.get(base + "members", std::max(milliseconds(1000), old.timeout / 10));
      break;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  Agreement a;
  a.members = parse_list(*decided);
  if (!std::binary_search(a.members.begin(), a.members.end(), old.rank))
    throw RendezvousError("shrink on " + old.where() + ": the survivors agreed on ranks [" +
                          *decided + "] without this rank (it called shrink after they decided)");
  for (int r = 0; r < old.size; ++r)
    if (!std::binary_search(a.members.begin(), a.members.end(), r)) a.dropped.push_back(r);
  return a;
}

// comm_shrink of one communicator of the old group into `g` (Note [Shrinking] step 4).
void shrink_communicator(Group& g, const std::string& type, Communicator& c,
                         const std::vector<int>& dropped) {
  auto nc = std::make_unique<Communicator>();
  nc->api = c.api;
  nc->plugin = c.plugin;
  nc->device = c.device;
  nc->host_ctx =
      std::make_unique<HostCtx>(HostCtx{&g, g.prefix + "comm/" + c.plugin + "/" + type + "/"});
  std::string local = g.store->local_address();
  bp_comm_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.rank = g.rank;
  cfg.world_size = g.size;
  cfg.device_type = type.c_str();
  NativeBuffer loc = memory_location(*c.device);
  cfg.device_ordinal = loc.device_ordinal;
  cfg.dlpack_device_type = loc.dlpack_device_type;
  cfg.timeout_ms = g.timeout.count();
  cfg.local_address = local.c_str();
  cfg.flags = g.nonblocking ? BP_COMM_CONFIG_NONBLOCKING : 0u;
  std::vector<int32_t> ex(dropped.begin(), dropped.end());
  debug_log(&g, "shrinking the " + c.plugin + " communicator of " + c.device->str() + " to " +
                    std::to_string(g.size) + " ranks");
  if (bp_error* e = c.api->comm_shrink(c.comm, ex.data(), static_cast<int32_t>(ex.size()), &cfg, 0,
                                       &nc->comm))
    bp::detail::throw_comm_error(
        c.api, e,
        "shrinking the " + c.plugin + " communicator of " + c.device->str() + " on " + g.where());
  std::lock_guard<std::mutex> l(g.mu);
  g.abortable.push_back(nc.get());
  g.comms[type] = std::move(nc);
}

}  // namespace

std::shared_ptr<Group> shrink(const std::shared_ptr<Group>& old, const std::vector<int>& excluded,
                              std::vector<int>& dropped) {
  Group& o = *old;
  if (o.size == 1 && excluded.empty()) {
    dropped.clear();
    return old;
  }
  std::lock_guard<std::recursive_mutex> issue(o.issue_mu);
  Agreement a = agree(o, excluded);
  dropped = a.dropped;

  auto g = std::make_shared<Group>();
  g->rank = static_cast<int>(std::lower_bound(a.members.begin(), a.members.end(), o.rank) -
                             a.members.begin());
  g->size = static_cast<int>(a.members.size());
  g->local_rank = o.local_rank;
  g->timeout = o.timeout;
  g->check = o.check;
  g->prefix = o.prefix + "s/";
  g->backend_spec = o.backend_spec;
  g->backend_for_type = o.backend_for_type;
  g->backend_all = o.backend_all;
  g->last_device = o.last_device;
  g->server = std::move(o.server);
  g->store = o.store->clone();
  if (g->size > 1) {
    g->monitor_store = o.store->clone();
    watch_liveness(*g);
  }

  // Communicators: shrink what can be shrunk; check that the rest can be re-created.
  std::vector<Communicator*> shrunk;
  for (auto& [type, c] : o.comms) {
    std::string reason;
    uint64_t caps = capabilities_of(c->api, reason);
    if (!o.failed.load() && (caps & BP_COMM_CAP_SHRINK) &&
        has_slot(c->api, offsetof(bp_comm_api, comm_shrink), c->api->comm_shrink)) {
      shrink_communicator(*g, type, *c, a.dropped);
      shrunk.push_back(c.get());
      continue;
    }
    if (!(caps & BP_COMM_CAP_REINIT))
      throw BackendUnavailable("shrink: the " + c->plugin + " communicator of " + c->device->str() +
                               " can neither shrink nor be re-initialised: " + reason);
    debug_log(g.get(), "the " + c->plugin + " communicator of " + c->device->str() +
                           " is re-created among the survivors on first use (" + reason + ")");
  }

  // Note [Shrinking] step 5. A shrunk parent is aborted, not finalised: the excluded ranks
  // never take part in its teardown.
  for (Communicator* c : shrunk)
    if (bp_error* e = c->api->comm_abort(c->comm)) bp::detail::take_comm_error(c->api, e);
  release_operations(o, Clock::now() + std::min(o.timeout, milliseconds(5000)));
  if (o.size > 1) {
    try {
      o.monitor_store->leave();
      o.liveness_store->leave();
    } catch (const Error&) {
    }
  }
  debug_log(g.get(), "shrunk: rank " + std::to_string(o.rank) + " of " + std::to_string(o.size) +
                         " is rank " + std::to_string(g->rank) + " of " + std::to_string(g->size) +
                         " (dropped " + list_text(a.dropped) + ")");
  g->start_monitor();
  return g;
}

}  // namespace bp::dist::internal

namespace bp::dist {

std::string comm_capability_names(uint64_t capabilities) {
  static const std::pair<uint64_t, const char*> names[] = {
      {BP_COMM_CAP_ABORT_ANY_THREAD, "abort-any-thread"},
      {BP_COMM_CAP_SHRINK, "shrink"},
      {BP_COMM_CAP_REINIT, "reinit"}};
  std::string s;
  for (const auto& [bit, name] : names)
    if (capabilities & bit) {
      if (!s.empty()) s += ',';
      s += name;
    }
  return s.empty() ? "none" : s;
}

}  // namespace bp::dist
