// The profiler's recording side: sessions, the hooks of profiler_internal.hpp, device intervals
// from plugin events (Note [Device time] in profiler.hpp) and the memory history.
//
// Note [Memory history]
//   While the profiler runs or record_memory_history(true) is on, every allocation of a device
//   buffer enters a table of live blocks (device, handle -> size, stream, op, sequence) and every
//   free leaves it. The op of a block is the op that first writes it: an op allocates its output
//   before it launches, so the block enters the table unattributed (or attributed to the
//   thread's current profiler::Range) and the launch (or copy) that has it as an output names it.
//   memory_snapshot() reports the table with the plugin's statistics; what the plugin counts and
//   the table does not is reported as untracked, so the two always add up.
#include "profiler/profiler_internal.hpp"
#include "runtime/registry.hpp"

#include <backplane/ops.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace bp {

namespace {
void write_env_trace();  // BACKPLANE_TRACE, below
}  // namespace

namespace detail {

namespace {

thread_local const char* t_label = nullptr;     // current op or Range of this thread
thread_local const char* t_implicit = nullptr;  // next sync is implicit (what)
thread_local const Device* t_implicit_dev = nullptr;
thread_local int t_tid = -1;
std::atomic<int> g_next_tid{0};

int thread_number() {
  if (t_tid < 0) t_tid = g_next_tid.fetch_add(1, std::memory_order_relaxed);
  return t_tid;
}

bool profiling(uint32_t f) {
  return (f & kObserveProfile) != 0;
}

void set_flag(uint32_t bit, bool on) {
  if (on)
    g_observe.fetch_or(bit, std::memory_order_relaxed);
  else
    g_observe.fetch_and(~bit, std::memory_order_relaxed);
}

// Caller holds o.mu.
DeviceTrack& device_track(ObserverState& o, Device& dev) {
  for (auto& t : o.devices)
    if (t->dev == &dev) return *t;
  auto t = std::make_unique<DeviceTrack>();
  t->dev = &dev;
  t->pid = static_cast<int>(o.devices.size()) + 1;  // pid 0 is the host
  const bp_plugin_api* api = state(dev).api;
  t->timing = api->event_create && api->event_record && api->event_elapsed_ms &&
              api->event_synchronize && api->event_destroy;
  o.devices.push_back(std::move(t));
  return *o.devices.back();
}

bp_event* new_event(DeviceTrack& t) {
  DeviceState& s = state(*t.dev);
  bp_event* e = nullptr;
  check(s.api, s.api->event_create(s.index, &e), "profiler: create event", t.dev);
  t.events.push_back(e);
  return e;
}

// The stream's track; on first use in the session, a reference event recorded right after a
// synchronisation fixes where the stream's device time sits on the host clock. Caller holds o.mu.
StreamTrack& stream_track(ObserverState& o, DeviceTrack& t, bp_stream* s) {
  for (auto& st : t.streams)
    if (st.handle == s) return st;
  StreamTrack st;
  st.handle = s;
  st.number = stream_number(o, *t.dev, s);
  const bp_plugin_api* api = state(*t.dev).api;
  if (o.options.device_time && t.timing) {
    check(api, api->stream_synchronize(s), "profiler: stream synchronize", t.dev);
    st.ref = new_event(t);
    // The stream is idle: the event completes right after it is queued. The host time before
    // queueing it is a lower bound for that moment (the time after waiting for it can be late by
    // a scheduling delay), so device intervals are never placed later than they ran.
    st.ref_ns = clock_ns();
    check(api, api->event_record(st.ref, s), "profiler: event record", t.dev);
    check(api, api->event_synchronize(st.ref), "profiler: event synchronize", t.dev);
  }
  t.streams.push_back(st);
  return t.streams.back();
}

// Caller holds o.mu.
Interval begin_interval(ObserverState& o, Device& dev, bp_stream* s) {
  Interval b;
  b.generation = o.generation;
  DeviceTrack& t = device_track(o, dev);
  const StreamTrack& st = stream_track(o, t, s);
  b.stream = st.number;
  if (!o.options.device_time) return b;
  const bp_plugin_api* api = state(dev).api;
  if (t.timing) {
    b.ref = st.ref;
    b.ref_ns = st.ref_ns;
    b.e0 = new_event(t);
    b.e1 = new_event(t);
    check(api, api->event_record(b.e0, s), "profiler: event record", &dev);
  } else {
    check(api, api->stream_synchronize(s), "profiler: stream synchronize", &dev);
    b.dev0 = clock_ns();
  }
  return b;
}

// The end of the interval, into `r`. Caller holds o.mu and has checked the generation.
void end_interval(ObserverState& o, Interval& b, Device& dev, bp_stream* s, Rec& r) {
  r.stream = b.stream;
  const bp_plugin_api* api = state(dev).api;
  if (b.e0) {
    check(api, api->event_record(b.e1, s), "profiler: event record", &dev);
    r.e0 = b.e0;
    r.e1 = b.e1;
    r.ref = b.ref;
    r.ref_ns = b.ref_ns;
  } else if (b.dev0 >= 0) {
    check(api, api->stream_synchronize(s), "profiler: stream synchronize", &dev);
    b.dev1 = clock_ns();
    r.dev0 = b.dev0 - o.t0;
    r.device_us = static_cast<double>(b.dev1 - b.dev0) / 1e3;
  }
}

// Names the block written by `what` when no op has named it yet. Caller holds o.mu.
void attribute(ObserverState& o, const Device& dev, const bp_buffer* b, const char* what) {
  if (!b) return;
  auto it = o.live.find({&dev, b});
  if (it == o.live.end() || !it->second.op.empty()) return;
  it->second.op = what;
  if (it->second.rec >= 0 && static_cast<size_t>(it->second.rec) < o.recs.size())
    o.recs[static_cast<size_t>(it->second.rec)].detail = what;
}

std::string shapes_of(std::span<const bp_tensor_desc> in) {
  std::string s;
  for (const bp_tensor_desc& d : in) {
    if (!s.empty()) s += ", ";
    s += dtype_name(static_cast<DType>(d.dtype));
    s += '[';
    for (int32_t i = 0; i < d.rank; ++i) {
      if (i) s += ',';
      s += std::to_string(d.shape[i]);
    }
    s += ']';
  }
  return s;
}

void memory_after(Device& dev, Rec& r) {
  DeviceState& s = state(dev);
  bp_memory_stats m{};
  m.struct_size = sizeof m;
  if (bp_error* e = s.api->memory_stats(s.index, &m)) {
    s.api->error_free(e);
    return;
  }
  r.allocated_after = s.memory.allocated();  // Note [Memory accounting]
  r.reserved_after = m.reserved;
}

// Waits for the session's events and fills in device intervals; destroys the events. Caller
// holds o.mu.
void resolve(ObserverState& o) {
  for (Rec& r : o.recs) {
    if (!r.e0) continue;
    const bp_plugin_api* api = state(*r.dev).api;
    double start_ms = 0, dur_ms = 0;
    check(api, api->event_synchronize(r.e1), "profiler: event synchronize", r.dev);
    check(api, api->event_elapsed_ms(r.ref, r.e0, &start_ms), "profiler: event elapsed", r.dev);
    check(api, api->event_elapsed_ms(r.e0, r.e1, &dur_ms), "profiler: event elapsed", r.dev);
    r.dev0 = r.ref_ns - o.t0 + static_cast<int64_t>(start_ms * 1e6);
    r.device_us = dur_ms * 1e3;
    r.e0 = r.e1 = r.ref = nullptr;
  }
  for (auto& t : o.devices) {
    const bp_plugin_api* api = state(*t->dev).api;
    for (bp_event* e : t->events)
      if (bp_error* err = api->event_destroy(e)) api->error_free(err);
    t->events.clear();
    t->streams.clear();
  }
}

}  // namespace

ObserverState& observer() {
  static ObserverState* s = new ObserverState;  // Note [Plugin lifetime]: used at exit
  return *s;
}

int stream_number(ObserverState& o, Device& dev, bp_stream* s) {
  if (s == state(dev).default_handle.load(std::memory_order_acquire)) return 0;
  std::vector<bp_stream*>& seen = o.stream_numbers[&dev];
  auto it = std::find(seen.begin(), seen.end(), s);
  if (it != seen.end()) return static_cast<int>(it - seen.begin()) + 1;
  seen.push_back(s);
  return static_cast<int>(seen.size());
}

const char* copy_name(CopyKind k) noexcept {
  switch (k) {
    case CopyKind::h2d:
      return "copy_h2d";
    case CopyKind::d2h:
      return "copy_d2h";
    case CopyKind::d2d:
      return "copy_d2d";
    case CopyKind::peer:
      return "copy_peer";
    case CopyKind::memset:
      return "memset";
  }
  return "copy";
}

void launch_observed(const Kernel& k, bp_stream* stream, std::span<const bp_tensor_desc> in,
                     std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs) {
  ObserverState& o = observer();
  Device& dev = k.device();
  const char* name = op_name(k.op()).data();  // the catalogue's names are literals
  const uint32_t f = g_observe.load(std::memory_order_relaxed);
  if (!profiling(f)) {
    {
      std::lock_guard<std::mutex> lock(o.mu);
      for (const bp_tensor_desc& d : out) attribute(o, dev, d.buffer, name);
    }
    launch_unobserved(k, stream, in, out, attrs);
    return;
  }
  std::string shapes = shapes_of(in);  // before the clock starts
  const int64_t h0 = clock_ns();
  Interval b;
  bool running = false;
  {
    std::lock_guard<std::mutex> lock(o.mu);
    for (const bp_tensor_desc& d : out) attribute(o, dev, d.buffer, name);
    running = o.running;  // false: stopped meanwhile
    if (running) b = begin_interval(o, dev, stream);
    if (!o.options.record_shapes) shapes.clear();
  }
  if (!running) {
    launch_unobserved(k, stream, in, out, attrs);
    return;
  }
  const char* outer = t_label;
  t_label = name;
  try {
    launch_unobserved(k, stream, in, out, attrs);
  } catch (...) {
    t_label = outer;
    throw;
  }
  t_label = outer;
  const int64_t h1 = clock_ns();
  std::lock_guard<std::mutex> lock(o.mu);
  if (!o.running || o.generation != b.generation) return;  // stopped (and maybe restarted)
  Rec r;
  end_interval(o, b, dev, stream, r);
  r.kind = RecKind::op;
  r.dev = &dev;
  r.tid = thread_number();
  r.name = name;
  r.dtype = dtype_name(k.dtype());
  r.detail = std::move(shapes);
  r.host0 = h0 - o.t0;
  r.host1 = h1 - o.t0;
  o.recs.push_back(std::move(r));
}

namespace {

CopyRecord* copy_begin(CopyKind kind, Device& dev, bp_stream* stream, uint64_t bytes,
                       const bp_buffer* dst) {
  ObserverState& o = observer();
  std::lock_guard<std::mutex> lock(o.mu);
  if (dst) attribute(o, dev, dst, copy_name(kind));
  if (!o.running) return nullptr;
  auto* r = new CopyRecord;
  r->kind = kind;
  r->dev = &dev;
  r->stream = stream;
  r->bytes = bytes;
  r->tid = thread_number();
  r->host0 = clock_ns();
  r->interval = begin_interval(o, dev, stream);
  return r;
}

void copy_end(const CopyRecord& c) {
  ObserverState& o = observer();
  std::lock_guard<std::mutex> lock(o.mu);
  if (!o.running || o.generation != c.interval.generation) return;
  Rec r;
  Interval interval = c.interval;
  end_interval(o, interval, *c.dev, c.stream, r);
  r.kind = RecKind::copy;
  r.name = copy_name(c.kind);
  r.dev = c.dev;
  r.tid = c.tid;
  r.bytes = c.bytes;
  r.host0 = c.host0 - o.t0;
  r.host1 = clock_ns() - o.t0;
  o.recs.push_back(std::move(r));
}

}  // namespace

void on_alloc(Device& dev, const bp_buffer* b, uint64_t size, const StreamState* stream) {
  ObserverState& o = observer();
  std::lock_guard<std::mutex> lock(o.mu);
  if (!observing()) return;
  bp_stream* sh = stream ? stream->s : state(dev).default_handle.load(std::memory_order_acquire);
  LiveBlock blk;
  blk.size = size;
  blk.stream = stream_number(o, dev, sh);
  blk.op = t_label ? t_label : "";
  blk.sequence = o.sequence++;
  if (o.running) {
    Rec r;
    r.kind = RecKind::alloc;
    r.name = "alloc";
    r.dev = &dev;
    r.stream = blk.stream;
    r.tid = thread_number();
    r.host0 = r.host1 = clock_ns() - o.t0;
    r.bytes = size;
    r.buffer = reinterpret_cast<uintptr_t>(b);
    r.detail = blk.op;
    memory_after(dev, r);
    blk.rec = static_cast<int64_t>(o.recs.size());
    o.recs.push_back(std::move(r));
  }
  o.live[{&dev, b}] = std::move(blk);
}

void on_free(Device& dev, const bp_buffer* b, uint64_t size) {
  ObserverState& o = observer();
  std::lock_guard<std::mutex> lock(o.mu);
  auto it = o.live.find({&dev, b});
  std::string op;
  int stream = 0;
  if (it != o.live.end()) {
    op = std::move(it->second.op);
    stream = it->second.stream;
    o.live.erase(it);
  }
  if (!o.running) return;
  Rec r;
  r.kind = RecKind::free;
  r.name = "free";
  r.dev = &dev;
  r.stream = stream;
  r.tid = thread_number();
  r.host0 = r.host1 = clock_ns() - o.t0;
  r.bytes = size;
  r.buffer = reinterpret_cast<uintptr_t>(b);
  r.detail = std::move(op);
  memory_after(dev, r);
  o.recs.push_back(std::move(r));
}

void on_sync(Device& dev, bp_stream* stream, int64_t t0) {
  ObserverState& o = observer();
  const char* implicit = t_implicit_dev == &dev ? t_implicit : nullptr;
  t_implicit = nullptr;
  t_implicit_dev = nullptr;
  std::lock_guard<std::mutex> lock(o.mu);
  if (!o.running) return;
  Rec r;
  r.kind = RecKind::sync;
  r.implicit = implicit != nullptr;
  r.name = implicit ? "implicit synchronize" : "synchronize";
  r.detail = implicit ? implicit : "";
  r.dev = &dev;
  r.stream = stream_number(o, dev, stream);
  r.tid = thread_number();
  r.host0 = t0 - o.t0;
  r.host1 = clock_ns() - o.t0;
  o.recs.push_back(std::move(r));
}

void on_implicit_sync(const Device& dev, const char* what) {
  t_implicit = what;
  t_implicit_dev = &dev;
}

void on_collective(const char* op, Device& dev, uint64_t bytes, int64_t t0,
                   const std::string& what) {
  ObserverState& o = observer();
  std::lock_guard<std::mutex> lock(o.mu);
  if (!o.running) return;
  Rec r;
  r.kind = RecKind::collective;
  r.name = op;
  r.dev = &dev;
  r.tid = thread_number();
  r.bytes = bytes;
  r.detail = what;
  r.host0 = t0 - o.t0;
  r.host1 = clock_ns() - o.t0;
  o.recs.push_back(std::move(r));
}

namespace {

// The profiler's Observer (Note [Observers] in runtime/observer.hpp), registered while
// libbackplane loads.
class ProfilerObserver final : public Observer {
 public:
  void launch(const Kernel& k, bp_stream* stream, std::span<const bp_tensor_desc> in,
              std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs) override {
    launch_observed(k, stream, in, out, attrs);
  }
  void* copy_begin(CopyKind kind, Device& dev, bp_stream* stream, uint64_t bytes,
                   const bp_buffer* dst) override {
    return detail::copy_begin(kind, dev, stream, bytes, dst);
  }
  void copy_end(void* record, bool done) noexcept override {
    std::unique_ptr<CopyRecord> r(static_cast<CopyRecord*>(record));
    if (!done) return;
    try {
      detail::copy_end(*r);
    } catch (...) {  // a copy records what it can; it never fails for the profiler
    }
  }
  void alloc(Device& dev, const bp_buffer* b, uint64_t size, const StreamState* s) override {
    on_alloc(dev, b, size, s);
  }
  void free(Device& dev, const bp_buffer* b, uint64_t size) override { on_free(dev, b, size); }
  void sync(Device& dev, bp_stream* stream, int64_t t0) override { on_sync(dev, stream, t0); }
  void implicit_sync(const Device& dev, const char* what) override { on_implicit_sync(dev, what); }
  void oom_users(Device& dev, std::string& out) override { oom_top_users(dev, out); }
  void process_exit() noexcept override { write_env_trace(); }
};

[[maybe_unused]] const bool g_registered = [] {
  static ProfilerObserver* o = new ProfilerObserver;  // used at exit: never destroyed
  set_observer(o);
  return true;
}();

}  // namespace
}  // namespace detail

