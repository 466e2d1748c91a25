// The streams suite (in-order execution, cross-stream ordering through events, event timing)
// and the optional suite: for every optional slot, the default the host applies when it is
// NULL, and a check that the plugin works without it (or that the slot works when set).
#include "conformance_catalogue.hpp"
#include "conformance_kernels.hpp"
#include "conformance_suites.hpp"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace bpc {

namespace {

// A stream created for one test, synchronised and destroyed at scope exit.
class ScopedStream {
 public:
  ScopedStream(Context& c, int32_t device) : c_(c) {
    c.check(c.t().stream_create(device, &s_), format("stream_create(%d)", device));
    if (!s_) throw Failure("stream_create returned NULL");
  }
  ~ScopedStream() {
    take_error(c_.api(), c_.t().stream_synchronize(s_));
    take_error(c_.api(), c_.t().stream_destroy(s_));
  }
  ScopedStream(const ScopedStream&) = delete;
  ScopedStream& operator=(const ScopedStream&) = delete;
  bp_stream* get() const { return s_; }

 private:
  Context& c_;
  bp_stream* s_ = nullptr;
};

// An event destroyed at scope exit.
class ScopedEvent {
 public:
  explicit ScopedEvent(Context& c) : c_(c) {
    c.check(c.t().event_create(c.device(), &e_), "event_create");
    if (!e_) throw Failure("event_create returned NULL");
  }
  ~ScopedEvent() { take_error(c_.api(), c_.t().event_destroy(e_)); }
  ScopedEvent(const ScopedEvent&) = delete;
  ScopedEvent& operator=(const ScopedEvent&) = delete;
  bp_event* get() const { return e_; }

 private:
  Context& c_;
  bp_event* e_ = nullptr;
};

bool has_events(const bp_plugin_api& t) {
  return t.event_create != nullptr;
}

const uint64_t kWorkFloats = uint64_t{2} << 20;  // 8 MiB of f32: long enough to overlap

// Random f32 values for queue_work (8 MiB).
std::vector<float> work_data(Context& c) {
  Rng rng(c.seed_for("queue_work"));
  std::vector<float> host(kWorkFloats);
  for (float& v : host) v = static_cast<float>(rng.uniform(-4, 4));
  return host;
}

// Queues on `s`: `in` <- host values, then `out` <- in + in with the plugin's add f32 kernel
// (or copy_d2d when it has none, with the values already doubled on the host). Returns the
// expected contents of `out`. `host` (filled with work_data unless it already holds it) must
// stay alive until the stream has passed the copy.
std::vector<float> queue_work(Context& c, bp_stream* s, DeviceBuffer& in, DeviceBuffer& out,
                              std::vector<float>& host, std::string* how) {
  // Callers that time the work prepare the data first (work_data) so it is not timed.
  if (host.size() != kWorkFloats) host = work_data(c);
  std::vector<float> expected(host.size());
  bp_kernel* k = nullptr;
  bp_error* e = c.t().find_kernel(c.device(), "add", BP_DTYPE_F32, &k);
  bool kernel = e == nullptr && k != nullptr;
  take_error(c.api(), e);
  if (!kernel)
    for (float& v : host) v = v + v;
  for (size_t i = 0; i < host.size(); ++i) expected[i] = kernel ? host[i] + host[i] : host[i];
  const uint64_t bytes = kWorkFloats * 4;
  c.check(c.t().copy_h2d(s, in.get(), 0, host.data(), bytes), "copy_h2d (8 MiB)");
  if (kernel) {
    std::vector<int64_t> shape = {static_cast<int64_t>(kWorkFloats)};
    bp_tensor_desc a = make_desc(in.get(), 0, BP_DTYPE_F32, shape, {1});
    bp_tensor_desc o = make_desc(out.get(), 0, BP_DTYPE_F32, shape, {1});
    bp_tensor_desc ins[2] = {a, a};
    c.check(c.t().launch(k, s, ins, 2, &o, 1, nullptr, 0), "launch add f32 [2^21]");
    if (how) *how = "copy_h2d + add f32 kernel";
  } else {
    c.check(c.t().copy_d2d(s, out.get(), 0, in.get(), 0, bytes), "copy_d2d (8 MiB)");
    if (how) *how = "copy_h2d + copy_d2d (no add f32 kernel)";
  }
  return expected;
}

void expect_floats(const std::vector<float>& got, const std::vector<float>& want,
                   const std::string& what) {
  if (std::memcmp(got.data(), want.data(), want.size() * 4) != 0) {
    size_t i = 0;
    while (i < got.size() && std::memcmp(&got[i], &want[i], 4) == 0) ++i;
    throw Failure(format("%s: element %zu is %g, expected %g (work not ordered?)", what.c_str(), i,
                         static_cast<double>(got[i]), static_cast<double>(want[i])));
  }
}

// Two streams: A produces, B consumes. With events, B waits on an event recorded on A; without,
// the host default applies (synchronise A). Returns how ordering was established.
std::string two_stream_ordering(Context& c, bool use_events) {
  ScopedStream a(c, c.device()), b(c, c.device());
  DeviceBuffer in(c, kWorkFloats * 4, a.get()), mid(c, kWorkFloats * 4, a.get()),
      fin(c, kWorkFloats * 4, a.get());
  c.sync(a.get());
  std::vector<float> host, got(kWorkFloats);
  std::string how;
  std::vector<float> want = queue_work(c, a.get(), in, mid, host, &how);
  std::unique_ptr<ScopedEvent> ev;
  if (use_events) {
    ev = std::make_unique<ScopedEvent>(c);
    c.check(c.t().event_record(ev->get(), a.get()), "event_record on stream A");
    c.check(c.t().stream_wait_event(b.get(), ev->get()), "stream_wait_event on stream B");
  } else {
    c.sync(a.get());
  }
  c.check(c.t().copy_d2d(b.get(), fin.get(), 0, mid.get(), 0, kWorkFloats * 4),
          "copy_d2d on stream B");
  c.check(c.t().copy_d2h(b.get(), got.data(), fin.get(), 0, kWorkFloats * 4),
          "copy_d2h on stream B");
  c.sync(b.get());
  expect_floats(got, want, "stream B's result");
  c.sync(a.get());
  return how;
}

}  // namespace

