// Graphs (graph.hpp): a capture on a device's default stream, the graph's private pool, native
// graphs through the plugin's minor-3 slots, and the recorded launch list for plugins without
// them.
//
// Note [Recorded graphs]
//   For a plugin without native graph slots (or with BACKPLANE_GRAPHS=recorded), a capture
//   appends every launch on the captured stream to a list (the Kernel, its descriptors and
//   attributes by value), and likewise memsets and copies within the device or with page-locked
//   host memory; nothing runs. replay() walks the list and calls the plugin's launch, memset and
//   copy slots directly: no checks, no kernel lookup, no allocation, no autograd; a profiler
//   session sees each replay as one host range ("graph replay (recorded)").
//   The descriptors name buffers of the graph's pool or buffers the graph keeps alive, so the
//   addresses stay valid for the graph's life. A replay holds the graph's mutex, so replays of
//   one graph from several threads do not interleave.
//
// Note [Capture threads]
//   A capture belongs to the thread that began it (as CUDA's thread-local capture mode and
//   PyTorch's side-stream capture arrange). The capture is an Interceptor installed on the
//   device (Note [Interceptors] in interceptor.hpp): it takes the capturing thread's launches,
//   copies and memsets on the device's default stream, its tensor allocations, constants and
//   buffer uses, and lets every other thread's operations through to the eager path, so a
//   data-loader thread's work runs while another thread captures. A native capture runs on the
//   device's private capture stream, never on the default stream: the capturing thread's work
//   for the default stream is queued on the capture stream (where the plugin captures it), so
//   other threads' work on the default stream is never captured and nothing is ever freed on a
//   capturing stream. A recorded capture queues nothing. end_capture and abort_capture first
//   clear the device's interceptor, which waits for calls of other threads still inside it, and
//   only then touch the capture's state, so no thread uses it after it is freed. Graphs replay
//   on the default stream.
//
// Note [Graph pool]
//   Tensors created while a capture is open (make_empty) get storage from the graph's pool:
//   blocks allocated on the device's pool stream (never captured; synchronised before the first
//   replay), each handed out through a Lease that shares ownership of the pool. A lease dropped
//   during the capture puts its block back for a later allocation of the same size in the same
//   capture (safe: the captured work runs in capture order on one stream, so the block's
//   earlier uses precede its reuse); after the capture blocks are never reused, since every
//   replay writes them. Constants (host data uploaded during the capture) are never put back.
//   The pool lives while the graph or any tensor of it does; when it goes it waits for the
//   device's default stream first, because eager work queued there may still read its blocks.
#include <backplane/graph.hpp>
#include <backplane/profiler.hpp>

#include "profiler/profiler_internal.hpp"
#include "runtime/interceptor.hpp"
#include "tensor/tensor_internal.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unordered_set>
#include <utility>

namespace bp {
namespace detail {

namespace {

// BACKPLANE_GRAPHS=recorded makes every capture use the recorded list (for tests and
// comparisons); unset or "native" uses a plugin's native graphs where it has them.
bool force_recorded() {
  static const bool v = [] {
    const char* e = std::getenv("BACKPLANE_GRAPHS");
    if (!e || !*e || std::strcmp(e, "native") == 0) return false;
    if (std::strcmp(e, "recorded") == 0) return true;
    throw Error(std::string("BACKPLANE_GRAPHS='") + e +
                "' is not a graph mode; use 'native' (the default) or 'recorded'");
  }();
  return v;
}

void drop_error(const bp_plugin_api* api, bp_error* e) noexcept {
  if (e) api->error_free(e);
}

}  // namespace

// One captured launch, copy or memset of the recorded list.
struct RecordedOp {
  enum Kind : uint8_t { launch, h2d, d2h, d2d, memset } kind = launch;
  const Kernel* kernel = nullptr;
  uint32_t first_desc = 0, nin = 0, nout = 0, first_attr = 0, nattr = 0;
  bp_buffer* dst = nullptr;
  bp_buffer* src = nullptr;
  const void* host_src = nullptr;
  void* host_dst = nullptr;
  uint64_t dst_off = 0, src_off = 0, n = 0;
  int value = 0;
};

struct Recording {
  std::vector<RecordedOp> ops;
  std::vector<bp_tensor_desc> descs;
  std::vector<bp_attr> attrs;
};

// Note [Graph pool].
struct GraphPool {
  GraphPool(Device& d, std::shared_ptr<StreamState> s) : dev(&d), stream(std::move(s)) {}
  ~GraphPool();
  Device* dev;
  std::shared_ptr<StreamState> stream;
  std::mutex mu;  // guards everything below
  std::vector<std::shared_ptr<Buffer>> blocks;
  std::unordered_set<const Buffer*> owned;
  std::multimap<uint64_t, Buffer*> free_blocks;  // during the capture only
  bool open = true;
  uint64_t bytes = 0;

