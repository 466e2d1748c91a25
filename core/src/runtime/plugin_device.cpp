// Device, Allocator, Buffer, Stream, Event and Kernel over a plugin's C table (device.hpp),
// with their state in DeviceState (device_state.hpp).
#include "runtime/async_errors.hpp"
#include "runtime/fallback.hpp"
#include "runtime/interceptor.hpp"
#include "runtime/observer.hpp"
#include "runtime/registry.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace bp {

using detail::Access;
using detail::check;
using detail::DeviceState;
using detail::FoundBy;
using detail::StreamState;

namespace {

std::string format_bytes(uint64_t n) {
  char buf[64];
  if (n >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(n) / double(1ull << 30));
  else if (n >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(n) / double(1ull << 20));
  else
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(n));
  return buf;
}

DeviceKind kind_of(const bp_device_properties& p) {
  switch (p.kind) {
    case BP_DEVICE_KIND_CPU:
      return DeviceKind::cpu;
    case BP_DEVICE_KIND_GPU:
      return DeviceKind::gpu;
    case BP_DEVICE_KIND_ACCELERATOR:
      return DeviceKind::accelerator;
    default:  // not said (a plugin built before 1.2), or a value of a newer ABI
      return p.unified_memory ? DeviceKind::cpu : DeviceKind::accelerator;
  }
}

}  // namespace

namespace detail {

void throw_domain_error(Op op, DType dtype) {
  const int32_t o = static_cast<int32_t>(op);
  throw DTypeError(std::string(op_name(op)) + ": dtype " + std::string(dtype_name(dtype)) +
                   " is outside the op's dtype domain; " + std::string(op_name(op)) +
                   " is defined for " + bp_op_domain_text(o) + " only (cast first)");
}

[[noreturn]] void throw_plugin_error(const bp_plugin_api* api, bp_error* err,
                                     const std::string& context, bool invalid_is_device_error) {
  int32_t code = err->code;
  std::string msg = context + ": " + (err->message ? err->message : "(no message)");
  std::string native = err->native_name ? err->native_name : "";
  std::string plugin = err->plugin ? err->plugin : (api && api->name ? api->name : "?");
  if (!native.empty()) msg += " [" + native + "]";
  msg += " (plugin " + plugin + ")";
  if (api && api->error_free) api->error_free(err);
  switch (code) {
    case BP_ERROR_OUT_OF_MEMORY:
      throw OutOfMemory(msg);
    case BP_ERROR_UNSUPPORTED:
      throw UnsupportedError(msg);
    case BP_ERROR_INVALID_ARGUMENT:
      if (invalid_is_device_error) throw DeviceError(msg);
      throw PluginError(msg, native);
    default:
      throw PluginError(msg, native);
  }
}

std::atomic<int> g_interceptors{0};

bool install_interceptor(DeviceState& ds, Interceptor* i) noexcept {
  g_interceptors.fetch_add(1, std::memory_order_seq_cst);  // before the pointer: desc() sees both
  Interceptor* expected = nullptr;
  if (ds.interceptor.compare_exchange_strong(expected, i, std::memory_order_seq_cst)) return true;
  g_interceptors.fetch_sub(1, std::memory_order_relaxed);
  return false;
}

void uninstall_interceptor(DeviceState& ds) noexcept {
  ds.interceptor.store(nullptr, std::memory_order_seq_cst);
  // A call that raised the count before this store may still hold the old pointer; one that
  // raises it later reads null (both sides use sequentially consistent operations).
  while (ds.interceptor_pins.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  g_interceptors.fetch_sub(1, std::memory_order_relaxed);
}

namespace {
std::mutex g_live_mu;  // guards the list of live streams (StreamState::live_prev/live_next)
StreamState* g_live_head = nullptr;
}  // namespace

StreamState::StreamState(Device& d, bp_stream* h, bool imported) noexcept
    : dev(d), s(h), imported(imported) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  live_next = g_live_head;
  if (g_live_head) g_live_head->live_prev = this;
  g_live_head = this;
}

void finish_queued_work() noexcept {
  std::lock_guard<std::mutex> lock(g_live_mu);
  for (StreamState* st = g_live_head; st; st = st->live_next) {
    if (st->imported) continue;  // the work of a foreign queue belongs to its owner
    const bp_plugin_api* api = state(st->dev).api;
    if (bp_error* e = api->stream_synchronize(st->s)) api->error_free(e);
  }
}

namespace {
// Tells the observer once that the process exits, after the queued work (Note [Observers]).
void notify_exit() noexcept {
  static std::atomic<bool> done{false};
  if (observing() && !done.exchange(true)) observer_hooks().process_exit();
}
struct ExitGuard {
  ~ExitGuard() {
    finish_queued_work();
    notify_exit();
  }
};
}  // namespace

void finish_queued_work_at_exit() {
  finish_queued_work();
  notify_exit();
}

void arm_exit_guard() noexcept {
  static const pid_t main_tid = ::getpid();
  thread_local bool armed = false;
  if (armed || static_cast<pid_t>(::syscall(SYS_gettid)) != main_tid) return;
  thread_local ExitGuard guard;  // Note [Exit]: destroyed only when the process exits
  (void)&guard;
  armed = true;
}

// The ABI destroys a stream only after its work is finished: synchronise first. Errors have
// nobody to go to from a destructor and are dropped.
StreamState::~StreamState() {
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    (live_prev ? live_prev->live_next : g_live_head) = live_next;
    if (live_next) live_next->live_prev = live_prev;
  }
  const bp_plugin_api* api = state(dev).api;
  if (!imported)
    if (bp_error* e = api->stream_synchronize(s)) api->error_free(e);
  if (bp_error* e = api->stream_destroy(s)) api->error_free(e);
}

