// The errors suite (Note [Asynchronous errors] in plugin_abi.h): an out-of-range gather index,
// the failure every backend can be made to have, reported by the launch itself (an eager
// backend) or, found on the device, by the next synchronisation and host read; then the
// stream's record (op id, severity, message), what the severity promises about the work queued
// after the failure, poisoned events, clearing, and a stream that works again. A device that
// reports itself lost is checked for staying lost; the test is last in the suite for that.
#include "conformance_catalogue.hpp"
#include "conformance_data.hpp"
#include "conformance_kernels.hpp"
#include "conformance_suites.hpp"

#include <cstring>

namespace bpc {

namespace {

bool has_record(const bp_plugin_api& t) {
  return BP_API_HAS_SLOT(&t, 6, stream_fault) && t.stream_fault != nullptr;
}
bool has_op_ids(const bp_plugin_api& t) {
  return BP_API_HAS_SLOT(&t, 6, op_begin) && t.op_begin != nullptr;
}

const char* severity_name(int32_t s) {
  switch (s) {
    case BP_FAULT_NONE:
      return "none";
    case BP_FAULT_OP_FAILED:
      return "op failed";
    case BP_FAULT_STREAM_POISONED:
      return "stream poisoned";
    case BP_FAULT_DEVICE_LOST:
      return "device lost";
  }
  return "?";
}

bp_stream_fault read_record(Context& c, bp_stream* s, bool clear) {
  bp_stream_fault r{};
  r.struct_size = sizeof r;
  c.check(c.t().stream_fault(s, clear ? 1 : 0, &r),
          clear ? "stream_fault (clear)" : "stream_fault");
  r.message[sizeof r.message - 1] = '\0';
  r.native_name[sizeof r.native_name - 1] = '\0';
  return r;
}

// A stream of its own, destroyed (after a synchronisation whose error is dropped) at scope exit.
class OwnStream {
 public:
  explicit OwnStream(Context& c) : c_(c) {
    c.check(c.t().stream_create(c.device(), &s_), "stream_create");
  }
  ~OwnStream() {
    take_error(c_.api(), c_.t().stream_synchronize(s_));
    take_error(c_.api(), c_.t().stream_destroy(s_));
  }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
  bp_stream* get() const { return s_; }

