// The process group's monitor thread: collective checks, failure propagation and the
// watchdog; the store callbacks given to communicator plugins.
//
// Note [Collective checks]
//   Every collective gets a number. The issuing thread queues a descriptor of the call
//   ("all_reduce f32 [1000] sum on cpu") for the monitor thread and goes on: the data path never
//   waits for a check. The monitor posts it under c/<seq>/<rank>, then fetches every rank's
//   descriptor of that number in one multi-key get, and compares them all itself, so every
//   rank finds a mismatch on its own and names every rank's call. The check releases the Work
//   (Work::wait returns only after both the plugin and the check are done); a mismatch fails
//   the group in every rank even when the plugin completed (same-size garbage from an f32 vs
//   i32 all_reduce) or hung (different sizes under NCCL). The rank whose add on c/<seq>/n
//   reaches the world size erases the keys. Cost: three round trips to the store on the
//   monitor thread (~0.1 ms on a local TCP store), overlapping the operation, for each burst
//   of collectives: the monitor posts every descriptor queued since its last turn in one
//   pipelined request (Store::set_many), verifies the run of up to kCheckBatch checks whose
//   descriptors every rank has posted in one multi-key get that does not wait, and counts them
//   in one Store::add_many; only a check some rank has not reached yet is waited for alone.
//   So back-to-back small collectives are not held to one check per three round trips.
//   The monitor posts every queued descriptor before it waits on any, so two ranks whose
//   checks are queued in different orders (point to point around collectives) never wait on
//   each other. Point to point: the sender posts p/<src>-<dst>/<n>; the receiver verifies it
//   against its own call and erases it.
//
// Note [Failure propagation]
//   A rank that fails (its own timeout, a mismatch, an error from its plugin) records the
//   group's first failure, aborts its communicators (so operations blocked inside NCCL or Gloo
//   return) and writes "rank R: what happened" under the group's abort key. Every monitor polls
//   that key (every 100 ms) and fails its group with a PeerError quoting it. The monitor's
//   store connection also asks the TCP store to set the abort key should the connection close
//   before the rank leaves, so a rank that crashes is reported at once rather than after the
//   timeout; with a file store, the timeout is the bound.
#include "dist/dist_internal.hpp"

#include <backplane/abi/error.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>

namespace bp::dist {

Work::State::~State() {
  if (flight && flight->state.load() == 0) flight->state = plugin_done.load() ? 1 : 2;
  if (!handle) return;
  if (!complete && !detached && g) {
    // Dropped before completion: the plugin may still use the memory (Note [Comm memory]), and
    // the copy-backs must still reach the tensors (Note [Dropped works]).
    std::lock_guard<std::mutex> l(g->mu);
    g->orphans.push_back(internal::Orphan{comm->api, handle, std::move(keep), std::move(tensors),
                                          description, start, std::move(finish), flight});
    return;
  }
  comm->api->work_free(handle);
}

}  // namespace bp::dist