  bool owns(const Buffer* b) {
    std::lock_guard<std::mutex> lock(mu);
    return owned.count(b) != 0;
  }
  void give_back(Buffer* b) noexcept {
    std::lock_guard<std::mutex> lock(mu);
    if (!open) return;
    try {
      free_blocks.emplace(b->size(), b);
    } catch (...) {  // out of memory: the block is simply not reused
    }
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu);
    open = false;
    free_blocks.clear();
  }
};

namespace {
struct Lease {
  Lease(std::shared_ptr<GraphPool> p, Buffer* b, bool c)
      : pool(std::move(p)), block(b), constant(c) {}
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  std::shared_ptr<GraphPool> pool;
  Buffer* block;
  bool constant;
  ~Lease() {
    if (!constant) pool->give_back(block);
  }
};
}  // namespace

// The default stream is never capturing (Note [Capture threads]), so the pool can always wait
// for the replays and the eager work queued there that may still use its blocks.
GraphPool::~GraphPool() {
  DeviceState& s = state(*dev);
  if (bp_stream* h = s.default_handle.load(std::memory_order_acquire))
    drop_error(s.api, s.api->stream_synchronize(h));
  blocks.clear();  // freed on the pool stream
}

[[noreturn]] void refuse_capture(const Device& dev, const char* what, const char* why) {
  throw CaptureError(dev.str() + ": " + what + " cannot be captured in a graph: " + why +
                     ". It did nothing and the capture stays open; do it before begin_capture() "
                     "or after end_capture(), or on another thread (whose work on the device "
                     "runs eagerly)");
}

namespace {
long this_thread_tid() noexcept {
  return static_cast<long>(syscall(SYS_gettid));
}
}  // namespace

// Note [Buffers a graph keeps]
//   A graph keeps alive every buffer its work touches (graph.hpp). It holds their plugin handles,
//   not the Buffer objects: the capture registers each handle with its device
//   (DeviceState::hold_buffer), and a Buffer dropped while some graph holds it leaves its free
//   with the device (defer_free, which ~Buffer tries only while any handle is held: one load
//   otherwise; while any graph holds a handle of the device, each free there takes the table's
//   lock once); the last graph to let go of the handle frees it, after its replays have finished.
//   Holding the objects needed a shared_ptr from a Buffer& (the copies of Device's public API
//   take references), and Buffer's enable_shared_from_this cost every buffer four atomic
//   read-modify-writes of its counts, a quarter of a DLPack import (Note [DLPack import cost]).
class HeldBuffers {
 public:
  HeldBuffers() = default;
  explicit HeldBuffers(DeviceState& ds) noexcept : ds_(&ds) {}
  HeldBuffers(HeldBuffers&& o) noexcept
      : ds_(std::exchange(o.ds_, nullptr)), handles_(std::move(o.handles_)) {}
  HeldBuffers& operator=(HeldBuffers&& o) noexcept {
    if (this != &o) {
      clear();
      ds_ = std::exchange(o.ds_, nullptr);
      handles_ = std::move(o.handles_);
    }
    return *this;
  }
  ~HeldBuffers() { clear(); }

  // Holds `b` until clear() (once however often it is added); throws std::bad_alloc only,
  // holding nothing new then.
  void add(bp_buffer* b) {
    if (!b || !ds_ || !handles_.insert(b).second) return;  // NULL: a 0-byte buffer, nothing to free
    try {
      ds_->hold_buffer(b);
    } catch (...) {
      handles_.erase(b);
      throw;
    }
  }
  void clear() noexcept {
    if (ds_)
      for (bp_buffer* b : handles_) ds_->unhold_buffer(b);
    handles_.clear();
  }