bp_stream* DeviceState::create_default_stream() {
  arm_exit_guard();
  std::lock_guard<std::mutex> lock(mu);
  if (bp_stream* h = default_handle.load(std::memory_order_relaxed)) return h;
  bp_stream* h = nullptr;
  check(api, api->stream_create(index, &h), "create default stream", self);
  streams.push_back(Access::make_stream(*self, h));
  default_stream.store(streams.back().get(), std::memory_order_release);
  default_handle.store(h, std::memory_order_release);
  return h;
}

Kernel* DeviceState::try_resolve(Op op, DType dtype) {
  if (unsupported[slot(op, dtype)].load(std::memory_order_acquire)) return nullptr;
  arm_exit_guard();
  std::lock_guard<std::mutex> lock(mu);
  if (Kernel* k = kernels[slot(op, dtype)].load(std::memory_order_relaxed)) return k;
  bp_kernel* handle = nullptr;
  // The registry sets has_minor2 only when the table is new enough to hold find_kernel_id.
  bp_error* err =
      plugin.has_minor2 && api->find_kernel_id
          ? api->find_kernel_id(index, static_cast<int32_t>(op), static_cast<int32_t>(dtype),
                                &handle)
          : api->find_kernel(index, op_name(op).data(), static_cast<int32_t>(dtype), &handle);
  if (err) {
    if (err->code != BP_ERROR_UNSUPPORTED)
      throw_plugin_error(api, err, self->str() + ": find kernel");
    api->error_free(err);
    unsupported[slot(op, dtype)].store(true, std::memory_order_release);
    return nullptr;
  }
  kernel_store.push_back(Access::make_kernel(*self, op, dtype, handle));
  Kernel* k = kernel_store.back().get();
  kernels[slot(op, dtype)].store(k, std::memory_order_release);
  // Note [Exit]: after what the lookup loaded or constructed (a kernel compiler's statics).
  std::atexit(finish_queued_work_at_exit);
  return k;
}

// Note [Unsupported ops]: the message lists the devices of other backends (of the same
// registry) that have the op; no lock is held while asking them, so two backends lacking the
// same op cannot deadlock.
Kernel& DeviceState::resolve_kernel(Op op, DType dtype) {
  check_domain(op, dtype);  // Note [Dtype domains]: a pair outside it is never asked for
  if (Kernel* k = try_resolve(op, dtype)) return *k;
  std::string others;
  plugin.registry->load_all();
  for (Device* d : plugin.registry->devices()) {
    if (&state(*d).plugin == &plugin) continue;  // same backend
    if (d->supports(op, dtype)) others += (others.empty() ? "" : ", ") + d->str();
  }
  throw UnsupportedError("op '" + std::string(op_name(op)) + "' with dtype " +
                         std::string(dtype_name(dtype)) + " is not implemented on " + self->str() +
                         " (backend " + self->backend_name() +
                         "); devices that have it: " + (others.empty() ? "none" : others));
}