 private:
  Context& c_;
  bp_stream* s_ = nullptr;
};

// x[R, 3] f32 and a gather index [2, 3] along axis 0 whose middle element is R + k (out of
// range), uploaded on `s`.
struct BadGather {
  bp_kernel* kernel = nullptr;
  DeviceBuffer x, index, out;
  bp_tensor_desc dx{}, di{}, dout{};
  int64_t rows = 0, bad = 0;
};

BadGather make_bad_gather(Context& c, bp_stream* s, uint64_t seed) {
  BadGather g;
  bp_error* e = c.t().find_kernel(c.device(), "gather", BP_DTYPE_F32, &g.kernel);
  if (e || !g.kernel) throw Skipped("no gather f32 kernel: " + take_error(c.api(), e));
  Rng rng(seed);
  g.rows = rng.integer(4, 8);
  g.bad = g.rows + rng.integer(1, 1000);
  std::vector<float> xv(static_cast<size_t>(g.rows * 3));
  for (float& v : xv) v = static_cast<float>(rng.uniform(-8, 8));
  std::vector<int64_t> iv(6);
  for (int64_t& v : iv) v = rng.integer(0, g.rows - 1);
  iv[3] = g.bad;
  g.x = DeviceBuffer(c, xv.size() * 4, s);
  g.index = DeviceBuffer(c, iv.size() * 8, s);
  g.out = DeviceBuffer(c, 6 * 4, s);
  c.check(c.t().copy_h2d(s, g.x.get(), 0, xv.data(), xv.size() * 4), "copy_h2d x");
  c.check(c.t().copy_h2d(s, g.index.get(), 0, iv.data(), iv.size() * 8), "copy_h2d index");
  c.sync(s);
  g.dx = make_desc(g.x.get(), 0, BP_DTYPE_F32, {g.rows, 3}, {3, 1});
  g.di = make_desc(g.index.get(), 0, BP_DTYPE_I64, {2, 3}, {3, 1});
  g.dout = make_desc(g.out.get(), 0, BP_DTYPE_F32, {2, 3}, {3, 1});
  return g;
}

bp_error* launch_bad(Context& c, BadGather& g, bp_stream* s, uint64_t op_id) {
  if (has_op_ids(c.t())) c.t().op_begin(op_id);
  bp_tensor_desc ins[2] = {g.dx, g.di};
  return c.launch(g.kernel, s, ins, 2, &g.dout, 1, {attr_int("axis", 0)});
}

void expect_names_index(const std::string& msg, const BadGather& g, const std::string& what) {
  if (msg.find(std::to_string(g.bad)) == std::string::npos)
    throw Failure(what + " does not name the bad index " + std::to_string(g.bad) + ": " + msg);
}

// The device-lost contract: every stream reports it, clearing keeps it, synchronising fails.
void check_lost(Context& c, bp_stream* s, const BadGather& g) {
  bp_stream_fault r = read_record(c, s, true);
  if (r.severity != BP_FAULT_DEVICE_LOST)
    throw Failure(
        format("clearing a lost device's record left severity '%s'", severity_name(r.severity)));
  bp_stream* other = nullptr;
  bp_error* e = c.t().stream_create(c.device(), &other);
  if (e) {
    c.note("after the loss stream_create fails: " + take_error(c.api(), e));
  } else {
    bp_stream_fault o = read_record(c, other, false);
    bp_error* se = c.t().stream_synchronize(other);
    const bool failed = se != nullptr;
    take_error(c.api(), se);
    take_error(c.api(), c.t().stream_destroy(other));
    if (o.severity != BP_FAULT_DEVICE_LOST || !failed)
      throw Failure(
          format("a stream created after the loss reports '%s' and its "
                 "synchronisation %s",
                 severity_name(o.severity), failed ? "fails" : "succeeds"));
  }
  expect_names_index(r.message, g, "the lost device's record");
  c.note("device lost: every stream reports it, clearing keeps it");
}

// A device lost by an earlier test of the group stays lost: the later tests have nothing to
// run on.
void skip_if_lost(Context& c) {
  bp_stream* s = nullptr;
  bp_error* e = c.t().stream_create(c.device(), &s);
  if (e)
    throw Skipped("no stream can be created (device lost earlier?): " + take_error(c.api(), e));
  bp_stream_fault r{};
  r.struct_size = sizeof r;
  if (has_record(c.t())) take_error(c.api(), c.t().stream_fault(s, 0, &r));
  take_error(c.api(), c.t().stream_destroy(s));
  if (r.severity == BP_FAULT_DEVICE_LOST)
    throw Skipped("the device was lost earlier in this group (errors.bad_index)");
}

}  // namespace

void build_errors_suite(Context& ctx, std::vector<TestCase>& out) {
  SuiteBuilder b(out, "errors", ctx.device_label());

  b.add("record_empty", [](Context& c) {
    if (!has_record(c.t())) {
      c.note(
          "stream_fault NULL (or ABI < 1.6): host default is attributing a failed "
          "synchronisation to the work queued since the last one");
      return;
    }
    OwnStream s(c);
    bp_stream_fault r = read_record(c, s.get(), false);
    if (r.severity != BP_FAULT_NONE)
      throw Failure(
          format("a new stream's record says '%s': %s", severity_name(r.severity), r.message));
    // A reader of an older layout: only struct_size and severity are written.
    struct {
      bp_stream_fault head;
      unsigned char guard[64];
    } small;
    std::memset(&small, 0xA5, sizeof small);
    small.head.struct_size = offsetof(bp_stream_fault, code);
    c.check(c.t().stream_fault(s.get(), 0, &small.head), "stream_fault (short struct)");
    const auto* bytes = reinterpret_cast<const unsigned char*>(&small.head);
    for (size_t i = offsetof(bp_stream_fault, code); i < sizeof small; ++i)
      if (bytes[i] != 0xA5)
        throw Failure(format("stream_fault wrote byte %zu past the caller's struct_size %zu", i,
                             offsetof(bp_stream_fault, code)));
    c.note(std::string("set: a new stream's record is empty; struct_size respected") +
           (has_op_ids(c.t()) ? "; op_begin set" : "; op_begin NULL (op ids not reported)"));
  });

  b.add("bad_index", [](Context& c) {
    OwnStream s(c);
    BadGather g = make_bad_gather(c, s.get(), c.seed_for("errors.bad_index"));
    const uint64_t op_id = 0x5EED0000 + static_cast<uint64_t>(g.bad);
    if (bp_error* e = launch_bad(c, g, s.get(), op_id)) {  // found by the launch: eager
      const int32_t code = e->code;
      const std::string msg = take_error(c.api(), e);
      if (code != BP_ERROR_INVALID_ARGUMENT)
        throw Failure("the launch failed with " + msg + ", expected BP_ERROR_INVALID_ARGUMENT");
      expect_names_index(msg, g, "the launch's error");
      c.sync(s.get());
      c.note("reported by the launch itself: " + msg);
      return;
    }
    // Found on the device: a later host read or synchronisation reports it.
    std::vector<float> host(6);
    bp_error* e = c.t().copy_d2h(s.get(), host.data(), g.out.get(), 0, 24);
    if (!e) e = c.t().stream_synchronize(s.get());
    if (!e)
      throw Failure(format("a gather with index %lld of %lld rows succeeded",
                           static_cast<long long>(g.bad), static_cast<long long>(g.rows)));
    const int32_t code = e->code;
    const std::string msg = take_error(c.api(), e);
    expect_names_index(msg, g, "the synchronisation's error");
    if (!has_record(c.t())) {
      if (code != BP_ERROR_INVALID_ARGUMENT && code != BP_ERROR_DEVICE)
        throw Failure("expected BP_ERROR_INVALID_ARGUMENT (or DEVICE), got " + msg);
      c.check(c.t().stream_synchronize(s.get()), "a second synchronisation (reported once)");
      c.note("reported once by the next host read or synchronisation (no record): " + msg);
      return;
    }
    bp_stream_fault r = read_record(c, s.get(), false);
    if (r.severity == BP_FAULT_NONE)
      throw Failure("the synchronisation failed but the stream's record is empty: " + msg);
    if (r.code != code)
      throw Failure(format("the record's code %s differs from the error's %s",
                           error_code_name(r.code).c_str(), error_code_name(code).c_str()));
    expect_names_index(r.message, g, "the record's message");
    if (has_op_ids(c.t()) && r.op_id != op_id)
      throw Failure(format("the record names op id %llu, the gather was op id %llu",
                           static_cast<unsigned long long>(r.op_id),
                           static_cast<unsigned long long>(op_id)));
    if (r.severity == BP_FAULT_DEVICE_LOST) {
      check_lost(c, s.get(), g);
      return;
    }
    // Sticky: the next synchronisation fails again until the record is cleared.
    bp_error* again = c.t().stream_synchronize(s.get());
    if (!again) throw Failure("the record was set but a second synchronisation succeeded");
    take_error(c.api(), again);
    read_record(c, s.get(), true);
    bp_stream_fault after = read_record(c, s.get(), false);
    if (after.severity != BP_FAULT_NONE)
      throw Failure(format("clearing left severity '%s'", severity_name(after.severity)));
    // The stream works again.
    std::vector<uint8_t> data = random_bytes(c.seed_for("errors.after"), 24), back(24);
    c.check(c.t().copy_h2d(s.get(), g.out.get(), 0, data.data(), 24), "copy_h2d after clearing");
    c.check(c.t().copy_d2h(s.get(), back.data(), g.out.get(), 0, 24), "copy_d2h after clearing");
    c.sync(s.get());
    if (back != data) throw Failure("after clearing, a round trip returned different bytes");
    c.note(format(
        "found on the device (%s, op id %s), sticky until cleared, then the stream "
        "works: %s",
        severity_name(r.severity), has_op_ids(c.t()) ? "matches" : "not reported", r.message));
  });

  b.add("after_failure", [](Context& c) {
    if (!has_record(c.t())) {
      c.note("no record: nothing promised about later work");
      return;
    }
    skip_if_lost(c);
    OwnStream s(c);
    BadGather g = make_bad_gather(c, s.get(), c.seed_for("errors.after_failure"));
    DeviceBuffer marker(c, 64, s.get());
    c.check(c.t().memset(s.get(), marker.get(), 0, 0x22, 64), "memset 0x22");
    c.sync(s.get());
    if (bp_error* e = launch_bad(c, g, s.get(), 41)) {
      c.note("reported by the launch itself: " + take_error(c.api(), e));
      return;
    }
    if (has_op_ids(c.t())) c.t().op_begin(42);
    take_error(c.api(), c.t().memset(s.get(), marker.get(), 0, 0x11, 64));
    take_error(c.api(), c.t().stream_synchronize(s.get()));
    bp_stream_fault r = read_record(c, s.get(), false);
    if (r.severity == BP_FAULT_DEVICE_LOST) {
      check_lost(c, s.get(), g);
      return;
    }
    read_record(c, s.get(), true);
    std::vector<uint8_t> back(64);
    c.check(c.t().copy_d2h(s.get(), back.data(), marker.get(), 0, 64), "copy_d2h marker");
    c.sync(s.get());
    const bool ran = back[0] == 0x11;
    if (r.severity == BP_FAULT_STREAM_POISONED && ran)
      throw Failure(
          "the record says the stream was poisoned, but a memset queued after the "
          "failure ran");
    if (r.severity == BP_FAULT_OP_FAILED && !ran)
      throw Failure(
          "the record says only the op failed, but a memset queued after it did not "
          "run");
    c.note(format("severity '%s' holds: a memset queued after the failure %s",
                  severity_name(r.severity), ran ? "ran" : "did not run"));
  });

  b.add("poisoned_events", [](Context& c) {
    if (!has_record(c.t()) || !c.t().event_create) {
      c.note("needs events and stream_fault: not applicable");
      return;
    }
    skip_if_lost(c);
    OwnStream a(c), w(c);
    BadGather g = make_bad_gather(c, a.get(), c.seed_for("errors.poisoned_events"));
    bp_event* before = nullptr;
    bp_event* after = nullptr;
    c.check(c.t().event_create(c.device(), &before), "event_create");
    bp_error* e = c.t().event_create(c.device(), &after);
    if (e) {
      take_error(c.api(), c.t().event_destroy(before));
      c.check(e, "event_create");
    }
    std::string problem;
    bool lost = false;
    c.check(c.t().event_record(before, a.get()), "event_record before the failure");
    if (bp_error* le = launch_bad(c, g, a.get(), 77)) {
      c.note("reported by the launch itself (no asynchronous failure to poison events): " +
             take_error(c.api(), le));
    } else {
      // Note [Asynchronous errors]: an event recorded while the record is set is poisoned; a
      // backend that finds the failure at the synchronisation (cuda's index checks) sets the
      // record there, so the failure is first reported, and not cleared.
      bp_error* found = c.t().stream_synchronize(a.get());
      if (!found) throw Failure("the synchronisation after the bad gather succeeded");
      take_error(c.api(), found);
      c.check(c.t().event_record(after, a.get()), "event_record after the failure");
      bp_error* es = c.t().event_synchronize(after);
      if (!es) problem = "an event recorded after the failure synchronised without error";
      take_error(c.api(), es);
      bp_error* eb = c.t().event_synchronize(before);
      if (eb && problem.empty())
        problem = "an event recorded before the failure fails: " + take_error(c.api(), eb);
      else
        take_error(c.api(), eb);
      if (problem.empty()) {
        c.check(c.t().stream_wait_event(w.get(), after), "stream_wait_event");
        bp_error* ew = c.t().stream_synchronize(w.get());
        bp_stream_fault wr = read_record(c, w.get(), true);
        if (!ew) problem = "a stream that waited on a poisoned event synchronised without error";
        take_error(c.api(), ew);
        if (problem.empty() && wr.severity < BP_FAULT_STREAM_POISONED)
          problem = format("the waiter's record says '%s', expected at least stream poisoned",
                           severity_name(wr.severity));
        if (problem.empty() && has_op_ids(c.t()) && wr.op_id != 77)
          problem = format("the waiter's record names op id %llu, the failed op was 77",
                           static_cast<unsigned long long>(wr.op_id));
        lost = wr.severity == BP_FAULT_DEVICE_LOST;
      }
      if (!lost) read_record(c, a.get(), true);
    }
    take_error(c.api(), c.t().event_destroy(before));
    take_error(c.api(), c.t().event_destroy(after));
    if (!problem.empty()) throw Failure(problem);
    if (lost) check_lost(c, a.get(), g);
    c.note(
        "an event recorded after the failure fails its synchronisation and poisons its "
        "waiter; one recorded before does not");
  });
}

}  // namespace bpc