void build_streams_suite(Context& ctx, std::vector<TestCase>& out) {
  SuiteBuilder b(out, "streams", ctx.device_label());

  b.add("create_destroy", [](Context& c) {
    std::vector<std::unique_ptr<ScopedStream>> streams;
    for (int i = 0; i < 32; ++i) streams.push_back(std::make_unique<ScopedStream>(c, c.device()));
    for (auto& s : streams) c.sync(s->get());
    c.note("32 streams");
  });

  b.add("synchronize_idle", [](Context& c) {
    ScopedStream s(c, c.device());
    c.sync(s.get());
    c.sync(s.get());
  });

  b.add("in_order", [](Context& c) {
    // One stream: copies that reuse a buffer must run in the order they were queued.
    const uint64_t n = uint64_t{8} << 20;
    std::vector<uint8_t> first = random_bytes(c.seed_for("in_order/1"), n);
    std::vector<uint8_t> second = random_bytes(c.seed_for("in_order/2"), n);
    DeviceBuffer x(c, n), y(c, n), z(c, n);
    std::vector<uint8_t> gy(n), gz(n);
    bp_stream* s = c.stream();
    c.check(c.t().copy_h2d(s, x.get(), 0, first.data(), n), "copy_h2d #1");
    c.check(c.t().copy_d2d(s, y.get(), 0, x.get(), 0, n), "copy_d2d #1");
    c.check(c.t().copy_h2d(s, x.get(), 0, second.data(), n), "copy_h2d #2");
    c.check(c.t().copy_d2d(s, z.get(), 0, x.get(), 0, n), "copy_d2d #2");
    c.check(c.t().memset(s, x.get(), 0, 0x33, n), "memset");
    c.check(c.t().copy_d2h(s, gy.data(), y.get(), 0, n), "copy_d2h #1");
    c.check(c.t().copy_d2h(s, gz.data(), z.get(), 0, n), "copy_d2h #2");
    c.sync(s);
    if (gy != first) throw Failure("the first d2d copy saw data queued after it");
    if (gz != second) throw Failure("the second d2d copy saw data queued after it (or before)");
  });

  b.add("event_ordering", [](Context& c) {
    if (!has_events(c.t()))
      throw Skipped("events are NULL (optional): see optional.events for the host default");
    c.note("stream B waits on an event recorded on stream A after " + two_stream_ordering(c, true));
  });

  b.add("event_synchronize", [](Context& c) {
    if (!has_events(c.t())) throw Skipped("events are NULL (optional): see optional.events");
    ScopedStream s(c, c.device());
    DeviceBuffer in(c, kWorkFloats * 4, s.get()), o(c, kWorkFloats * 4, s.get());
    std::vector<float> host, got(kWorkFloats);
    std::vector<float> want = queue_work(c, s.get(), in, o, host, nullptr);
    c.check(c.t().copy_d2h(s.get(), got.data(), o.get(), 0, kWorkFloats * 4), "copy_d2h");
    ScopedEvent ev(c);
    c.check(c.t().event_record(ev.get(), s.get()), "event_record");
    c.check(c.t().event_synchronize(ev.get()), "event_synchronize");
    expect_floats(got, want, "after event_synchronize, the copy before the event");
  });

  b.add("event_elapsed", [](Context& c) {
    if (!has_events(c.t())) throw Skipped("events are NULL (optional): see optional.events");
    if (!c.t().event_elapsed_ms)
      throw Skipped("event_elapsed_ms is NULL (optional): see optional.event_elapsed_ms");
    ScopedStream s(c, c.device());
    DeviceBuffer in(c, kWorkFloats * 4, s.get()), o(c, kWorkFloats * 4, s.get());
    std::vector<float> host = work_data(c);
    ScopedEvent start(c), end(c);
    c.check(c.t().event_record(start.get(), s.get()), "event_record (start)");
    queue_work(c, s.get(), in, o, host, nullptr);
    c.check(c.t().event_record(end.get(), s.get()), "event_record (end)");
    c.check(c.t().event_synchronize(end.get()), "event_synchronize (end)");
    double ms = -1;
    c.check(c.t().event_elapsed_ms(start.get(), end.get(), &ms), "event_elapsed_ms");
    if (!(ms >= 0) || !std::isfinite(ms)) throw Failure(format("event_elapsed_ms returned %g", ms));
    c.note(format("%.3f ms between the events around an 8 MiB h2d + add", ms));
  });
}