 private:
  DeviceState* ds_ = nullptr;
  std::unordered_set<bp_buffer*> handles_;
};

// An open capture: the interceptor of its device (Note [Capture threads]).
struct CaptureState final : Interceptor {
  Device* dev = nullptr;
  DeviceState* ds = nullptr;
  bp_stream* stream = nullptr;  // the default stream: the capturing thread's work there is taken
  bp_stream* run = nullptr;     // native: the capture stream the plugin captures
  bool native = false;
  std::thread::id owner;
  long owner_tid = 0;  // the owner's kernel thread id, for messages
  std::shared_ptr<GraphPool> pool;
  std::atomic<uint64_t> count{0};
  std::mutex mu;     // guards everything below
  HeldBuffers keep;  // the buffers outside the pool that the captured work touches
  std::vector<const void*> host_refs;  // host blocks the captured copies reference
  Recording rec;

  bool mine() const noexcept { return std::this_thread::get_id() == owner; }

  bool launch(const Kernel& k, bp_stream* s, std::span<const bp_tensor_desc> in,
              std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs) override;
  bool transfer(const Transfer& t) override;
  std::shared_ptr<Buffer> allocate(uint64_t bytes) override;
  std::shared_ptr<Buffer> constant(const void* data, uint64_t n) override;
  void use(const Buffer& b) override {
    if (mine()) keep_buffer(b);
  }
  // Nothing is ever freed on a capturing stream: frees need no help.
  bool release(bp_buffer*, uint64_t, const StreamState*, bool) noexcept override { return false; }
  void host_op(bp_stream* s, const char* what, const char* why) override {
    if (mine() && (!s || s == stream)) refuse_capture(*dev, what, why);
  }