namespace bp::dist::internal {

void raise(FailKind kind, const std::string& message) {
  switch (kind) {
    case FailKind::timeout:
      throw TimeoutError(message);
    case FailKind::mismatch:
      throw MismatchError(message);
    case FailKind::peer:
      throw PeerError(message);
    case FailKind::unavailable:
      throw BackendUnavailable(message);
    case FailKind::rendezvous:
      throw RendezvousError(message);
    case FailKind::generic:
      break;
  }
  throw DistError(message);
}

FailKind kind_of(const std::exception& e) {
  if (dynamic_cast<const TimeoutError*>(&e)) return FailKind::timeout;
  if (dynamic_cast<const MismatchError*>(&e)) return FailKind::mismatch;
  if (dynamic_cast<const PeerError*>(&e)) return FailKind::peer;
  if (dynamic_cast<const BackendUnavailable*>(&e)) return FailKind::unavailable;
  if (dynamic_cast<const RendezvousError*>(&e)) return FailKind::rendezvous;
  return FailKind::generic;
}

bool debug_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("BACKPLANE_DIST_DEBUG");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

void debug_log(const Group* g, const std::string& line) {
  if (!debug_enabled()) return;
  std::ostringstream os;
  os << "[backplane dist";
  if (g) os << " rank " << g->rank;
  os << "] " << line << "\n";
  std::cerr << os.str() << std::flush;
}

std::string seconds(milliseconds t) {
  std::ostringstream os;
  os << static_cast<double>(t.count()) / 1000.0 << " s";
  return os.str();
}

void Group::fail_from_plugin(int32_t code, const std::string& message, Store& st) {
  if (code == BP_COMM_ERROR_REMOTE || code == BP_COMM_ERROR_ABORTED) {
    // A peer's connection broke: usually another rank failed first and says why under the
    // abort key within a monitor period (Note [Failure propagation]). Prefer its reason.
    auto until = Clock::now() + milliseconds(1000);
    while (!failed.load() && Clock::now() < until) {
      try {
        if (auto v = st.try_get(abort_key())) {
          Failure f = decode_failure(*v);
          fail(f.kind, "another rank failed: " + f.message, false);
          break;
        }
      } catch (const Error&) {
        break;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  fail(kind_of_code(code), message);
}

std::string shape_text(const Tensor& t) {
  std::string s = "[";
  Shape sh = t.shape();
  for (size_t i = 0; i < sh.size(); ++i) s += (i ? ", " : "") + std::to_string(sh[i]);
  return s + "]";
}

// ---- failure ----------------------------------------------------------------------------------

void Group::fail(FailKind kind, const std::string& message, bool local) {
  std::vector<Communicator*> to_abort;
  {
    std::lock_guard<std::mutex> l(mu);
    if (failed.load()) return;
    failure = Failure{kind, message};
    failure_local = local;
    failed.store(true);
    to_abort = abortable;
  }
  debug_log(this, "group failed: " + message);
  for (Communicator* c : to_abort)
    if (bp_error* e = c->api->comm_abort(c->comm)) bp::detail::take_comm_error(c->api, e);
  cv.notify_all();
  if (local) publish_failure();
  dump_flight("the process group failed (" + message.substr(0, 200) + ")");
}

void Group::publish_failure() {
  if (size == 1) return;
  // Held across the write: a thread about to throw the failure waits for a write another
  // thread has started, so the process cannot exit (its store connection closing says "exited
  // without leaving") before the other ranks can read why (Note [Failure propagation]).
  std::lock_guard<std::mutex> publishing(publish_mu);
  std::string text;
  FailKind kind;
  {
    std::lock_guard<std::mutex> l(mu);
    if (!failed.load() || !failure_local || failure_published) return;
    text = "rank " + std::to_string(rank) + ": " + failure.message;
    kind = failure.kind;
  }
  // Each thread uses its own store connection.
  Store* st = std::this_thread::get_id() == monitor.get_id() ? monitor_store.get() : store.get();
  try {
    if (st && !st->try_get(abort_key())) st->set(abort_key(), encode_failure(kind, text));
  } catch (const Error&) {
  }
  std::lock_guard<std::mutex> l(mu);
  failure_published = true;
}

Failure Group::current_failure() {
  std::lock_guard<std::mutex> l(mu);
  return failure;
}

void Group::throw_if_failed(const std::string& context) {
  if (!failed.load()) return;
  publish_failure();  // before this thread can let the process exit
  Failure f = current_failure();
  raise(f.kind, f.message.rfind(context, 0) == 0 ? f.message : context + ": " + f.message);
}

// ---- the monitor --------------------------------------------------------------------------------

void Group::enqueue(Check c) {
  if (size == 1) {
    if (auto w = c.work.lock()) w->check_ok = true;
    return;
  }
  {
    std::lock_guard<std::mutex> l(mu);
    checks.push_back(std::move(c));
  }
  cv.notify_all();
}

void Group::track(const std::shared_ptr<Work::State>& w) {
  if (size == 1) return;
  std::lock_guard<std::mutex> l(mu);
  live.erase(std::remove_if(live.begin(), live.end(), [](const auto& p) { return p.expired(); }),
             live.end());
  live.push_back(w);
}

void Group::start_monitor() {
  if (size == 1) return;
  monitor = std::thread([this] { monitor_loop(); });
}

void Group::stop_monitor() {
  {
    std::lock_guard<std::mutex> l(mu);
    stopping = true;
  }
  cv.notify_all();
  if (monitor.joinable()) monitor.join();
}

namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// "ranks 0, 2 called X; rank 1 called Y" for the distinct descriptors.
std::string disagreement(const std::vector<std::string>& descs) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < descs.size(); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == descs[r]; });
    if (it == groups.end())
      groups.push_back({descs[r], {static_cast<int>(r)}});
    else
      it->second.push_back(static_cast<int>(r));
  }
  std::string s;
  for (size_t i = 0; i < groups.size(); ++i)
    s += (i ? "; " : "") + ranks_text(groups[i].second) + " called " + groups[i].first;
  return s;
}

}  // namespace