void build_optional_suite(Context& ctx, std::vector<TestCase>& out) {
  SuiteBuilder b(out, "optional", ctx.device_label());

  b.add("events", [](Context& c) {
    if (has_events(c.t())) {
      ScopedEvent ev(c);
      c.check(c.t().event_record(ev.get(), c.stream()), "event_record");
      c.check(c.t().event_synchronize(ev.get()), "event_synchronize");
      c.note("set (ordering tested by streams.event_*)");
      return;
    }
    std::string how = two_stream_ordering(c, false);
    c.note(
        "NULL: host default is to synchronise the producing stream where it would record and "
        "wait; verified two streams ordered that way (" +
        how + ")");
  });

  b.add("event_elapsed_ms", [](Context& c) {
    if (c.t().event_elapsed_ms) {
      c.note("set (tested by streams.event_elapsed)");
      return;
    }
    ScopedStream s(c, c.device());
    DeviceBuffer in(c, kWorkFloats * 4, s.get()), o(c, kWorkFloats * 4, s.get());
    std::vector<float> host = work_data(c);
    auto t0 = std::chrono::steady_clock::now();
    queue_work(c, s.get(), in, o, host, nullptr);
    c.sync(s.get());
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    c.note(
        format("NULL: host default is host clocks around synchronised regions; verified "
               "(%.3f ms for 8 MiB h2d + work)",
               ms));
  });

  b.add("mem_host_pointer", [](Context& c) {
    bp_device_properties props = read_properties(c);
    if (c.t().mem_host_pointer) {
      DeviceBuffer buf(c, 4096);
      void* p = c.t().mem_host_pointer(buf.get());
      if (props.unified_memory && !p)
        throw Failure("set, but returns NULL on a device that declares unified_memory");
      if (!props.unified_memory && p)
        throw Failure("returns a host address on a device that does not declare unified_memory");
      c.note(p ? "set: buffers are host memory (alignment tested by memory.alignment)"
               : "set: returns NULL (device memory is not host memory)");
      return;
    }
    std::vector<uint8_t> data = random_bytes(c.seed_for("mem_host_pointer"), 4097), back(4097);
    DeviceBuffer buf(c, 4097);
    c.check(c.t().copy_h2d(c.stream(), buf.get(), 0, data.data(), 4097), "copy_h2d");
    c.check(c.t().copy_d2h(c.stream(), back.data(), buf.get(), 0, 4097), "copy_d2h");
    c.sync(c.stream());
    if (back != data) throw Failure("copy round trip failed");
    c.note(std::string("NULL: host default is to always copy; verified h2d/d2h round trip") +
           (props.unified_memory ? " (note: the device declares unified_memory)" : ""));
  });

  b.add("memory_empty_cache", [](Context& c) {
    if (!c.t().memory_empty_cache) {
      c.note("NULL: host default is nothing to release");
      return;
    }
    { DeviceBuffer tmp(c, uint64_t{8} << 20); }
    c.sync(c.stream());
    bp_memory_stats before = read_stats(c);
    c.check(c.t().memory_empty_cache(c.device()), "memory_empty_cache");
    bp_memory_stats after = read_stats(c);
    if (after.allocated != before.allocated)
      throw Failure("memory_empty_cache changed the allocated bytes");
    if (after.reserved > before.reserved)
      throw Failure("memory_empty_cache increased the reserved bytes");
    DeviceBuffer again(c, 1 << 20);  // the allocator still works after emptying
    c.note(format("set: reserved %llu -> %llu bytes",
                  static_cast<unsigned long long>(before.reserved),
                  static_cast<unsigned long long>(after.reserved)));
  });

  b.add("host_alloc", [](Context& c) {
    const uint64_t n = (uint64_t{1} << 20) + 7;
    std::vector<uint8_t> data = random_bytes(c.seed_for("host_alloc"), n);
    DeviceBuffer buf(c, n);
    if (!c.t().host_alloc) {
      void* p = std::aligned_alloc(64, ((n + 63) / 64) * 64);
      if (!p) throw Skipped("out of host memory");
      std::memcpy(p, data.data(), n);
      c.check(c.t().copy_h2d(c.stream(), buf.get(), 0, p, n), "copy_h2d from aligned memory");
      std::memset(p, 0, n);
      c.check(c.t().copy_d2h(c.stream(), p, buf.get(), 0, n), "copy_d2h to aligned memory");
      c.sync(c.stream());
      bool same = std::memcmp(p, data.data(), n) == 0;
      std::free(p);
      if (!same) throw Failure("round trip through 64-byte aligned host memory failed");
      c.note("NULL: host default is ordinary 64-byte aligned memory; verified copies from it");
      return;
    }
    void* src = nullptr;
    void* dst = nullptr;
    c.check(c.t().host_alloc(c.device(), n, &src), "host_alloc");
    bp_error* e = c.t().host_alloc(c.device(), n, &dst);
    if (e) {
      c.t().host_free(c.device(), src);
      c.check(e, "host_alloc");
    }
    std::string problem;
    if (!src || !dst) {
      problem = "host_alloc returned NULL";
    } else {
      std::memcpy(src, data.data(), n);
      bp_error* e1 = c.t().copy_h2d(c.stream(), buf.get(), 0, src, n);
      bp_error* e2 = e1 ? nullptr : c.t().copy_d2h(c.stream(), dst, buf.get(), 0, n);
      bp_error* e3 = (e1 || e2) ? nullptr : c.t().stream_synchronize(c.stream());
      if (e1 || e2 || e3)
        problem = "copy through pinned memory failed: " + take_error(c.api(), e1   ? e1
                                                                              : e2 ? e2
                                                                                   : e3);
      else if (std::memcmp(dst, data.data(), n) != 0)
        problem = "round trip through pinned memory returned different bytes";
    }
    if (src) c.check(c.t().host_free(c.device(), src), "host_free");
    if (dst) c.check(c.t().host_free(c.device(), dst), "host_free");
    if (!problem.empty()) throw Failure(problem);
    c.note("set: h2d/d2h through pinned memory verified");
  });

  b.add("copy_peer", [](Context& c) {
    const char* reason = nullptr;
    int32_t n_dev = c.t().device_count(&reason);
    if (n_dev < 2) {
      c.note(c.t().copy_peer ? "set; one device: nothing to copy between"
                             : "NULL: host default is staging through pinned host memory; one "
                               "device: nothing to stage");
      return;
    }
    const int32_t other = (c.device() + 1) % n_dev;
    const uint64_t n = (uint64_t{1} << 20) + 3;
    std::vector<uint8_t> data = random_bytes(c.seed_for("copy_peer"), n), back(n);
    ScopedStream so(c, other);
    DeviceBuffer src(c, n);
    bp_buffer* dst = nullptr;
    c.check(c.t().mem_alloc(other, so.get(), n, &dst), format("mem_alloc on device %d", other));
    std::string problem;
    bp_error* e = c.t().copy_h2d(c.stream(), src.get(), 0, data.data(), n);
    if (!e) e = c.t().stream_synchronize(c.stream());
    if (!e) {
      if (c.t().copy_peer) {
        e = c.t().copy_peer(so.get(), other, dst, 0, c.device(), src.get(), 0, n);
      } else {
        std::vector<uint8_t> staging(n);
        e = c.t().copy_d2h(c.stream(), staging.data(), src.get(), 0, n);
        if (!e) e = c.t().stream_synchronize(c.stream());
        if (!e) e = c.t().copy_h2d(so.get(), dst, 0, staging.data(), n);
        if (!e) e = c.t().stream_synchronize(so.get());
      }
    }
    if (!e) e = c.t().copy_d2h(so.get(), back.data(), dst, 0, n);
    if (!e) e = c.t().stream_synchronize(so.get());
    if (e)
      problem = take_error(c.api(), e);
    else if (back != data)
      problem = "the copy to the other device returned different bytes";
    take_error(c.api(), c.t().mem_free(other, so.get(), dst, n));
    if (!problem.empty()) throw Failure(format("device %d -> %d: ", c.device(), other) + problem);
    c.note(c.t().copy_peer ? format("set: device %d -> %d verified", c.device(), other)
                           : format("NULL: host default is staging through host memory; "
                                    "verified device %d -> %d that way",
                                    c.device(), other));
  });

  b.add("list_ops", [](Context& c) {
    SupportTable st = SupportTable::build(c);
    int yes = 0, no = 0, xfail = 0;
    for (const OpInfo& op : catalogue())
      for (int32_t d = 0; d < BP_DTYPE_COUNT; ++d) {
        Support s = st.get(op.name, d);
        if (s.support == BP_SUPPORT_YES)
          ++yes;
        else if (s.support == BP_SUPPORT_EXPECTED_FAIL)
          ++xfail;
        else if (s.declared || defines(op, d))
          ++no;
      }
    std::string counts =
        format("%d supported, %d unsupported, %d expected to fail", yes, no, xfail);
    if (has_list_ops(c.api()))
      c.note("set: " + counts + " (consistency tested by kernels.declared)");
    else
      c.note("NULL: host default is probing find_kernel over the catalogue (" + st.source() +
             "); " + counts);
  });

  b.add("shutdown", [](Context& c) {
    if (!c.t().shutdown) {
      c.note("NULL: host default is nothing to release at exit");
      return;
    }
    // Last test of the group: nothing calls the plugin after this.
    c.close_for_shutdown();
    c.t().shutdown();
    c.note("set: called once after the group's work; it returned");
  });
}

}  // namespace bpc