  void keep_buffer(const Buffer& b);
  // Counts a reference to the host_alloc block holding [p, p + n) for the graph's life.
  bool ref_host(const void* p, uint64_t n);
};

namespace {
void record_launch(CaptureState& c, const Kernel& k, std::span<const bp_tensor_desc> in,
                   std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs) {
  std::lock_guard<std::mutex> lock(c.mu);
  Recording& r = c.rec;
  r.ops.push_back({.kind = RecordedOp::launch,
                   .kernel = &k,
                   .first_desc = static_cast<uint32_t>(r.descs.size()),
                   .nin = static_cast<uint32_t>(in.size()),
                   .nout = static_cast<uint32_t>(out.size()),
                   .first_attr = static_cast<uint32_t>(r.attrs.size()),
                   .nattr = static_cast<uint32_t>(attrs.size())});
  r.descs.insert(r.descs.end(), in.begin(), in.end());
  r.descs.insert(r.descs.end(), out.begin(), out.end());
  r.attrs.insert(r.attrs.end(), attrs.begin(), attrs.end());
}

// Queues a recorded memset or copy on `s`: at replay, or during a native capture (where the
// plugin captures it).
void run_transfer(const bp_plugin_api* api, const Device* dev, bp_stream* s, const RecordedOp& op) {
  switch (op.kind) {
    case RecordedOp::h2d:
      check(api, api->copy_h2d(s, op.dst, op.dst_off, op.host_src, op.n), "copy host->device", dev);
      break;
    case RecordedOp::d2h:
      check(api, api->copy_d2h(s, op.host_dst, op.src, op.src_off, op.n), "copy device->host", dev);
      break;
    case RecordedOp::d2d:
      check(api, api->copy_d2d(s, op.dst, op.dst_off, op.src, op.src_off, op.n),
            "copy device->device", dev);
      break;
    case RecordedOp::memset:
      check(api, api->memset(s, op.dst, op.dst_off, op.value, op.n), "memset", dev);
      break;
    case RecordedOp::launch:
      break;
  }
}
}  // namespace

bool CaptureState::launch(const Kernel& k, bp_stream* s, std::span<const bp_tensor_desc> in,
                          std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs) {
  if (s != stream || !mine()) return false;
  if (native)
    launch_unobserved(k, run, in, out, attrs);
  else
    record_launch(*this, k, in, out, attrs);
  count.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool CaptureState::ref_host(const void* p, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu);
  host_refs.reserve(host_refs.size() + 1);
  if (!ds->is_host_block(p, n, true)) return false;
  host_refs.push_back(p);
  return true;
}

bool CaptureState::transfer(const Transfer& t) {
  if (t.stream != stream || !mine()) return false;
  RecordedOp op{.dst = t.dst ? handle(*t.dst) : nullptr,
                .src = t.src ? handle(*t.src) : nullptr,
                .host_src = t.host_src,
                .host_dst = t.host_dst,
                .dst_off = t.dst_off,
                .src_off = t.src_off,
                .n = t.n,
                .value = t.value};
  switch (t.kind) {
    case Transfer::h2d:
      op.kind = RecordedOp::h2d;
      if (!ref_host(t.host_src, t.n))
        refuse_capture(*dev, "a copy from pageable host memory",
                       "a graph copies from page-locked memory only (Device::host_alloc), whose "
                       "contents each replay reads again");
      break;
    case Transfer::d2h:
      op.kind = RecordedOp::d2h;
      if (!ref_host(t.host_dst, t.n))
        refuse_capture(*dev, "a copy to pageable host memory",
                       "a graph copies to page-locked memory only (Device::host_alloc)");
      break;
    case Transfer::d2d:
      op.kind = RecordedOp::d2d;
      break;
    case Transfer::memset:
      op.kind = RecordedOp::memset;
      break;
  }
  if (t.dst) keep_buffer(*t.dst);
  if (t.src) keep_buffer(*t.src);
  if (native) {
    run_transfer(ds->api, dev, run, op);
  } else {
    std::lock_guard<std::mutex> lock(mu);
    rec.ops.push_back(op);
  }
  count.fetch_add(1, std::memory_order_relaxed);
  return true;
}

namespace {
std::shared_ptr<Buffer> lease(CaptureState& c, uint64_t bytes, bool constant) {
  GraphPool& p = *c.pool;
  Buffer* block = nullptr;
  if (!constant) {
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = p.free_blocks.find(bytes);
    if (it != p.free_blocks.end()) {
      block = it->second;
      p.free_blocks.erase(it);
    }
  }
  if (!block) {
    std::shared_ptr<Buffer> b = c.ds->allocate(bytes, p.stream);
    std::lock_guard<std::mutex> lock(p.mu);
    p.blocks.push_back(b);
    p.owned.insert(b.get());
    p.bytes += bytes;
    block = b.get();
  }
  auto l = std::make_shared<Lease>(c.pool, block, constant);
  return std::shared_ptr<Buffer>(l, block);  // shares ownership with the lease
}
}  // namespace

std::shared_ptr<Buffer> CaptureState::allocate(uint64_t bytes) {
  if (!mine()) return nullptr;  // another thread's tensor: an eager allocation
  return lease(*this, bytes, false);
}

std::shared_ptr<Buffer> CaptureState::constant(const void* data, uint64_t n) {
  if (!mine()) return nullptr;
  std::shared_ptr<Buffer> b = lease(*this, n, true);
  if (n == 0) return b;
  const bp_plugin_api* api = ds->api;
  if (void* hp = b->host_pointer()) {
    std::memcpy(hp, data, n);
  } else {
    bp_stream* ps = pool->stream->s;
    check(api, api->copy_h2d(ps, handle(*b), 0, data, n), "upload a graph constant", dev);
    check(api, api->stream_synchronize(ps), "upload a graph constant", dev);
  }
  return b;
}

void CaptureState::keep_buffer(const Buffer& b) {
  if (pool->owns(&b)) return;  // the pool keeps its own blocks
  std::lock_guard<std::mutex> lock(mu);
  keep.add(handle(b));  // Note [Buffers a graph keeps]
}

// What a Graph holds (graph.hpp).
struct GraphState {
  Device* dev = nullptr;
  std::unique_ptr<CaptureState> capture;  // while capturing
  bool native = false;
  bp_graph* graph = nullptr;
  bp_stream* stream = nullptr;  // the default stream: replays run there
  std::shared_ptr<GraphPool> pool;
  HeldBuffers keep;  // let go after the destructor has waited for the replays
  std::vector<const void*> host_refs;
  Recording rec;
  uint64_t num_ops = 0;
  std::mutex replay_mu;  // one replay of this graph at a time (native and recorded)

  ~GraphState() {
    if (!dev) return;
    DeviceState& s = state(*dev);
    // Replays may still be queued: wait for them. The default stream never captures (Note
    // [Capture threads]), so this is possible whatever capture is open.
    if (graph || !rec.ops.empty()) drop_error(s.api, s.api->stream_synchronize(stream));
    if (graph) drop_error(s.api, s.plugin.graph.destroy(graph));
    for (const void* p : host_refs) s.unref_host_block(p);
  }
};

namespace {
// Clears the device's interceptor and waits for calls still inside it: afterwards no thread
// uses `c`, and the device is eager again.
void close_capture(CaptureState& c) noexcept {
  uninstall_interceptor(*c.ds);
  c.pool->close();
}

std::string thread_name(long tid) {
  return "thread " + std::to_string(tid);
}
}  // namespace

}  // namespace detail