void Group::settle_collectives(const std::deque<Check>& checks, size_t count,
                               const std::vector<std::string>& descs) {
  std::vector<std::string> counters;
  for (size_t i = 0; i < count; ++i) {
    const Check& c = checks[i];
    const auto first = descs.begin() + static_cast<std::ptrdiff_t>(i * size);
    std::vector<std::string> mine_and_theirs(first, first + size);
    bool same = std::all_of(mine_and_theirs.begin(), mine_and_theirs.end(),
                            [&](const std::string& d) { return d == mine_and_theirs[0]; });
    if (!same) {
      fail(FailKind::mismatch, "ranks called different collectives as collective #" +
                                   std::to_string(c.seq) + ": " + disagreement(mine_and_theirs));
    } else if (auto w = c.work.lock()) {
      w->check_ok = true;
    }
    counters.push_back(check_base(c.seq) + "n");
  }
  // The rank whose add reaches the world size erases that number's keys.
  std::vector<int64_t> counts = monitor_store->add_many(counters, 1);
  std::vector<std::string> done;
  for (size_t i = 0; i < count; ++i) {
    if (counts[i] != size) continue;
    std::string base = check_base(checks[i].seq);
    for (int r = 0; r < size; ++r) done.push_back(base + std::to_string(r));
    done.push_back(base + "n");
  }
  if (!done.empty()) monitor_store->erase(done);
}

