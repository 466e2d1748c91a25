// Errors of work that failed on the device after it was queued, and lost devices (Note
// [Asynchronous errors] in plugin_abi.h, Note [Device lost] in runtime.hpp).
#include "runtime/async_errors.hpp"

#include "runtime/fallback.hpp"

#include <cstdio>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace bp {

namespace {

struct LostCallbacks {
  std::mutex mu;
  uint64_t next = 1;
  std::vector<std::pair<uint64_t, std::function<void(const DeviceLost&)>>> list;
};
LostCallbacks& lost_callbacks() {
  static auto* c = new LostCallbacks();  // never destroyed: a device may be lost during exit
  return *c;
}

}  // namespace

uint64_t on_device_lost(std::function<void(const DeviceLost&)> callback) {
  if (!callback) throw Error("on_device_lost: the callback is empty");
  LostCallbacks& c = lost_callbacks();
  std::lock_guard<std::mutex> lock(c.mu);
  c.list.emplace_back(c.next, std::move(callback));
  return c.next++;
}

void remove_device_lost_callback(uint64_t id) {
  LostCallbacks& c = lost_callbacks();
  std::lock_guard<std::mutex> lock(c.mu);
  std::erase_if(c.list, [id](const auto& e) { return e.first == id; });
}

namespace detail {

namespace {

AsyncError::Severity severity_of(int32_t s) {
  switch (s) {
    case BP_FAULT_DEVICE_LOST:
      return AsyncError::Severity::device_lost;
    case BP_FAULT_STREAM_POISONED:
      return AsyncError::Severity::stream_poisoned;
    default:
      return AsyncError::Severity::op_failed;
  }
}

// Marks the device lost with `e` (the first loss wins) and runs the callbacks once.
void mark_lost(DeviceState& ds, const DeviceLost& e) {
  {
    std::lock_guard<std::mutex> lock(ds.lost_mu);
    if (ds.lost.load(std::memory_order_relaxed)) return;
    ds.lost_error = std::make_shared<const DeviceLost>(e);
    ds.lost.store(true, std::memory_order_release);
  }
  std::vector<std::function<void(const DeviceLost&)>> run;
  {
    LostCallbacks& c = lost_callbacks();
    std::lock_guard<std::mutex> lock(c.mu);
    for (const auto& [id, f] : c.list) run.push_back(f);
  }
  for (const auto& f : run) {
    try {
      f(e);
    } catch (...) {  // Note [Device lost]: dropped
    }
  }
}

std::string quoted_plugin_error(const bp_plugin_api* api, const std::string& message,
                                const std::string& native) {
  std::string m = message.empty() ? "(no message)" : message;
  if (!native.empty()) m += " [" + native + "]";
  return m + " (plugin " + std::string(api->name ? api->name : "?") + ")";
}

std::string consequence(AsyncError::Severity sev, const std::string& dev) {
  switch (sev) {
    case AsyncError::Severity::device_lost:
      return "; the device is lost: every later call on " + dev +
             " fails with this error (bp::on_device_lost)";
    case AsyncError::Severity::stream_poisoned:
      return "; the work queued after it on that stream did not run (the stream was poisoned; "
             "it runs work again from now on)";
    case AsyncError::Severity::op_failed:
      break;
  }
  return "; its outputs are undefined, the work queued after it ran";
}

}  // namespace

void throw_device_lost(const DeviceState& ds) {
  std::shared_ptr<const DeviceLost> e;
  {
    std::lock_guard<std::mutex> lock(ds.lost_mu);
    e = ds.lost_error;
  }
  throw DeviceLost(
      ds.self->str() + " was lost earlier and runs nothing more in this process: " + e->what(),
      e->native_name(), AsyncError::Severity::device_lost, e->device(), e->op(), e->op_id());
}

void throw_queue_error(DeviceState& ds, bp_stream* s, bp_error* err, const std::string& context) {
  if (ds.stream_fault && s) {
    bp_stream_fault rec{};
    rec.struct_size = sizeof rec;
    bp_error* e2 = ds.stream_fault(s, 0, &rec);
    if (e2) ds.api->error_free(e2);
    if (!e2 && rec.severity == BP_FAULT_DEVICE_LOST)
      throw_stream_error(ds, nullptr, s, err, {context.c_str()}, ds.ring.last_id());
  }
  throw_plugin_error(ds.api, err, context);
}

void synchronize_handle(DeviceState& ds, bp_stream* s, const char* what) {
  ds.check_alive();
  const uint64_t mark = ds.ring.last_id();
  bp_error* err = ds.api->stream_synchronize(s);
  StreamState* st = nullptr;
  if (s == ds.default_handle.load(std::memory_order_acquire))
    st = Access::shared_state(*ds.default_stream.load(std::memory_order_acquire)).get();
  if (err) [[unlikely]]
    throw_stream_error(ds, st, s, err, {what}, mark);
  if (st) note_synced(*st, mark);
}

void throw_stream_error(DeviceState& ds, StreamState* st, bp_stream* s, bp_error* err,
                        FoundBy found, uint64_t mark) {
  const bp_plugin_api* api = ds.api;
  const std::string dev = ds.self->str();
  std::string message = err->message ? err->message : "";
  std::string native = err->native_name ? err->native_name : "";
  if (ds.lost.load(std::memory_order_acquire)) {
    api->error_free(err);
    throw_device_lost(ds);
  }
  bp_stream_fault rec{};
  rec.struct_size = sizeof rec;
  if (ds.stream_fault) {
    if (bp_error* e2 = ds.stream_fault(s, 1, &rec)) {
      api->error_free(e2);
      rec.severity = BP_FAULT_NONE;
    }
  }
  const std::string context = dev + ": " + found.what;
  if (ds.stream_fault && rec.severity == BP_FAULT_NONE) {
    // The plugin keeps a record and it is empty: an error of the call itself.
    throw_plugin_error(api, err, context);
  }
  api->error_free(err);
  if (rec.severity != BP_FAULT_NONE) {
    rec.message[sizeof rec.message - 1] = '\0';
    rec.native_name[sizeof rec.native_name - 1] = '\0';
    if (rec.message[0]) message = rec.message;
    if (rec.native_name[0]) native = rec.native_name;
  }
  const AsyncError::Severity sev = severity_of(rec.severity);

  // Which op failed: the one the plugin names, else the one whose launch waited, else the only
  // op queued on the stream since its last synchronisation; else the list of them.
  uint64_t failed = rec.severity != BP_FAULT_NONE ? rec.op_id : 0;
  if (!failed) failed = found.blocking_op;
  OpRecord op;
  bool known = failed && ds.ring.get(failed, op);
  std::vector<OpRecord> candidates;
  if (!known && !failed) {
    const uint64_t after = st ? st->synced_through.load(std::memory_order_relaxed) : 0;
    candidates = ds.ring.on_stream(s, after, mark);
    if (candidates.size() == 1) {
      op = candidates.front();
      failed = op.id;
      known = true;
    }
  }
  if (st) note_synced(*st, mark);  // reported: the next failure is a new one

  const std::string backend = quoted_plugin_error(api, message, native);
  std::string what;
  if (found.blocking_op && (!failed || failed == found.blocking_op) && known) {
    what = dev + ": op " + op.describe() +
           " failed while running (BACKPLANE_LAUNCH_BLOCKING=1): " + backend;
  } else if (known) {
    what = dev + ": op " + op.describe() + " (op #" + std::to_string(op.id) +
           ") failed on the device: " + backend + "; found by a later " + found.what;
  } else if (failed) {
    what = dev + ": op #" + std::to_string(failed) + " (too old to be described: more than " +
           std::to_string(OpRing::kSlots) +
           " ops were queued after it) failed on the device: " + backend + "; found by a later " +
           found.what;
  } else if (!candidates.empty()) {
    what = dev + ": one of the " + std::to_string(candidates.size()) +
           " ops queued on this stream since its last synchronisation failed on the device: " +
           backend + "; found by " + found.what + "; the ops, oldest first: ";
    constexpr size_t kListed = 8;
    for (size_t i = 0; i < candidates.size() && i < kListed; ++i)
      what += (i ? ", " : "") + candidates[i].describe();
    if (candidates.size() > kListed)
      what += " and " + std::to_string(candidates.size() - kListed) + " more";
  } else {
    what = context + ": work queued on this stream failed on the device: " + backend;
  }
  if (!known && rec.severity != BP_FAULT_NONE && rec.last_completed_op_id) {
    OpRecord done;
    if (ds.ring.get(rec.last_completed_op_id, done))
      what += "; the last op known to have finished before it: " + done.describe() + " (op #" +
              std::to_string(done.id) + ")";
  }
  what += consequence(sev, dev);
  if (!found.blocking_op && !launch_blocking())
    what += "; BACKPLANE_LAUNCH_BLOCKING=1 reports a failure at the op's own call";

  const std::string op_name = known ? op.name() : "";
  if (sev == AsyncError::Severity::device_lost) {
    DeviceLost e(what, native, sev, dev, op_name, failed);
    mark_lost(ds, e);
    throw e;
  }
  throw AsyncError(what, native, sev, dev, op_name, failed);
}

}  // namespace detail
}  // namespace bp
