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

#include "graph/graph_internal.hpp"
#include "profiler/profiler_internal.hpp"
#include "tensor/tensor_internal.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

namespace bp {
namespace detail {

std::atomic<int> g_open_captures{0};

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

struct CaptureState {
  Device* dev = nullptr;
  DeviceState* ds = nullptr;
  bp_stream* stream = nullptr;
  bool native = false;
  std::shared_ptr<GraphPool> pool;
  std::atomic<uint64_t> count{0};
  std::mutex mu;  // guards everything below
  std::vector<std::shared_ptr<Buffer>> keep;
  std::unordered_set<const Buffer*> kept;
  struct Deferred {
    bp_buffer* b;
    uint64_t size;
    bool counted;
  };
  std::vector<Deferred> deferred;
  Recording rec;
};

GraphPool::~GraphPool() {
  DeviceState& s = state(*dev);
  if (CaptureState* c = s.capture.load(std::memory_order_acquire)) {
    // Waiting for the stream is not possible while it is capturing: the open capture keeps the
    // blocks until its own graph goes (which waits).
    std::lock_guard<std::mutex> lock(c->mu);
    try {
      c->keep.insert(c->keep.end(), blocks.begin(), blocks.end());
    } catch (...) {  // out of memory: the blocks are freed unordered; nothing better is possible
    }
    return;
  }
  if (bp_stream* h = s.default_handle.load(std::memory_order_acquire))
    drop_error(s.api, s.api->stream_synchronize(h));
  blocks.clear();  // freed on the pool stream
}

bp_stream* capture_stream(const CaptureState& c) noexcept {
  return c.stream;
}

[[noreturn]] void refuse_capture(const Device& dev, const char* what, const char* why) {
  throw CaptureError(dev.str() + ": " + what + " cannot be captured in a graph: " + why +
                     ". It did nothing and the capture stays open; do it before begin_capture() "
                     "or after end_capture()");
}

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

void record(CaptureState& c, const RecordedOp& op) {
  std::lock_guard<std::mutex> lock(c.mu);
  c.rec.ops.push_back(op);
}

bool is_host_block(DeviceState& s, const void* p, uint64_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(s.host_mu);
  auto it = s.host_blocks.upper_bound(a);
  if (it == s.host_blocks.begin()) return false;
  --it;
  return a >= it->first && a + n <= it->first + it->second;
}

}  // namespace

bool capture_launch(CaptureState& c, const Kernel& k, bp_stream* stream,
                    std::span<const bp_tensor_desc> in, std::span<const bp_tensor_desc> out,
                    std::span<const bp_attr> attrs) {
  if (stream != c.stream) return false;
  if (c.native)
    launch_unobserved(k, stream, in, out, attrs);
  else
    record_launch(c, k, in, out, attrs);
  c.count.fetch_add(1, std::memory_order_relaxed);
  return true;
}

namespace {
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

bool capture_transfer(CaptureState& c, const RecordedOp& op) {
  if (c.native)
    run_transfer(c.ds->api, c.dev, c.stream, op);
  else
    record(c, op);
  c.count.fetch_add(1, std::memory_order_relaxed);
  return true;
}
}  // namespace

bool capture_h2d(CaptureState& c, bp_stream* s, Buffer& dst, uint64_t off, const void* src,
                 uint64_t n) {
  if (s != c.stream) return false;
  if (!is_host_block(*c.ds, src, n))
    refuse_capture(*c.dev, "a copy from pageable host memory",
                   "a graph copies from page-locked memory only (Device::host_alloc), whose "
                   "contents each replay reads again");
  capture_keep(c, dst);
  return capture_transfer(
      c, {.kind = RecordedOp::h2d, .dst = handle(dst), .host_src = src, .dst_off = off, .n = n});
}

bool capture_d2h(CaptureState& c, bp_stream* s, void* dst, const Buffer& src, uint64_t off,
                 uint64_t n) {
  if (s != c.stream) return false;
  if (!is_host_block(*c.ds, dst, n))
    refuse_capture(*c.dev, "a copy to pageable host memory",
                   "a graph copies to page-locked memory only (Device::host_alloc)");
  capture_keep(c, src);
  return capture_transfer(
      c, {.kind = RecordedOp::d2h, .src = handle(src), .host_dst = dst, .src_off = off, .n = n});
}

bool capture_d2d(CaptureState& c, bp_stream* s, Buffer& dst, uint64_t dst_off, const Buffer& src,
                 uint64_t src_off, uint64_t n) {
  if (s != c.stream) return false;
  capture_keep(c, dst);
  capture_keep(c, src);
  return capture_transfer(c, {.kind = RecordedOp::d2d,
                              .dst = handle(dst),
                              .src = handle(src),
                              .dst_off = dst_off,
                              .src_off = src_off,
                              .n = n});
}

bool capture_memset(CaptureState& c, bp_stream* s, Buffer& dst, uint64_t off, int value,
                    uint64_t n) {
  if (s != c.stream) return false;
  capture_keep(c, dst);
  return capture_transfer(
      c, {.kind = RecordedOp::memset, .dst = handle(dst), .dst_off = off, .n = n, .value = value});
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

std::shared_ptr<Buffer> capture_allocate(CaptureState& c, uint64_t bytes) {
  return lease(c, bytes, false);
}

std::shared_ptr<Buffer> capture_constant(CaptureState& c, const void* data, uint64_t n) {
  std::shared_ptr<Buffer> b = lease(c, n, true);
  if (n == 0) return b;
  const bp_plugin_api* api = c.ds->api;
  if (void* hp = b->host_pointer()) {
    std::memcpy(hp, data, n);
  } else {
    bp_stream* ps = c.pool->stream->s;
    check(api, api->copy_h2d(ps, handle(*b), 0, data, n), "upload a graph constant", c.dev);
    check(api, api->stream_synchronize(ps), "upload a graph constant", c.dev);
  }
  return b;
}

void capture_keep(CaptureState& c, const Buffer& b) {
  if (c.pool->owns(&b)) return;  // the pool keeps its own blocks
  std::shared_ptr<const Buffer> sp = b.weak_from_this().lock();
  if (!sp) return;  // not owned by a shared_ptr (cannot happen for libbackplane's buffers)
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.kept.insert(&b).second) c.keep.push_back(std::const_pointer_cast<Buffer>(sp));
}

bool capture_defer_free(CaptureState& c, bp_buffer* b, uint64_t size, const StreamState* stream,
                        bool counted) noexcept {
  if (!c.native || stream) return false;  // recorded: frees are eager; other streams: not captured
  std::lock_guard<std::mutex> lock(c.mu);
  try {
    c.deferred.push_back({b, size, counted});
    return true;
  } catch (...) {
    return false;
  }
}

void note_host_alloc(DeviceState& s, void* p, uint64_t n) {
  std::lock_guard<std::mutex> lock(s.host_mu);
  s.host_blocks[reinterpret_cast<uintptr_t>(p)] = n;
}

void note_host_free(DeviceState& s, void* p) noexcept {
  std::lock_guard<std::mutex> lock(s.host_mu);
  s.host_blocks.erase(reinterpret_cast<uintptr_t>(p));
}

// What a Graph holds (graph.hpp).
struct GraphState {
  Device* dev = nullptr;
  std::unique_ptr<CaptureState> capture;  // while capturing
  bool native = false;
  bp_graph* graph = nullptr;
  bp_stream* stream = nullptr;
  std::shared_ptr<GraphPool> pool;
  std::vector<std::shared_ptr<Buffer>> keep;
  Recording rec;
  uint64_t num_ops = 0;
  std::mutex replay_mu;