void Group::monitor_loop() {
  std::deque<Check> mine;
  auto last_poll = Clock::now() - milliseconds(1000);
  auto store_lost = [this](const std::exception& e) {
    fail(FailKind::peer,
         std::string("lost the rendezvous store (") + e.what() +
             "); the process hosting it has probably exited",
         false);
  };
  for (;;) {
    bool stop;
    {
      std::unique_lock<std::mutex> l(mu);
      if (mine.empty() && checks.empty() && !stopping)
        cv.wait_for(l, milliseconds(100), [&] { return stopping || !checks.empty(); });
      while (!checks.empty()) {
        mine.push_back(std::move(checks.front()));
        checks.pop_front();
      }
      stop = stopping;
    }
    try {
      // Post every queued descriptor before waiting on any (Note [Collective checks]), in one
      // round trip.
      // (Should set_many throw, `mine` is dropped below, so marking first is harmless.)
      std::vector<std::pair<std::string, std::string>> posts;
      const auto now = Clock::now();
      for (Check& c : mine) {
        if (c.is_posted) continue;
        if (c.kind == Check::Kind::collective || c.kind == Check::Kind::leave)
          posts.emplace_back(check_base(c.seq) + std::to_string(rank), c.descriptor);
        else if (c.kind == Check::Kind::p2p_post)
          posts.emplace_back(c.key, c.descriptor);
        c.is_posted = true;
        c.posted = now;
      }
      monitor_store->set_many(posts);
      while (!mine.empty() && (mine.front().kind == Check::Kind::p2p_post ||
                               mine.front().kind == Check::Kind::leave))
        mine.pop_front();
      if (failed.load()) mine.clear();
      publish_failure();
      if (stop) break;  // every descriptor is posted; destroy_process_group has waited
      // A run of collective checks at the front whose descriptors every rank has posted
      // already: verified together, in three round trips (Note [Collective checks]).
      size_t run = 0;
      while (run < mine.size() && run < kCheckBatch && mine[run].kind == Check::Kind::collective)
        ++run;
      if (run > 1) {
        std::vector<std::string> keys;
        for (size_t i = 0; i < run; ++i) {
          std::string base = check_base(mine[i].seq);
          for (int r = 0; r < size; ++r) keys.push_back(base + std::to_string(r));
        }
        std::optional<std::vector<std::string>> descs;
        try {
          descs = monitor_store->get(keys, milliseconds(0));
        } catch (const StoreTimeout&) {
          // Some rank is behind: the front check alone, waiting, below.
        }
        if (descs) {
          settle_collectives(mine, run, *descs);
          mine.erase(mine.begin(), mine.begin() + static_cast<std::ptrdiff_t>(run));
          {
            std::lock_guard<std::mutex> l(mu);
            check_note.clear();
          }
          cv.notify_all();
        }
      }
      if (!mine.empty()) {
        Check& c = mine.front();
        auto w = c.work.lock();
        try {
          if (c.kind == Check::Kind::collective) {
            std::vector<std::string> keys;
            std::string base = check_base(c.seq);
            for (int r = 0; r < size; ++r) keys.push_back(base + std::to_string(r));
            std::vector<std::string> descs = monitor_store->get(keys, milliseconds(50));
            settle_collectives(mine, 1, descs);
          } else {  // p2p_verify
            std::string theirs = monitor_store->get(c.key, milliseconds(50));
            monitor_store->erase({c.key});
            if (theirs != c.descriptor)
              fail(FailKind::mismatch, "point-to-point transfer " + c.key.substr(prefix.size()) +
                                           " does not match: the sender called " + theirs +
                                           ", this rank called " + c.descriptor);
            else if (w)
              w->check_ok = true;
          }
          {
            std::lock_guard<std::mutex> l(mu);
            check_note.clear();
          }
          cv.notify_all();
          mine.pop_front();
        } catch (const StoreTimeout& e) {
          std::string note;
          if (c.kind == Check::Kind::collective) {
            // Which ranks have not posted this number yet.
            std::vector<int> missing;
            for (int r = 0; r < size; ++r)
              if (!monitor_store->try_get(check_base(c.seq) + std::to_string(r)))
                missing.push_back(r);
            note = missing.empty() ? ""
                                   : ranks_text(missing) + " did not reach collective #" +
                                         std::to_string(c.seq) + " (" + c.descriptor + ")";
          } else {
            note = "the sender has not posted " + c.key.substr(prefix.size());
          }
          {
            std::lock_guard<std::mutex> l(mu);
            check_note = note;
          }
          if (Clock::now() - c.posted > timeout && !note.empty())
            fail(FailKind::timeout, note + " within " + seconds(timeout) +
                                        " (it exited, hangs, or called fewer collectives)");
        }
      }
      // Failure propagation (Note [Failure propagation]).
      if (Clock::now() - last_poll >= milliseconds(100)) {
        last_poll = Clock::now();
        if (!failed.load()) {
          if (auto v = monitor_store->try_get(abort_key())) {
            Failure f = decode_failure(*v);
            fail(f.kind, "another rank failed: " + f.message, false);
          }
        }
      }
    } catch (const RendezvousError& e) {
      if (!failed.load()) store_lost(e);
      mine.clear();
      if (stop) break;
      std::this_thread::sleep_for(milliseconds(50));
    }
    // Watchdog and orphans (the older ones first: Note [Dropped works]).
    reap_orphans(*monitor_store);
    std::vector<std::shared_ptr<Work::State>> works;
    {
      std::lock_guard<std::mutex> l(mu);
      for (auto& p : live)
        if (auto w = p.lock()) works.push_back(std::move(w));
    }
    for (auto& w : works) {
      if (w->plugin_done.load()) continue;
      std::unique_lock<std::mutex> l(w->mu, std::try_to_lock);
      if (!l.owns_lock() || !w->handle || w->complete) continue;
      int32_t done = 0;
      if (bp_error* e = w->comm->api->work_test(w->handle, &done)) {
        int32_t code = 0;
        std::string text = bp::detail::take_comm_error(w->comm->api, e, &code);
        // A pending check explains a plugin error better (a mismatch makes Gloo fail): let it
        // finish first (Note [Collective checks]).
        if (w->check_ok.load())
          fail_from_plugin(code, w->description + " failed: " + text, *monitor_store);
        continue;
      }
      if (done) {
        w->plugin_done = true;
        if (w->flight) w->flight->state = 1;
        cv.notify_all();
      } else if (Clock::now() - w->start > timeout) {
        fail(FailKind::timeout,
             w->description + " did not complete within " + seconds(timeout) +
                 "; every rank called it (descriptors matched), so a rank died or hangs inside "
                 "it, or its device stalled");
      }
    }
  }
}