std::shared_ptr<Buffer> DeviceState::allocate(uint64_t bytes, std::shared_ptr<StreamState> stream) {
  check_alive();
  bp_buffer* b = nullptr;
  bp_error* err = api->mem_alloc(index, stream ? stream->s : stream_handle(), bytes, &b);
  if (err) [[unlikely]] {
    std::string what = "allocating " + format_bytes(bytes) + " (free " +
                       format_bytes(self->free_memory()) + " of " +
                       format_bytes(self->properties().total_memory) + ")";
    if (err->code == BP_ERROR_OUT_OF_MEMORY) {  // Note [Out-of-memory summary]
      std::string msg =
          self->str() + ": " + what + ": " + (err->message ? err->message : "(no message)");
      if (err->native_name && *err->native_name) msg += std::string(" [") + err->native_name + "]";
      msg += " (plugin " + std::string(err->plugin ? err->plugin : api->name) + ")";
      api->error_free(err);
      throw OutOfMemory(msg + "\n" + oom_summary(*self));
    }
    throw_plugin_error(api, err, self->str() + ": " + what);
  }
  if (!b && bytes > 0) [[unlikely]]  // a buffer the kernels would be handed as NULL
    throw PluginError(self->str() + ": mem_alloc returned no buffer for " + std::to_string(bytes) +
                      " bytes and no error (plugin " + api->name + ")");
  memory.on_alloc(bytes);
  try {
    const StreamState* on = stream.get();
    auto buf = Access::make_buffer(*self, b, bytes, std::move(stream), false);
    if (observing()) [[unlikely]]
      observer_hooks().alloc(*self, b, bytes, on);
    return buf;
  } catch (...) {
    release(b, bytes, nullptr, true);
    throw;
  }
}

void DeviceState::release(bp_buffer* b, uint64_t size, const StreamState* stream,
                          bool counted) noexcept {
  if (interceptor.load(std::memory_order_acquire)) [[unlikely]] {
    InterceptorPin p(*this);
    if (p && p->release(b, size, stream, counted)) return;
  }
  if (counted) memory.on_free(size);
  bp_stream* s = stream ? stream->s : default_handle.load(std::memory_order_acquire);
  if (bp_error* e = api->mem_free(index, s, b, size)) {
    if (lost.load(std::memory_order_relaxed)) {  // Note [Device lost]: already reported
      api->error_free(e);
      return;
    }
    // A free that fails has nothing to hand the error to: report it once on stderr.
    std::fprintf(stderr, "backplane: %s: freeing %llu bytes failed: %s\n", self->str().c_str(),
                 static_cast<unsigned long long>(size), e->message ? e->message : "");
    api->error_free(e);
  }
}

void DeviceState::free_buffer(bp_buffer* b, uint64_t size, const StreamState* stream,
                              bool imported) noexcept {
  if (observing() && !imported) [[unlikely]] {
    try {
      observer_hooks().free(*self, b, size);
    } catch (...) {  // a free records what it can; it never fails for the profiler
    }
  }
  release(b, size, stream, !imported);
}

void DeviceState::hold_buffer(bp_buffer* b) {
  std::lock_guard<std::mutex> lock(held_mu);
  auto [it, added] = held.try_emplace(b);
  ++it->second.holders;
  if (added) held_count.fetch_add(1, std::memory_order_release);
}

bool DeviceState::defer_free(bp_buffer* b, uint64_t size, std::shared_ptr<StreamState>& stream,
                             bool imported) noexcept {
  std::lock_guard<std::mutex> lock(held_mu);
  auto it = held.find(b);
  if (it == held.end()) return false;
  HeldBuffer& h = it->second;
  h.freed = true;
  h.imported = imported;
  h.size = size;
  h.stream = std::move(stream);
  return true;
}

void DeviceState::unhold_buffer(bp_buffer* b) noexcept {
  decltype(held)::node_type due;  // freed after the lock: a release may run its owner's code
  {
    std::lock_guard<std::mutex> lock(held_mu);
    auto it = held.find(b);
    if (it == held.end() || --it->second.holders != 0) return;
    if (it->second.freed)
      due = held.extract(it);
    else
      held.erase(it);
    held_count.fetch_sub(1, std::memory_order_release);
  }
  if (due) free_buffer(b, due.mapped().size, due.mapped().stream.get(), due.mapped().imported);
}

// Note [Memory accounting] in memory_counters.hpp: the plugin's allocated, peak_allocated and
// num_allocs are not read.
MemoryStats DeviceState::memory_stats() {
  bp_memory_stats m{};
  m.struct_size = sizeof m;
  check(api, api->memory_stats(index, &m), "memory stats", self);
  MemoryStats out;
  out.allocated = memory.allocated();
  out.reserved = m.reserved;
  out.peak_allocated = memory.peak();
  out.num_allocs = memory.live();
  out.total_allocs = memory.total();
  return out;
}