// ---- Public API ------------------------------------------------------------------------------

namespace profiler {

using detail::observer;
using detail::ObserverState;

void start(const Options& options) {
  ObserverState& o = observer();
  std::lock_guard<std::mutex> lock(o.mu);
  if (o.running) throw Error("bp::profiler::start: a session is already running; stop() it first");
  o.recs.clear();
  o.devices.clear();
  o.options = options;
  o.has_session = true;
  o.running = true;
  ++o.generation;
  o.t0 = detail::clock_ns();
  o.t1 = 0;
  detail::set_flag(detail::kObserveProfile, true);
}

void stop() {
  ObserverState& o = observer();
  std::lock_guard<std::mutex> lock(o.mu);
  if (!o.running) throw Error("bp::profiler::stop: no session is running; start() one first");
  o.running = false;
  detail::set_flag(detail::kObserveProfile, false);
  o.t1 = detail::clock_ns();
  if (!(detail::g_observe.load() & detail::kObserveMemory)) {
    o.live.clear();
    o.stream_numbers.clear();
  }
  detail::resolve(o);
}

bool is_running() noexcept {
  return (detail::g_observe.load(std::memory_order_relaxed) & detail::kObserveProfile) != 0;
}

Profile::Profile(std::string trace_path, const Options& options) : path_(std::move(trace_path)) {
  start(options);
}

Profile::~Profile() {
  try {
    stop();
    if (!path_.empty()) save(path_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "backplane: profiler: %s\n", e.what());
  }
}

Range::Range(const char* name) noexcept : name_(nullptr), outer_(nullptr), t0_ns_(0) {
  if (!detail::observing()) [[likely]]
    return;
  name_ = name;
  outer_ = detail::t_label;
  detail::t_label = name;
  t0_ns_ = detail::clock_ns();
}

Range::~Range() {
  if (!name_) [[likely]]
    return;
  detail::t_label = outer_;
  ObserverState& o = observer();
  std::lock_guard<std::mutex> lock(o.mu);
  if (!o.running) return;
  detail::Rec r;
  r.kind = detail::RecKind::range;
  r.name = name_;
  r.tid = detail::thread_number();
  r.host0 = std::max<int64_t>(t0_ns_ - o.t0, 0);
  r.host1 = detail::clock_ns() - o.t0;
  o.recs.push_back(std::move(r));
}

}  // namespace profiler