using detail::CaptureState;
using detail::GraphState;

Graph::Graph() noexcept = default;
Graph::~Graph() {
  abort_capture();
}
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    abort_capture();
    s_ = std::move(o.s_);
  }
  return *this;
}

void Graph::begin_capture(Device& device, GraphMode mode) {
  if (s_)
    throw Error(device.str() + ": Graph::begin_capture on a graph that already holds " +
                (s_->capture ? "an open capture" : "a captured graph") +
                "; use a new bp::Graph for each capture");
  detail::DeviceState& ds = detail::state(device);
  auto st = std::make_unique<GraphState>();
  auto c = std::make_unique<CaptureState>();
  c->dev = &device;
  c->ds = &ds;
  c->keep = detail::HeldBuffers(ds);
  c->stream = ds.stream_handle();
  c->owner = std::this_thread::get_id();
  c->owner_tid = detail::this_thread_tid();
  c->native = ds.plugin.graph.begin_capture != nullptr && mode == GraphMode::automatic &&
              !detail::force_recorded();
  {
    std::lock_guard<std::mutex> lock(ds.mu);
    auto make_stream = [&](std::shared_ptr<detail::StreamState>& slot, const char* what) {
      if (slot) return;
      bp_stream* h = nullptr;
      detail::check(ds.api, ds.api->stream_create(ds.index, &h), what, &device);
      slot = std::make_shared<detail::StreamState>(device, h);
    };
    make_stream(ds.pool_stream, "create the graph pool stream");
    if (c->native) make_stream(ds.capture_stream, "create the graph capture stream");
    c->pool = std::make_shared<detail::GraphPool>(device, ds.pool_stream);
    if (c->native) c->run = ds.capture_stream->s;
  }
  if (!detail::install_interceptor(ds, c.get())) {
    std::string who = "another thread";
    {
      detail::InterceptorPin p(ds);
      if (auto* o = p ? dynamic_cast<CaptureState*>(p.operator->()) : nullptr)
        who = o->mine() ? "this thread" : detail::thread_name(o->owner_tid);
    }
    throw CaptureError(device.str() +
                       ": Graph::begin_capture while another capture is open on this "
                       "device (begun by " +
                       who +
                       "; one capture at a time per device; end or abort "
                       "the other first)");
  }
  if (c->native) {
    if (bp_error* e = ds.plugin.graph.begin_capture(c->run)) {
      detail::close_capture(*c);
      detail::throw_plugin_error(ds.api, e, device.str() + ": begin graph capture");
    }
  }
  st->dev = &device;
  st->native = c->native;
  st->stream = c->stream;
  st->capture = std::move(c);
  s_ = std::move(st);
}

void Graph::end_capture() {
  if (!s_ || !s_->capture)
    throw Error("Graph::end_capture without an open capture (call begin_capture first)");
  GraphState& g = *s_;
  if (!g.capture->mine())
    throw Error(g.dev->str() + ": Graph::end_capture on " +
                detail::thread_name(detail::this_thread_tid()) + ", but the capture belongs to " +
                detail::thread_name(g.capture->owner_tid) +
                ", which began it (Note [Graph semantics]); end it there, or abort_capture()");
  std::unique_ptr<CaptureState> c = std::move(g.capture);
  detail::DeviceState& ds = *c->ds;
  detail::close_capture(*c);  // no thread is inside the capture after this
  bp_error* err = nullptr;
  bp_graph* graph = nullptr;
  if (c->native) err = ds.plugin.graph.end_capture(c->run, &graph);
  std::shared_ptr<detail::GraphPool> pool = c->pool;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    g.keep = std::move(c->keep);
    g.rec = std::move(c->rec);
    g.host_refs = std::move(c->host_refs);
  }
  g.num_ops = c->count.load(std::memory_order_relaxed);
  c.reset();
  auto fail = [&](bp_error* e, const char* what) {
    if (graph) detail::drop_error(ds.api, ds.plugin.graph.destroy(graph));
    g.keep.clear();
    g.rec = {};
    g.num_ops = 0;
    Device& dev = *g.dev;
    s_.reset();  // drops the host references
    pool.reset();
    detail::throw_plugin_error(ds.api, e, dev.str() + ": " + what);
  };
  if (err) fail(err, "end graph capture");
  // The pool's blocks were allocated on the pool stream: they must exist before a replay.
  if (bp_error* e = ds.api->stream_synchronize(pool->stream->s)) fail(e, "graph pool");
  if (graph) {
    if (bp_error* e = ds.plugin.graph.instantiate(graph)) fail(e, "instantiate graph");
  }
  g.graph = graph;
  g.pool = std::move(pool);
}