// Note [Dropped works]
//   A Work dropped before it completed becomes an Orphan: the plugin may still use its memory,
//   so the memory stays, and the Orphan keeps the Work's description, start time and copy-backs
//   (a non-contiguous tensor's, a staged tensor's). The monitor and every Work::wait reap them:
//   a completed one gets its copy-backs (so a later wait, or a barrier, on the issuing thread
//   finds the result in the tensor, as for a waited Work), one that failed fails the group with
//   its error, and one still running after the group's timeout fails the group with a
//   TimeoutError naming it ("its Work was dropped"), which aborts the communicators, so it
//   cannot hang for ever. destroy_process_group counts running orphans as operations still
//   running: it aborts the communicators before it waits for them.
void Group::reap_orphans(Store& st) {
  std::lock_guard<std::mutex> reaping(reap_mu);
  std::vector<Orphan> now;
  {
    std::lock_guard<std::mutex> l(mu);
    now.swap(orphans);
  }
  if (now.empty()) return;
  std::vector<Orphan> running;
  for (auto& o : now) {
    int32_t done = 0;
    if (bp_error* e = o.api->work_test(o.handle, &done)) {
      int32_t code = 0;
      std::string text = bp::detail::take_comm_error(o.api, e, &code);
      o.api->work_free(o.handle);
      if (!failed.load())
        fail_from_plugin(code, o.description + " (its Work was dropped) failed: " + text, st);
      continue;
    }
    if (done) {
      o.api->work_free(o.handle);
      if (o.flight) o.flight->state = 1;
      if (o.finish && !failed.load()) {
        try {
          o.finish();
        } catch (const std::exception& e) {
          fail(kind_of(e), o.description +
                               " (its Work was dropped): copying the result back "
                               "failed: " +
                               e.what());
        }
      }
      continue;
    }
    if (Clock::now() - o.start > timeout && !failed.load())
      fail(FailKind::timeout, o.description + " (its Work was dropped) did not complete within " +
                                  seconds(timeout) +
                                  "; a rank died or hangs inside it, or its device stalled");
    running.push_back(std::move(o));  // aborted now if it timed out; reaped once it returns
  }
  std::lock_guard<std::mutex> l(mu);
  for (auto& o : running) orphans.push_back(std::move(o));
}

// ---- bp_comm_host over the group's store ------------------------------------------------------

namespace {
const char* const kKindNames[] = {"generic", "timeout",     "mismatch",
                                  "peer",    "unavailable", "rendezvous"};
}  // namespace

std::string encode_failure(FailKind kind, const std::string& text) {
  return std::string(kKindNames[static_cast<int>(kind)]) + "\n" + text;
}

Failure decode_failure(const std::string& value) {
  size_t nl = value.find('\n');
  if (nl != std::string::npos)
    for (int k = 0; k < 6; ++k)
      if (value.compare(0, nl, kKindNames[k]) == 0)
        return Failure{static_cast<FailKind>(k), value.substr(nl + 1)};
  return Failure{FailKind::peer, value};
}