  ~GraphState() {
    if (!dev) return;
    DeviceState& s = state(*dev);
    if (graph || !rec.ops.empty()) {
      // Replays may still be queued: wait for them (not possible, and not needed for a graph
      // that never replayed, while the device is capturing; the pool then hands its blocks to
      // that capture).
      if (!s.capture.load(std::memory_order_acquire))
        drop_error(s.api, s.api->stream_synchronize(stream));
      if (graph) drop_error(s.api, s.plugin.graph.destroy(graph));
    }
  }
};

namespace {
// Runs the frees deferred during a native capture, now that the stream is eager again.
void run_deferred(CaptureState& c) noexcept {
  std::vector<CaptureState::Deferred> d;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    d.swap(c.deferred);
  }
  for (const auto& f : d) c.ds->release(f.b, f.size, nullptr, f.counted);
}

// Closes the device's capture: the device is eager again afterwards.
void close_capture(CaptureState& c) noexcept {
  c.ds->capture.store(nullptr, std::memory_order_release);
  g_open_captures.fetch_sub(1, std::memory_order_relaxed);
  c.pool->close();
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
  c->stream = ds.stream_handle();
  c->native = ds.plugin.graph.begin_capture != nullptr && mode == GraphMode::automatic &&
              !detail::force_recorded();
  {
    std::lock_guard<std::mutex> lock(ds.mu);
    if (!ds.pool_stream) {
      bp_stream* h = nullptr;
      detail::check(ds.api, ds.api->stream_create(ds.index, &h), "create the graph pool stream",
                    &device);
      ds.pool_stream = std::make_shared<detail::StreamState>(device, h);
    }
    c->pool = std::make_shared<detail::GraphPool>(device, ds.pool_stream);
  }
  CaptureState* expected = nullptr;
  if (!ds.capture.compare_exchange_strong(expected, c.get(), std::memory_order_acq_rel))
    throw Error(device.str() +
                ": Graph::begin_capture while another capture is open on this device (one "
                "capture at a time per device; end or abort the other first)");
  detail::g_open_captures.fetch_add(1, std::memory_order_relaxed);
  if (c->native) {
    if (bp_error* e = ds.plugin.graph.begin_capture(c->stream)) {
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
  std::unique_ptr<CaptureState> c = std::move(g.capture);
  detail::DeviceState& ds = *c->ds;
  bp_error* err = nullptr;
  bp_graph* graph = nullptr;
  if (c->native) err = ds.plugin.graph.end_capture(c->stream, &graph);
  detail::close_capture(*c);
  detail::run_deferred(*c);
  std::shared_ptr<detail::GraphPool> pool = c->pool;
  g.keep = std::move(c->keep);
  g.rec = std::move(c->rec);
  g.num_ops = c->count.load(std::memory_order_relaxed);
  c.reset();
  auto fail = [&](bp_error* e, const char* what) {
    if (graph) detail::drop_error(ds.api, ds.plugin.graph.destroy(graph));
    g.keep.clear();
    g.rec = {};
    g.num_ops = 0;
    Device& dev = *g.dev;
    s_.reset();
    pool.reset();
    detail::throw_plugin_error(ds.api, e, dev.str() + ": " + what);
  };
  if (err) fail(err, "end graph capture");
  // The pool's blocks were allocated on the pool stream: they must exist before a replay.
  detail::check(ds.api, ds.api->stream_synchronize(pool->stream->s), "graph pool", g.dev);
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
  bp_graph* graph = nullptr;
  if (c->native) {
    if (bp_error* e = ds.plugin.graph.end_capture(c->stream, &graph)) ds.api->error_free(e);
  }
  detail::close_capture(*c);
  detail::run_deferred(*c);
  if (graph) detail::drop_error(ds.api, ds.plugin.graph.destroy(graph));
  c.reset();
  s_.reset();
}

void Graph::replay() {
  if (!s_) throw Error("Graph::replay on an empty graph (nothing was captured)");
  GraphState& g = *s_;
  if (g.capture)
    throw Error(g.dev->str() + ": Graph::replay while its capture is open (end_capture first)");
  detail::DeviceState& ds = detail::state(*g.dev);
  if (ds.capture.load(std::memory_order_acquire))
    detail::refuse_capture(*g.dev, "replaying another graph",
                           "graphs are not nested; replay before begin_capture or after "
                           "end_capture");
  profiler::Range range(g.native ? "graph replay (native)" : "graph replay (recorded)");
  if (g.graph) {
    detail::check(ds.api, ds.plugin.graph.launch(g.graph, g.stream), "graph replay", g.dev);
    return;
  }
  std::lock_guard<std::mutex> lock(g.replay_mu);
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
  return detail::capture_of(device) != nullptr;
}

}  // namespace bp