namespace {
// The launch itself, inlined into both entry points (the per-op path pays no extra call).
// The op id of this thread's last launch, for BACKPLANE_LAUNCH_BLOCKING (the profiler's launch
// path calls launch_body too).
thread_local uint64_t t_last_launch = 0;

// Returns the launch's op id (Note [Op ring]).
[[gnu::always_inline]] inline uint64_t launch_body(const Kernel& k, bp_stream* stream,
                                                   std::span<const bp_tensor_desc> in,
                                                   std::span<const bp_tensor_desc> out,
                                                   std::span<const bp_attr> attrs) {
  DeviceState& s = state(k.device());
  s.check_alive();
  s.mark_queued();
  const uint64_t id = s.ring.next_id();
  s.ring.put_launch(id, stream, k.op(), k.dtype(), in, out);
  t_last_launch = id;
  if (s.op_begin) s.op_begin(id);
  const bp_attr* pass = attrs.data();
  // Note [Attribute ids]: a plugin of minor 0 or 1 reads attribute arrays of the old layout.
  constexpr size_t kMaxAttrs = 8;
  bp_attr_minor1 legacy[kMaxAttrs];
  if (!s.plugin.has_minor2 && !attrs.empty()) [[unlikely]] {
    if (attrs.size() > kMaxAttrs)
      throw Error(k.device().str() + ": launch " + std::string(op_name(k.op())) + " with " +
                  std::to_string(attrs.size()) + " attributes (at most 8)");
    for (size_t i = 0; i < attrs.size(); ++i)
      legacy[i] = {sizeof(bp_attr_minor1), attrs[i].name, attrs[i].kind, attrs[i].i, attrs[i].f};
    pass = reinterpret_cast<const bp_attr*>(legacy);
  }
  bp_error* err = s.api->launch(
      Access::handle(k), stream, in.data(), static_cast<int32_t>(in.size()), out.data(),
      static_cast<int32_t>(out.size()), pass, static_cast<int32_t>(attrs.size()));
  if (err) [[unlikely]] {
    std::string what =
        "launch " + std::string(op_name(k.op())) + " (" + std::string(dtype_name(k.dtype())) + ")";
    detail::throw_queue_error(s, stream, err, k.device().str() + ": " + what);
  }
  return id;
}
}  // namespace

void launch_unobserved(const Kernel& k, bp_stream* stream, std::span<const bp_tensor_desc> in,
                       std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs) {
  (void)launch_body(k, stream, in, out, attrs);
}

// Note [Launch blocking]
//   BACKPLANE_LAUNCH_BLOCKING=1 (read once) makes every eager launch wait for its own stream, so
//   that an error the device reports while running the op (an asynchronous fault, an illegal
//   address) surfaces as an exception from the op that caused it, naming the op, its dtype, its
//   device and its operands' shapes, rather than at a later synchronisation. Launches taken by a
//   graph capture (an interceptor) are not waited for: they have not run. For debugging: each
//   op then costs a round trip to the device.
namespace {
[[gnu::noinline]] void wait_for_launch(const Kernel& k, bp_stream* stream, uint64_t id) {
  DeviceState& s = state(k.device());
  if (bp_error* err = s.api->stream_synchronize(stream))
    detail::throw_stream_error(s, nullptr, stream, err, {"stream synchronize", id}, id);
}
}  // namespace

void launch(const Kernel& k, bp_stream* stream, std::span<const bp_tensor_desc> in,
            std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs) {
  if (intercepted_launch(state(k.device()), k, stream, in, out, attrs)) [[unlikely]]
    return;
  if (observing()) [[unlikely]] {  // Note [Profiler cost when off] in profiler.hpp
    observer_hooks().launch(k, stream, in, out, attrs);
  } else {
    (void)launch_body(k, stream, in, out, attrs);
  }
  if (launch_blocking()) [[unlikely]]
    wait_for_launch(k, stream, t_last_launch);
}

}  // namespace detail

// ---- Buffer ----------------------------------------------------------------------------------

Buffer::~Buffer() {
  if (!device_) [[unlikely]]  // Access::unarmed_import: the plugin never took the memory
    return;
  detail::DeviceState& st = detail::state(*device_);
  auto* h = static_cast<bp_buffer*>(handle_);
  if (st.held_count.load(std::memory_order_acquire) != 0) [[unlikely]]
    if (st.defer_free(h, size_, stream_, imported_)) return;  // a graph frees it
  st.free_buffer(h, size_, stream_.get(), imported_);
}