void Graph::abort_capture() noexcept {
  if (!s_ || !s_->capture) return;
  std::unique_ptr<CaptureState> c = std::move(s_->capture);
  detail::DeviceState& ds = *c->ds;
  detail::close_capture(*c);
  bp_graph* graph = nullptr;
  if (c->native) {
    if (bp_error* e = ds.plugin.graph.end_capture(c->run, &graph)) ds.api->error_free(e);
  }
  if (graph) detail::drop_error(ds.api, ds.plugin.graph.destroy(graph));
  for (const void* p : c->host_refs) ds.unref_host_block(p);  // nothing of the graph ran
  c.reset();
  s_.reset();
}

void Graph::replay() {
  if (!s_) throw Error("Graph::replay on an empty graph (nothing was captured)");
  GraphState& g = *s_;
  if (g.capture)
    throw Error(g.dev->str() + ": Graph::replay while its capture is open (end_capture first)");
  detail::DeviceState& ds = detail::state(*g.dev);
  detail::intercepted_host_op(ds, nullptr, "replaying another graph",
                              "graphs are not nested; replay before begin_capture or after "
                              "end_capture");
  profiler::Range range(g.native ? "graph replay (native)" : "graph replay (recorded)");
  std::lock_guard<std::mutex> lock(g.replay_mu);
  if (g.graph) {
    ds.check_alive();
    ds.begin_transfer(g.stream, detail::OpKind::graph, 0);
    detail::check(ds.api, ds.plugin.graph.launch(g.graph, g.stream), "graph replay", g.dev);
    return;
  }
  const bp_plugin_api* api = ds.api;
  const bp_tensor_desc* descs = g.rec.descs.data();
  const bp_attr* attrs = g.rec.attrs.data();
  for (const auto& op : g.rec.ops) {
    if (op.kind == detail::RecordedOp::launch)
      detail::launch_unobserved(*op.kernel, g.stream, {descs + op.first_desc, op.nin},
                                {descs + op.first_desc + op.nin, op.nout},
                                {attrs + op.first_attr, op.nattr});
    else
      detail::run_transfer(api, g.dev, g.stream, op);
  }
}

bool Graph::empty() const noexcept {
  return !s_;
}
bool Graph::capturing() const noexcept {
  return s_ && s_->capture;
}
Device& Graph::device() const {
  if (!s_) throw Error("Graph::device on an empty graph");
  return *s_->dev;
}
bool Graph::native() const noexcept {
  return s_ && s_->native;
}
uint64_t Graph::num_ops() const noexcept {
  if (!s_) return 0;
  return s_->capture ? s_->capture->count.load(std::memory_order_relaxed) : s_->num_ops;
}
uint64_t Graph::pool_bytes() const noexcept {
  if (!s_) return 0;
  const std::shared_ptr<detail::GraphPool>& p = s_->capture ? s_->capture->pool : s_->pool;
  if (!p) return 0;
  std::lock_guard<std::mutex> lock(p->mu);
  return p->bytes;
}

Graph capture(Device& device, const std::function<void()>& fn, GraphMode mode) {
  Graph g;
  g.begin_capture(device, mode);
  try {
    fn();
  } catch (...) {
    g.abort_capture();
    throw;
  }
  g.end_capture();
  return g;
}

bool is_capturing(const Device& device) noexcept {
  detail::DeviceState& ds = detail::state(device);
  if (!ds.interceptor.load(std::memory_order_acquire)) return false;
  detail::InterceptorPin p(ds);
  auto* c = p ? dynamic_cast<CaptureState*>(p.operator->()) : nullptr;
  return c && c->mine();
}

}  // namespace bp
