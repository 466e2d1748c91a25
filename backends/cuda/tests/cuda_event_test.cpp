// The CUDA plugin's events against out-of-range indices found on the device after the event
// was recorded (Note [Events and deferred index errors] in cuda_index.cu): an event recorded
// after a bad gather fails its synchronisation naming gather, one recorded before stays clean,
// a stream that waited on a poisoned event fails as poisoned, an event outlives its stream, and
// good gathers with many events never fail. Drives the plugin's C ABI on cuda:0 with fresh
// random data (seed printed; BP_TEST_SEED replays). Skips without a GPU (CI).
#include "cuda_test_support.hpp"

#include <backplane_test/throws.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace bp_cuda_test {
namespace {

// ---- Streams, events and launches on a chosen stream -----------------------------------------

struct Stream {
  bp_stream* s = nullptr;
  Stream() { check(api()->stream_create(0, &s), "stream_create"); }
  ~Stream() { reset(); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  // Destroys the stream now; the error of stream_destroy fails the test.
  void reset() {
    if (!s) return;
    bp_error* e = api()->stream_destroy(s);
    s = nullptr;
    if (e) ADD_FAILURE() << "stream_destroy: " << error_of(e).message;
  }
};

struct Event {
  bp_event* e = nullptr;
  Event() { check(api()->event_create(0, &e), "event_create"); }
  ~Event() {
    if (bp_error* err = api()->event_destroy(e)) ADD_FAILURE() << error_of(err).message;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(bp_stream* s) { check(api()->event_record(e, s), "event_record"); }
  bp_error* synchronize() { return api()->event_synchronize(e); }
};

void wait(bp_stream* s, const Event& e) {
  check(api()->stream_wait_event(s, e.e), "stream_wait_event");
}

// The stream's record (ABI 1.6), cleared when `clear`.
bp_stream_fault fault_of(bp_stream* s, bool clear) {
  bp_stream_fault f{};
  f.struct_size = sizeof f;
  check(api()->stream_fault(s, clear ? 1 : 0, &f), "stream_fault");
  return f;
}

// A fresh op id for the next launch (ids increase; 0 is "not known").
uint64_t next_op_id() {
  static uint64_t id = 1000 + static_cast<uint64_t>(uniform_int(0, 1000));
  id += static_cast<uint64_t>(uniform_int(1, 9));
  return id;
}

// x [rows, cols] gathered along axis 0 by index [2, cols] into out, on stream `s`; returns the
// op id given to the launch.
uint64_t gather_on(bp_stream* s, const Tensor& x, const Tensor& index, const Tensor& out) {
  const uint64_t id = next_op_id();
  bp_kernel* k = nullptr;
  check(api()->find_kernel(0, "gather", BP_DTYPE_F32, &k), "find_kernel gather");
  const bp_tensor_desc in[2] = {x.desc(), index.desc()};
  const bp_tensor_desc o = out.desc();
  const bp_attr axis = attr_i("axis", 0);
  api()->op_begin(id);
  check(api()->launch(k, s, in, 2, &o, 1, &axis, 1), "launch gather");
  return id;
}

// A gather problem with fresh random data: x [rows, cols], index [2, cols] in range, except
// at position `bad_at` (when >= 0), which holds `bad` (outside [0, rows)).
struct Gather {
  int64_t rows = 0, cols = 0, bad = 0, bad_at = -1;
  Tensor x, index, out;
  // out's expected values (0 where the index is out of range).
  std::vector<double> expected() const {
    std::vector<double> r;
    const std::vector<double> xv = x.values(), iv = index.values();
    for (size_t p = 0; p < iv.size(); ++p) {
      const int64_t j = static_cast<int64_t>(iv[p]);
      const int64_t c = static_cast<int64_t>(p) % cols;
      r.push_back(j < 0 || j >= rows ? 0.0 : xv[static_cast<size_t>(j * cols + c)]);
    }
    return r;
  }
  // The message fragment check_index_errors writes for the bad index.
  std::string message() const {
    return "cuda:0: op 'gather': index " + std::to_string(bad) + " at position " +
           std::to_string(bad_at) + " of the index tensor is outside [0, " + std::to_string(rows) +
           ") along axis 0";
  }
};

Gather make_gather(bool with_bad) {
  Gather g;
  g.rows = uniform_int(3, 40);
  g.cols = uniform_int(1, 7);
  g.x = dense(BP_DTYPE_F32, {g.rows, g.cols}, any_values(BP_DTYPE_F32));
  const int64_t rows = g.rows;
  g.index = dense(BP_DTYPE_I64, {2, g.cols},
                  [rows] { return static_cast<double>(uniform_int(0, rows - 1)); });
  if (with_bad) {
    g.bad_at = uniform_int(0, 2 * g.cols - 1);
    g.bad = uniform_int(0, 1) ? g.rows + uniform_int(0, 500) : -uniform_int(1, 500);
    g.index.storage[static_cast<size_t>(g.bad_at)] = static_cast<double>(g.bad);
    std::vector<unsigned char> bytes(8);
    bp_test::encode(BP_DTYPE_I64, static_cast<double>(g.bad), bytes.data());
    check(api()->copy_h2d(stream(), g.index.buf->get(), static_cast<uint64_t>(g.bad_at) * 8,
                          bytes.data(), 8),
          "copy_h2d");
  }
  g.out = dense(BP_DTYPE_F32, {2, g.cols}, any_values(BP_DTYPE_F32));
  sync();  // the inputs are in place before another stream reads them
  return g;
}

// The checks every failed event synchronisation, poisoned stream and host read share.
void expect_gather_error(const Err& e, const Gather& g) {
  EXPECT_EQ(e.code, BP_ERROR_INVALID_ARGUMENT) << e.message;
  EXPECT_HAS(e.message, g.message());
}

// Clears the test stream's record (the host does it after reporting).
void clear_stream() {
  (void)fault_of(stream(), true);
}

// ---- a. An event recorded after a bad gather -------------------------------------------------

TEST(CudaEvents, AnEventRecordedAfterABadGatherFailsItsSynchronize) {
  BP_REQUIRE_GPU();
  for (int round = 0; round < 3; ++round) {
    Gather g = make_gather(true);
    Event e;
    const uint64_t id = gather_on(stream(), g.x, g.index, g.out);
    e.record(stream());
    const Err err = error_of(e.synchronize());
    expect_gather_error(err, g);
    // The check that found it put it into the stream's record too, with the op id.
    const bp_stream_fault f = fault_of(stream(), false);
    EXPECT_EQ(f.severity, BP_FAULT_OP_FAILED);
    EXPECT_EQ(f.op_id, id);
    EXPECT_HAS(std::string(f.message), g.message());
    // The verdict is kept: the event fails again, after the stream's record is cleared.
    clear_stream();
    expect_gather_error(error_of(e.synchronize()), g);
    sync();  // reported once on the stream
    EXPECT_TRUE(close(BP_DTYPE_F32, g.out.download(), g.expected(), 0)) << "round " << round;
  }
}

// ---- b. Only events recorded after the bad launch are poisoned --------------------------------

TEST(CudaEvents, AnEventRecordedBeforeTheBadGatherStaysClean) {
  BP_REQUIRE_GPU();
  // Both orders of synchronisation: the first one runs the stream's check for both events.
  for (int order = 0; order < 2; ++order) {
    Gather good = make_gather(false), bad = make_gather(true), later = make_gather(false);
    Event before, after, last;
    gather_on(stream(), good.x, good.index, good.out);  // unchecked when `before` is recorded
    before.record(stream());
    gather_on(stream(), bad.x, bad.index, bad.out);
    after.record(stream());
    gather_on(stream(), later.x, later.index, later.out);
    last.record(stream());
    if (order == 0) {
      check(before.synchronize(), "event_synchronize (recorded before the bad gather)");
      expect_gather_error(error_of(after.synchronize()), bad);
    } else {
      expect_gather_error(error_of(after.synchronize()), bad);
      check(before.synchronize(), "event_synchronize (recorded before the bad gather)");
    }
    expect_gather_error(error_of(last.synchronize()), bad);
    check(before.synchronize(), "event_synchronize again");
    expect_gather_error(sync_error(), bad);
    sync();
    EXPECT_TRUE(close(BP_DTYPE_F32, good.out.download(), good.expected(), 0));
    EXPECT_TRUE(close(BP_DTYPE_F32, bad.out.download(), bad.expected(), 0));
    EXPECT_TRUE(close(BP_DTYPE_F32, later.out.download(), later.expected(), 0));
  }
}

// An index error of a launch queued after the event never poisons it, even when the event is
// synchronised after the stream's own check found that error.
TEST(CudaEvents, ABadGatherQueuedAfterTheEventDoesNotPoisonIt) {
  BP_REQUIRE_GPU();
  Gather good = make_gather(false), bad = make_gather(true);
  Event e;
  gather_on(stream(), good.x, good.index, good.out);
  e.record(stream());
  gather_on(stream(), bad.x, bad.index, bad.out);
  expect_gather_error(sync_error(), bad);
  check(e.synchronize(), "event_synchronize");
  sync();
}

// ---- c. A stream that waits on a poisoned event ----------------------------------------------

TEST(CudaEvents, AStreamWaitingOnAnEventAfterTheBadGatherIsPoisoned) {
  BP_REQUIRE_GPU();
  for (int round = 0; round < 3; ++round) {
    Gather good = make_gather(false), bad = make_gather(true);
    Stream waiter, clean;
    Event before, after;
    gather_on(stream(), good.x, good.index, good.out);
    before.record(stream());
    const uint64_t id = gather_on(stream(), bad.x, bad.index, bad.out);
    after.record(stream());
    wait(waiter.s, after);
    wait(clean.s, before);
    // Nothing has synchronised the source stream yet: the waiter resolves it itself.
    const Err w = error_of(api()->stream_synchronize(waiter.s));
    expect_gather_error(w, bad);
    const bp_stream_fault f = fault_of(waiter.s, true);
    EXPECT_EQ(f.severity, BP_FAULT_STREAM_POISONED);
    EXPECT_EQ(f.op_id, id);
    check(api()->stream_synchronize(waiter.s), "the waiter runs again once cleared");
    check(api()->stream_synchronize(clean.s), "a stream that waited on the earlier event");
    EXPECT_EQ(fault_of(clean.s, false).severity, BP_FAULT_NONE);
    // The source stream's own record has it as a failed op.
    const bp_stream_fault src = fault_of(stream(), false);
    EXPECT_EQ(src.severity, BP_FAULT_OP_FAILED);
    EXPECT_EQ(src.op_id, id);
    expect_gather_error(sync_error(), bad);
    sync();
    EXPECT_TRUE(close(BP_DTYPE_F32, good.out.download(), good.expected(), 0));
  }
}

// The verdict known before the waiter asks: its record says so without blocking (stream_fault),
// and a host read on it fails.
TEST(CudaEvents, AKnownVerdictReachesTheWaitersRecordAndHostReads) {
  BP_REQUIRE_GPU();
  Gather bad = make_gather(true);
  Stream waiter, reader;
  Event after;
  const uint64_t id = gather_on(stream(), bad.x, bad.index, bad.out);
  after.record(stream());
  wait(waiter.s, after);
  wait(reader.s, after);
  expect_gather_error(sync_error(), bad);  // the source's check gives the verdict
  const bp_stream_fault f = fault_of(waiter.s, false);
  EXPECT_EQ(f.severity, BP_FAULT_STREAM_POISONED);
  EXPECT_EQ(f.op_id, id);
  EXPECT_HAS(std::string(f.message), bad.message());
  (void)fault_of(waiter.s, true);
  // A host read on a stream that waited on the poisoned event.
  std::vector<unsigned char> host(static_cast<size_t>(bad.out.numel()) * 4);
  const Err r =
      error_of(api()->copy_d2h(reader.s, host.data(), bad.out.buf->get(), 0, host.size()));
  expect_gather_error(r, bad);
  (void)fault_of(reader.s, true);
  check(api()->stream_synchronize(reader.s), "the reader runs again once cleared");
  check(api()->stream_synchronize(waiter.s), "the waiter runs again once cleared");
}

// ---- d. The source stream destroyed before the wait ------------------------------------------

TEST(CudaEvents, AnEventOutlivesTheStreamItWasRecordedOn) {
  BP_REQUIRE_GPU();
  Gather bad = make_gather(true), bad2 = make_gather(true);
  Stream early, late;
  Event e, e2;
  {
    Stream source;
    gather_on(source.s, bad.x, bad.index, bad.out);
    e.record(source.s);
    wait(early.s, e);  // waits before the source goes
    source.reset();
  }
  wait(late.s, e);  // and after
  expect_gather_error(error_of(e.synchronize()), bad);
  expect_gather_error(error_of(api()->stream_synchronize(early.s)), bad);
  EXPECT_EQ(fault_of(early.s, true).severity, BP_FAULT_STREAM_POISONED);
  expect_gather_error(error_of(api()->stream_synchronize(late.s)), bad);
  EXPECT_EQ(fault_of(late.s, true).severity, BP_FAULT_STREAM_POISONED);
  // Destroyed with its verdict unasked: the destruction settles it.
  {
    Stream source;
    gather_on(source.s, bad2.x, bad2.index, bad2.out);
    e2.record(source.s);
    source.reset();
  }
  expect_gather_error(error_of(e2.synchronize()), bad2);
  EXPECT_TRUE(close(BP_DTYPE_F32, bad.out.download(), bad.expected(), 0));
  EXPECT_TRUE(close(BP_DTYPE_F32, bad2.out.download(), bad2.expected(), 0));
}

// ---- Threads ---------------------------------------------------------------------------------

// One thread queues gathers and records events while another synchronises them (running the
// stream's check as the stream goes on): exactly the events recorded after the bad gather fail.
TEST(CudaEvents, EventsSynchronisedOnAnotherThreadWhileTheStreamRuns) {
  BP_REQUIRE_GPU();
  constexpr int kEvents = 60;
  for (int round = 0; round < 3; ++round) {
    const int bad_at = static_cast<int>(uniform_int(5, kEvents - 5));  // before event bad_at
    Gather bad = make_gather(true);
    std::vector<Gather> goods;
    std::vector<std::unique_ptr<Event>> events;
    for (int i = 0; i < kEvents; ++i) {
      goods.push_back(make_gather(false));
      events.push_back(std::make_unique<Event>());
    }
    std::atomic<int> recorded{0};
    std::string producer_error;
    std::thread producer([&] {
      try {
        for (int i = 0; i < kEvents; ++i) {
          if (i == bad_at) gather_on(stream(), bad.x, bad.index, bad.out);
          const Gather& g = goods[static_cast<size_t>(i)];
          gather_on(stream(), g.x, g.index, g.out);
          events[static_cast<size_t>(i)]->record(stream());
          recorded.store(i + 1, std::memory_order_release);
        }
      } catch (const std::exception& e) {
        producer_error = e.what();
        recorded.store(kEvents, std::memory_order_release);
      }
    });
    std::vector<int> failed(kEvents, -1);
    for (int i = 0; i < kEvents; ++i) {
      while (recorded.load(std::memory_order_acquire) <= i) std::this_thread::yield();
      if (!producer_error.empty()) break;
      bp_error* e = events[static_cast<size_t>(i)]->synchronize();
      failed[static_cast<size_t>(i)] = e ? 1 : 0;
      if (e) expect_gather_error(error_of(e), bad);
    }
    producer.join();
    ASSERT_EQ(producer_error, "");
    for (int i = 0; i < kEvents; ++i)
      EXPECT_EQ(failed[static_cast<size_t>(i)], i >= bad_at ? 1 : 0)
          << "event " << i << ", the bad gather queued before event " << bad_at;
    expect_gather_error(sync_error(), bad);
    sync();
    for (const Gather& g : goods)
      ASSERT_TRUE(close(BP_DTYPE_F32, g.out.download(), g.expected(), 0)) << "round " << round;
  }
}

// ---- Graph capture ---------------------------------------------------------------------------

// A capture begun while an event watches unchecked launches settles the watch first (no check
// runs inside a capture, and an index launch captured uses no record).
TEST(CudaEvents, ACaptureSettlesTheWatchesOfItsStream) {
  BP_REQUIRE_GPU();
  Gather bad = make_gather(true), good = make_gather(false);
  Stream s;
  Event after;
  gather_on(s.s, bad.x, bad.index, bad.out);
  after.record(s.s);
  check(api()->graph_begin_capture(s.s), "graph_begin_capture");
  gather_on(s.s, good.x, good.index, good.out);
  bp_graph* graph = nullptr;
  check(api()->graph_end_capture(s.s, &graph), "graph_end_capture");
  check(api()->graph_destroy(graph), "graph_destroy");
  expect_gather_error(error_of(after.synchronize()), bad);
  // The stream's record got the error from the check before the capture.
  expect_gather_error(error_of(api()->stream_synchronize(s.s)), bad);
  EXPECT_EQ(fault_of(s.s, true).severity, BP_FAULT_OP_FAILED);
  check(api()->stream_synchronize(s.s), "stream_synchronize once cleared");
}

// ---- e. Good gathers and many events ---------------------------------------------------------

TEST(CudaEvents, GoodGathersWithManyEventsNeverFail) {
  BP_REQUIRE_GPU();
  // More index launches than a stream has records between checks (kIndexSlots = 64).
  constexpr int kRounds = 150;
  Stream side;
  std::vector<Gather> gathers;
  std::vector<std::unique_ptr<Event>> events;
  for (int i = 0; i < kRounds; ++i) gathers.push_back(make_gather(false));
  for (int i = 0; i < kRounds; ++i) {
    const bool on_side = uniform_int(0, 3) == 0;
    bp_stream* s = on_side ? side.s : stream();
    gather_on(s, gathers[static_cast<size_t>(i)].x, gathers[static_cast<size_t>(i)].index,
              gathers[static_cast<size_t>(i)].out);
    events.push_back(std::make_unique<Event>());
    events.back()->record(s);
    if (uniform_int(0, 4) == 0) wait(on_side ? stream() : side.s, *events.back());
    if (uniform_int(0, 9) == 0) check(events.back()->synchronize(), "event_synchronize");
  }
  for (const auto& e : events) check(e->synchronize(), "event_synchronize");
  check(api()->stream_synchronize(side.s), "stream_synchronize (side)");
  sync();
  EXPECT_EQ(fault_of(side.s, false).severity, BP_FAULT_NONE);
  EXPECT_EQ(fault_of(stream(), false).severity, BP_FAULT_NONE);
  for (size_t i = 0; i < gathers.size(); ++i)
    ASSERT_TRUE(close(BP_DTYPE_F32, gathers[i].out.download(), gathers[i].expected(), 0))
        << "gather " << i;
}

}  // namespace
}  // namespace bp_cuda_test