void* Buffer::host_pointer() const noexcept {
  const bp_plugin_api* api = detail::state(*device_).api;
  return api->mem_host_pointer ? api->mem_host_pointer(static_cast<bp_buffer*>(handle_)) : nullptr;
}

// ---- Stream / Event --------------------------------------------------------------------------

Stream::Stream(Device& device, std::shared_ptr<StreamState> state) noexcept
    : device_(&device), state_(std::move(state)) {}
Stream::~Stream() = default;

namespace {
// Lets the device's interceptor refuse `what` on stream `s`.
void refuse_on_captured(const Device& dev, bp_stream* s, const char* what, const char* why) {
  detail::intercepted_host_op(detail::state(dev), s, what, why);
}
}  // namespace

void Stream::synchronize() {
  refuse_on_captured(*device_, state_->s, "synchronize",
                     "the work queued during a capture runs only when the graph is replayed");
  detail::DeviceState& ds = detail::state(*device_);
  ds.check_alive();
  const bp_plugin_api* api = ds.api;
  // Note [Sync-debug]: cleared before the wait, so work queued meanwhile marks it again.
  if (state_->s == ds.default_handle.load(std::memory_order_relaxed))
    ds.queued.store(false, std::memory_order_relaxed);
  const uint64_t mark = ds.ring.last_id();  // Note [Op ring]: the work this wait covers
  const int64_t t0 = detail::observing() ? detail::clock_ns() : 0;
  if (bp_error* err = api->stream_synchronize(state_->s)) [[unlikely]]
    detail::throw_stream_error(ds, state_.get(), state_->s, err, {"stream synchronize"}, mark);
  detail::note_synced(*state_, mark);
  if (detail::observing()) [[unlikely]]
    detail::observer_hooks().sync(*device_, state_->s, t0);
}

// Note [Events without plugin support]: when a plugin leaves the event slots NULL, record
// synchronises the stream and stamps a host clock, so wait() has nothing left to wait for.
void Stream::wait(Event& event) {
  refuse_on_captured(*device_, state_->s, "Stream::wait on an event",
                     "a graph captures one stream and no events");
  bp_event* e = Access::handle(event);
  detail::state(*device_).check_alive();
  if (!e) return;
  const bp_plugin_api* api = detail::state(*device_).api;
  check(api, api->stream_wait_event(state_->s, e), "stream wait", device_);
}

Event::~Event() {
  if (!handle_) return;
  const bp_plugin_api* api = detail::state(*device_).api;
  if (bp_error* err = api->event_destroy(static_cast<bp_event*>(handle_))) api->error_free(err);
}

void Event::record(Stream& s) {
  refuse_on_captured(*device_, detail::handle(s), "Event::record",
                     "a graph captures one stream and no events");
  if (handle_) {
    detail::state(*device_).check_alive();
    const bp_plugin_api* api = detail::state(*device_).api;
    check(api, api->event_record(static_cast<bp_event*>(handle_), detail::handle(s)),
          "event record", device_);
    recorded_on_ = Access::shared_state(s);
  } else {
    s.synchronize();
    host_time_ = std::chrono::steady_clock::now();
  }
}

// Note [Asynchronous errors] in plugin_abi.h: an event recorded after a failure is poisoned;
// with the plugin's record of the stream it was recorded on, the error names the failed op.
void Event::synchronize() {
  if (!handle_) return;
  detail::DeviceState& ds = detail::state(*device_);
  ds.check_alive();
  bp_error* err = ds.api->event_synchronize(static_cast<bp_event*>(handle_));
  if (!err) [[likely]]
    return;
  std::shared_ptr<detail::StreamState> st = recorded_on_.lock();
  if (!ds.stream_fault || !st)
    detail::throw_plugin_error(ds.api, err, device_->str() + ": event synchronize");
  detail::throw_stream_error(ds, nullptr, st->s, err, {"event synchronize"}, ds.ring.last_id());
}

double Event::elapsed_ms(Event& end) {
  const bp_plugin_api* api = detail::state(*device_).api;
  if (handle_ && api->event_elapsed_ms) {
    double ms = 0;
    check(api,
          api->event_elapsed_ms(static_cast<bp_event*>(handle_),
                                static_cast<bp_event*>(end.handle_), &ms),
          "event elapsed", device_);
    return ms;
  }
  if (handle_) end.synchronize();  // events without timing: host clocks from here on
  return std::chrono::duration<double, std::milli>(end.host_time_ - host_time_).count();
}

// ---- Allocator -------------------------------------------------------------------------------