FailKind kind_of_code(int32_t code) {
  switch (code) {
    case BP_COMM_ERROR_TIMEOUT:
      return FailKind::timeout;
    case BP_COMM_ERROR_REMOTE:
    case BP_COMM_ERROR_ABORTED:
      return FailKind::peer;
    case BP_ERROR_UNAVAILABLE:
      return FailKind::unavailable;
    default:
      return FailKind::generic;
  }
}

namespace {

bp_error* host_error(int32_t code, const std::string& msg) {
  return bp_error_create("backplane", code, "", "%s", msg.c_str());
}

template <typename F>
bp_error* host_guard(F&& f) noexcept {
  try {
    f();
    return nullptr;
  } catch (const StoreTimeout& e) {
    return host_error(BP_COMM_ERROR_TIMEOUT, e.what());
  } catch (const RendezvousError& e) {
    return host_error(BP_COMM_ERROR_REMOTE, e.what());
  } catch (const std::exception& e) {
    return host_error(BP_ERROR_INTERNAL, e.what());
  } catch (...) {
    return host_error(BP_ERROR_INTERNAL, "unknown exception in the host's store");
  }
}

}  // namespace

bp_comm_host make_host(HostCtx& ctx) {
  bp_comm_host h{};
  h.struct_size = sizeof(bp_comm_host);
  h.ctx = &ctx;
  h.store_set = [](void* ctx, const char* key, const void* value, uint64_t size) -> bp_error* {
    auto* c = static_cast<HostCtx*>(ctx);
    return host_guard([&] {
      c->g->store->set(c->prefix + key, std::string(static_cast<const char*>(value), size));
    });
  };
  h.store_get = [](void* ctx, const char* key, int64_t timeout_ms, void** out_value,
                   uint64_t* out_size) -> bp_error* {
    auto* c = static_cast<HostCtx*>(ctx);
    *out_value = nullptr;
    *out_size = 0;
    auto deadline = Clock::now() + milliseconds(std::max<int64_t>(timeout_ms, 0));
    for (;;) {
      if (c->g->failed.load())
        return host_error(BP_COMM_ERROR_ABORTED, "the process group failed while waiting for '" +
                                                     std::string(key) +
                                                     "': " + c->g->current_failure().message);
      auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      try {
        std::string v =
            c->g->store->get(c->prefix + key, std::clamp(left, milliseconds(0), milliseconds(100)));
        void* p = std::malloc(v.empty() ? 1 : v.size());
        if (!p) return host_error(BP_ERROR_OUT_OF_MEMORY, "out of host memory");
        std::memcpy(p, v.data(), v.size());
        *out_value = p;
        *out_size = v.size();
        return nullptr;
      } catch (const StoreTimeout&) {
        if (Clock::now() >= deadline)
          return host_error(BP_COMM_ERROR_TIMEOUT,
                            "key '" + std::string(key) +
                                "' did not appear in the rendezvous store "
                                "within " +
                                seconds(milliseconds(timeout_ms)) +
                                " (another rank did not create the communicator)");
      } catch (const RendezvousError& e) {
        return host_error(BP_COMM_ERROR_REMOTE, e.what());
      } catch (const std::exception& e) {
        return host_error(BP_ERROR_INTERNAL, e.what());
      }
    }
  };
  h.store_free = [](void*, void* value) { std::free(value); };
  h.store_add = [](void* ctx, const char* key, int64_t delta, int64_t* out_value) -> bp_error* {
    auto* c = static_cast<HostCtx*>(ctx);
    return host_guard([&] { *out_value = c->g->store->add(c->prefix + key, delta); });
  };
  h.error_free = [](void*, bp_error* e) { bp_error_destroy(e); };
  h.abort_requested = [](void* ctx) -> int32_t {
    return static_cast<HostCtx*>(ctx)->g->failed.load() ? 1 : 0;
  };
  h.log = [](void* ctx, const char* message) {
    debug_log(static_cast<HostCtx*>(ctx)->g, message ? message : "");
  };
  return h;
}

}  // namespace bp::dist::internal