void record_memory_history(bool on) {
  detail::ObserverState& o = detail::observer();
  std::lock_guard<std::mutex> lock(o.mu);
  detail::set_flag(detail::kObserveMemory, on);
  if (!on && !o.running) {
    o.live.clear();
    o.stream_numbers.clear();
  }
}

bool memory_history_enabled() noexcept {
  return (detail::g_observe.load(std::memory_order_relaxed) & detail::kObserveMemory) != 0;
}

// ---- BACKPLANE_TRACE -------------------------------------------------------------------------

namespace {

std::string& env_trace_path() {
  static std::string* p = new std::string;
  return *p;
}

// Once: at the first of the runtime's exit notice (ProfilerObserver::process_exit, before the
// plugins' own exit handlers unload their drivers) and the exit handler registered below.
void write_env_trace() {
  static std::atomic<bool> written{false};
  if (env_trace_path().empty() || written.exchange(true)) return;
  try {
    if (profiler::is_running()) profiler::stop();
    profiler::save(env_trace_path());
    std::fprintf(stderr, "backplane: trace written to %s (BACKPLANE_TRACE)\n",
                 env_trace_path().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "backplane: BACKPLANE_TRACE=%s: %s\n", env_trace_path().c_str(), e.what());
  }
}

// Note [Whole-run traces]: BACKPLANE_TRACE=path starts a session when libbackplane is loaded and
// writes the trace when the process exits normally (std::exit or returning from main). Only the
// profiler's own state is touched here: no plugin is loaded before the program asks.
struct EnvTrace {
  EnvTrace() {
    const char* p = std::getenv("BACKPLANE_TRACE");
    if (!p || !*p) return;
    env_trace_path() = p;
    profiler::start();
    std::atexit(write_env_trace);
  }
};
const EnvTrace g_env_trace;

}  // namespace

}  // namespace bp