namespace {
constexpr const char* kOutsidePool =
    "an allocation outside the graph's pool; tensors created during the capture come from the "
    "pool, buffers for the graph's inputs are allocated before begin_capture()";
}

// The default stream lives as long as the device; any other stream is kept alive by the
// buffers allocated on it, which are freed there (DeviceState::release).

std::shared_ptr<Buffer> Allocator::allocate(uint64_t bytes, Stream& stream) {
  detail::intercepted_host_op(detail::state(*device_), nullptr, "Allocator::allocate",
                              kOutsidePool);
  if (&stream.device() != device_) [[unlikely]]
    throw DeviceMismatch("allocate: the stream belongs to " + stream.device().str() +
                         ", the allocation to " + device_->str());
  DeviceState& s = detail::state(*device_);
  if (&stream == s.default_stream.load(std::memory_order_acquire)) return s.allocate(bytes, {});
  return s.allocate(bytes, Access::shared_state(stream));
}

std::shared_ptr<Buffer> Allocator::allocate(uint64_t bytes) {
  detail::intercepted_host_op(detail::state(*device_), nullptr, "Allocator::allocate",
                              kOutsidePool);
  return detail::state(*device_).allocate(bytes, {});
}

MemoryStats Allocator::stats() {
  return detail::state(*device_).memory_stats();
}
void Allocator::reset_peak() {
  detail::state(*device_).memory.reset_peak();
}
void Allocator::empty_cache() {
  detail::intercepted_host_op(detail::state(*device_), nullptr, "Allocator::empty_cache",
                              "it waits for the device");
  DeviceState& s = detail::state(*device_);
  if (s.api->memory_empty_cache)
    check(s.api, s.api->memory_empty_cache(s.index), "empty cache", device_);
}

// ---- Device ----------------------------------------------------------------------------------

Device::Device(std::unique_ptr<DeviceState> state)
    : str_(std::string(state->api->device_type) + ":" + std::to_string(state->index)),
      type_(state->api->device_type),
      backend_(state->api->name),
      index_(state->index),
      allocator_(*this),
      state_(std::move(state)) {
  state_->self = this;
  const bp_plugin_api* api = state_->api;
  bp_device_properties p{};
  p.struct_size = sizeof p;
  p.supports_f64 = 1;
  check(api, api->device_properties(index_, &p), "device properties", this);
  props_.name = p.name;
  props_.vendor = p.vendor;
  props_.uuid = p.uuid;
  props_.pci_bus_id = p.pci_bus_id;
  props_.total_memory = p.total_memory;
  props_.free_memory = p.free_memory;
  props_.compute_major = p.compute_major;
  props_.compute_minor = p.compute_minor;
  props_.cores = p.cores;
  props_.supports_f64 = p.supports_f64 != 0;
  props_.unified_memory = p.unified_memory != 0;
  props_.kind = kind_of(p);
}

// Streams are synchronised and destroyed with their owners (Note [Plugin lifetime] in
// registry.cpp: only devices of registries other than the process default are ever
// destroyed).
Device::~Device() = default;

uint64_t Device::free_memory() const {
  const bp_plugin_api* api = state_->api;
  bp_device_properties p{};
  p.struct_size = sizeof p;
  if (bp_error* e = api->device_properties(index_, &p)) {
    api->error_free(e);
    return props_.free_memory;
  }
  return p.free_memory;
}

Stream& Device::default_stream() {
  return state_->stream();
}

std::unique_ptr<Stream> Device::create_stream() {
  state_->check_alive();
  const bp_plugin_api* api = state_->api;
  bp_stream* h = nullptr;
  check(api, api->stream_create(index_, &h), "create stream", this);
  try {
    return Access::make_stream(*this, h);
  } catch (...) {
    if (bp_error* e = api->stream_destroy(h)) api->error_free(e);
    throw;
  }
}

std::unique_ptr<Event> Device::create_event() {
  state_->check_alive();
  const bp_plugin_api* api = state_->api;
  bp_event* e = nullptr;
  if (state_->has_events()) check(api, api->event_create(index_, &e), "create event", this);
  return Access::make_event(*this, e);
}

void Device::synchronize() {
  if (state_->default_handle.load(std::memory_order_acquire)) default_stream().synchronize();
}

Kernel& Device::kernel(Op op, DType dtype) {
  return state_->kernel(op, dtype);
}

bool Device::supports(Op op, DType dtype) {
  if (state_->kernels[DeviceState::slot(op, dtype)].load(std::memory_order_acquire)) return true;
  if (!bp_op_in_domain(static_cast<int32_t>(op), static_cast<int32_t>(dtype))) return false;
  try {
    return state_->try_resolve(op, dtype) != nullptr;
  } catch (const Error&) {
    return false;
  }
}

void Device::copy_from_host(Stream& s, Buffer& dst, uint64_t dst_off, const void* src, uint64_t n) {
  if (n == 0) return;
  if (detail::intercepted_transfer(*state_, {.kind = detail::Transfer::h2d,
                                             .stream = detail::handle(s),
                                             .dst = &dst,
                                             .host_src = src,
                                             .dst_off = dst_off,
                                             .n = n})) [[unlikely]]
    return;
  const bp_plugin_api* api = state_->api;
  state_->check_alive();
  state_->mark_queued();
  state_->begin_transfer(detail::handle(s), detail::OpKind::h2d, n);
  detail::ObservedCopy rec(detail::CopyKind::h2d, *this, detail::handle(s), n, detail::handle(dst));
  check(api, api->copy_h2d(detail::handle(s), detail::handle(dst), dst_off, src, n),
        "copy host->device", this);
  rec.done();
}
void Device::copy_to_host(Stream& s, void* dst, const Buffer& src, uint64_t src_off, uint64_t n) {
  if (n == 0) return;
  if (detail::intercepted_transfer(*state_, {.kind = detail::Transfer::d2h,
                                             .stream = detail::handle(s),
                                             .src = &src,
                                             .host_dst = dst,
                                             .src_off = src_off,
                                             .n = n})) [[unlikely]]
    return;
  const bp_plugin_api* api = state_->api;
  state_->check_alive();
  state_->mark_queued();
  const uint64_t id = state_->begin_transfer(detail::handle(s), detail::OpKind::d2h, n);
  detail::ObservedCopy rec(detail::CopyKind::d2h, *this, detail::handle(s), n, nullptr);
  if (bp_error* err = api->copy_d2h(detail::handle(s), dst, detail::handle(src), src_off, n)) {
    // A plugin with a record reports a failure of earlier work here (Note [Asynchronous
    // errors]); an error of the copy itself, or of a plugin without one, is the copy's.
    if (!state_->stream_fault) detail::throw_plugin_error(api, err, str() + ": copy device->host");
    detail::throw_stream_error(*state_, Access::shared_state(s).get(), detail::handle(s), err,
                               {"copy device->host"}, id - 1);
  }
  rec.done();
}
void Device::copy_within(Stream& s, Buffer& dst, uint64_t dst_off, const Buffer& src,
                         uint64_t src_off, uint64_t n) {
  if (n == 0) return;
  if (detail::intercepted_transfer(*state_, {.kind = detail::Transfer::d2d,
                                             .stream = detail::handle(s),
                                             .dst = &dst,
                                             .src = &src,
                                             .dst_off = dst_off,
                                             .src_off = src_off,
                                             .n = n})) [[unlikely]]
    return;
  const bp_plugin_api* api = state_->api;
  state_->check_alive();
  state_->mark_queued();
  state_->begin_transfer(detail::handle(s), detail::OpKind::d2d, n);
  detail::ObservedCopy rec(detail::CopyKind::d2d, *this, detail::handle(s), n, detail::handle(dst));
  check(api,
        api->copy_d2d(detail::handle(s), detail::handle(dst), dst_off, detail::handle(src), src_off,
                      n),
        "copy device->device", this);
  rec.done();
}
void Device::memset(Stream& s, Buffer& dst, uint64_t off, int value, uint64_t n) {
  if (n == 0) return;
  if (detail::intercepted_transfer(*state_, {.kind = detail::Transfer::memset,
                                             .stream = detail::handle(s),
                                             .dst = &dst,
                                             .dst_off = off,
                                             .n = n,
                                             .value = value})) [[unlikely]]
    return;
  const bp_plugin_api* api = state_->api;
  state_->check_alive();
  state_->mark_queued();
  state_->begin_transfer(detail::handle(s), detail::OpKind::memset, n);
  detail::ObservedCopy rec(detail::CopyKind::memset, *this, detail::handle(s), n,
                           detail::handle(dst));
  check(api, api->memset(detail::handle(s), detail::handle(dst), off, value, n), "memset", this);
  rec.done();
}

void* Device::host_alloc(uint64_t n) {
  const bp_plugin_api* api = state_->api;
  void* p = nullptr;
  if (api->host_alloc) {
    check(api, api->host_alloc(index_, n, &p), "pinned host alloc", this);
  } else {
    p = std::aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    if (!p) throw OutOfMemory(str() + ": out of host memory staging " + format_bytes(n));
  }
  try {
    std::lock_guard<std::mutex> lock(state_->host_mu);
    state_->host_blocks[reinterpret_cast<uintptr_t>(p)] = {.bytes = n};
  } catch (...) {
    host_free(p);
    throw;
  }
  return p;
}
void Device::host_free(void* p) noexcept {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(state_->host_mu);
    auto it = state_->host_blocks.find(reinterpret_cast<uintptr_t>(p));
    if (it != state_->host_blocks.end()) {
      if (it->second.refs > 0) {  // a graph copies from or to it: its last graph frees it
        it->second.freed = true;
        return;
      }
      state_->host_blocks.erase(it);
    }
  }
  state_->free_host(p);
}

void DeviceState::free_host(void* p) noexcept {
  if (api->host_alloc) {
    if (bp_error* e = api->host_free(index, p)) api->error_free(e);
  } else {
    std::free(p);
  }
}

bool DeviceState::is_host_block(const void* p, uint64_t n, bool ref) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(host_mu);
  auto it = host_blocks.upper_bound(a);
  if (it == host_blocks.begin()) return false;
  --it;
  if (it->second.freed || a < it->first || a + n > it->first + it->second.bytes) return false;
  if (ref) ++it->second.refs;
  return true;
}

void DeviceState::unref_host_block(const void* p) noexcept {
  const auto a = reinterpret_cast<uintptr_t>(p);
  void* start = nullptr;
  {
    std::lock_guard<std::mutex> lock(host_mu);
    auto it = host_blocks.upper_bound(a);
    if (it == host_blocks.begin()) return;
    --it;
    if (--it->second.refs > 0 || !it->second.freed) return;
    start = reinterpret_cast<void*>(it->first);
    host_blocks.erase(it);
  }
  free_host(start);
}

// Note [Cross-device copies]
//   Same plugin with copy_peer: the copy runs on dst's default stream after an event from
//   src's stream, and src's stream then waits for the copy so that a later free of src stays
//   ordered after it. Otherwise the data goes through host memory: straight from or into a
//   unified-memory device's buffer, else through a pinned staging buffer, synchronously.
void Device::copy_from_device(Buffer& dst, uint64_t dst_off, const Buffer& src, uint64_t src_off,
                              uint64_t n) {
  if (n == 0) return;
  Device& sdev = src.device();
  if (&sdev != this) {
    constexpr const char* why = "a graph captures the work of one device";
    detail::intercepted_host_op(*state_, nullptr, "a copy between devices", why);
    detail::intercepted_host_op(*sdev.state_, nullptr, "a copy between devices", why);
  }
  Stream& ds = default_stream();
  Stream& ss = sdev.default_stream();
  if (&sdev == this) {
    copy_within(ds, dst, dst_off, src, src_off, n);
    return;
  }
  const bp_plugin_api* api = state_->api;
  if (&sdev.state_->plugin == &state_->plugin && api->copy_peer) {
    if (state_->has_events()) {
      auto before = sdev.create_event();
      before->record(ss);
      ds.wait(*before);
    } else {
      ss.synchronize();
    }
    state_->check_alive();
    state_->begin_transfer(detail::handle(ds), detail::OpKind::peer, n);
    detail::ObservedCopy rec(detail::CopyKind::peer, *this, detail::handle(ds), n,
                             detail::handle(dst));
    check(api,
          api->copy_peer(detail::handle(ds), index_, detail::handle(dst), dst_off, sdev.index(),
                         detail::handle(src), src_off, n),
          "peer copy", this);
    rec.done();
    if (state_->has_events()) {
      auto after = create_event();
      after->record(ds);
      ss.wait(*after);
    } else {
      ds.synchronize();
    }
    return;
  }
  ss.synchronize();
  if (const void* sp = src.host_pointer()) {
    copy_from_host(ds, dst, dst_off, static_cast<const char*>(sp) + src_off, n);
    ds.synchronize();
    return;
  }
  if (void* dp = dst.host_pointer()) {
    ds.synchronize();
    sdev.copy_to_host(ss, static_cast<char*>(dp) + dst_off, src, src_off, n);
    ss.synchronize();
    return;
  }
  void* staging = sdev.host_alloc(n);
  try {
    sdev.copy_to_host(ss, staging, src, src_off, n);
    ss.synchronize();
    copy_from_host(ds, dst, dst_off, staging, n);
    ds.synchronize();
  } catch (...) {
    sdev.host_free(staging);
    throw;
  }
  sdev.host_free(staging);
}

}  // namespace bp
