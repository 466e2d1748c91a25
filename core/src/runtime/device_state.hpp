// Internal: what libbackplane keeps behind the public Device, Stream, Buffer, Event and Kernel
// classes (device.hpp) over a plugin's C table, and the one way into their private parts
// (Access). Nothing here is exported.
#pragma once

#include <backplane/abi/op_catalogue.h>
#include <backplane/abi/plugin_abi.h>
#include <backplane/device.hpp>
#include <backplane/errors.hpp>
#include <backplane/runtime.hpp>
#include <backplane/sdk/memory_counters.hpp>

#include "runtime/op_ring.hpp"

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace bp::detail {

struct RegistryState;

// Converts a plugin's error object (freed here) into the matching bp::Error subclass:
// BP_ERROR_OUT_OF_MEMORY -> OutOfMemory, BP_ERROR_UNSUPPORTED -> UnsupportedError,
// anything else -> PluginError. `context` says what the host was doing ("cuda:0: launch add").
// With `invalid_is_device_error`, BP_ERROR_INVALID_ARGUMENT becomes DeviceError (a bad
// address or foreign queue handed to an import) instead of PluginError.
[[noreturn]] void throw_plugin_error(const bp_plugin_api* api, bp_error* err,
                                     const std::string& context,
                                     bool invalid_is_device_error = false);

inline void check(const bp_plugin_api* api, bp_error* err, const char* what, const Device* dev) {
  if (err) [[unlikely]]
    throw_plugin_error(api, err, (dev ? dev->str() + ": " : std::string()) + what);
}

// The minor-2 slots the host may call, copied from the table at registration: NULL when the
// plugin leaves a slot NULL or its table does not have it (abi_minor < 2, or a struct_size
// that does not cover the slot). Nothing else reads these slots from the table.
struct NativeSlots {
  decltype(bp_plugin_api::buffer_native) buffer_native = nullptr;
  decltype(bp_plugin_api::stream_native) stream_native = nullptr;
  decltype(bp_plugin_api::buffer_import) buffer_import = nullptr;
  decltype(bp_plugin_api::stream_import) stream_import = nullptr;
};

// The minor-3 native graph slots (Note [Native graphs] in plugin_abi.h), all five or none:
// `begin_capture` is NULL unless the plugin's table has every one of them non-NULL.
struct GraphSlots {
  decltype(bp_plugin_api::graph_begin_capture) begin_capture = nullptr;
  decltype(bp_plugin_api::graph_end_capture) end_capture = nullptr;
  decltype(bp_plugin_api::graph_instantiate) instantiate = nullptr;
  decltype(bp_plugin_api::graph_launch) launch = nullptr;
  decltype(bp_plugin_api::graph_destroy) destroy = nullptr;
};

class Interceptor;  // interceptor.hpp

// A plugin loaded into one registry (the library itself is process-wide: Note [Registries] in
// runtime.hpp).
struct Plugin {
  std::string path;
  const bp_plugin_api* api = nullptr;
  // find_kernel_id may be called, and launch takes bp_attr arrays with ids (Note [Attribute
  // ids] in plugin_abi.h); false: names and bp_attr_minor1 arrays.
  bool has_minor2 = false;
  NativeSlots native;
  GraphSlots graph;
  std::string no_devices_reason;
  RegistryState* registry = nullptr;
  std::vector<std::unique_ptr<Device>> devices;
};

// A plugin stream shared by its Stream object and the buffers allocated on it (a Buffer frees
// on the stream it was allocated on). The last owner synchronises and destroys it; a wrapper of
// a foreign queue (Device::import_stream) is destroyed without waiting, since the work it
// queued belongs to the queue's owner (a DLPack consumer must not be blocked by its producer).
// Every StreamState is on a process-wide list while it lives, so that the exit handler can
// finish the work queued on it (Note [Exit] in registry.cpp).
struct StreamState {
  StreamState(Device& d, bp_stream* h, bool imported = false) noexcept;
  ~StreamState();
  StreamState(const StreamState&) = delete;
  StreamState& operator=(const StreamState&) = delete;
  Device& dev;
  bp_stream* s;
  bool imported;
  // The device's last op id when this stream last synchronised without error (Note [Op ring]):
  // the ops after it are the ones a failure of a plugin without op ids may come from.
  std::atomic<uint64_t> synced_through{0};
  StreamState* live_prev = nullptr;  // the live list, guarded by its mutex (plugin_device.cpp)
  StreamState* live_next = nullptr;
};

// Note [Exit]: waits for the work queued on every live stream of every plugin (errors dropped).
// Called by the exit handler only; streams may not be created or destroyed concurrently by it.
void finish_queued_work() noexcept;

struct DeviceState;
// DeviceLost for a call on a device already lost (Note [Device lost] in runtime.hpp).
[[noreturn]] void throw_device_lost(const DeviceState& ds);

// Everything of a Device that is not a static fact: the plugin table, streams, the kernel cache.
struct DeviceState {
  DeviceState(Plugin& p, int32_t i) noexcept
      : plugin(p),
        api(p.api),
        index(i),
        op_begin(BP_API_HAS_SLOT(p.api, 6, op_begin) ? p.api->op_begin : nullptr),
        stream_fault(BP_API_HAS_SLOT(p.api, 6, stream_fault) ? p.api->stream_fault : nullptr) {}

  Plugin& plugin;
  const bp_plugin_api* api;
  int32_t index;
  Device* self = nullptr;  // set by the Device that owns this state

  // Note [Asynchronous errors] in plugin_abi.h: the minor-6 slots, NULL when the plugin's table
  // lacks them or leaves them NULL.
  decltype(bp_plugin_api::op_begin) op_begin;
  decltype(bp_plugin_api::stream_fault) stream_fault;
  // Note [Op ring]: the ids and descriptions of the work queued on this device.
  OpRing ring;
  // Gives the next queued piece of work its op id, tells the plugin and records it.
  uint64_t begin_transfer(bp_stream* s, OpKind kind, uint64_t bytes) noexcept {
    const uint64_t id = ring.next_id();
    if (op_begin) op_begin(id);
    ring.put_transfer(id, s, kind, bytes);
    return id;
  }
  // Note [Device lost] in runtime.hpp: set once the device is lost; `lost_error` (guarded by
  // lost_mu, written once before `lost` is set) is what every later call throws.
  std::atomic<bool> lost{false};
  mutable std::mutex lost_mu;
  std::shared_ptr<const DeviceLost> lost_error;
  // Throws DeviceLost once the device is lost (one relaxed load otherwise).
  void check_alive() const {
    if (lost.load(std::memory_order_relaxed)) [[unlikely]]
      throw_device_lost(*this);
  }

  // The default stream, created on first use (Note [Per-op hot path] in tensor_ops.cpp: one
  // atomic load once created).
  std::atomic<Stream*> default_stream{nullptr};
  std::atomic<bp_stream*> default_handle{nullptr};
  std::mutex mu;  // guards slow paths: stream creation, kernel resolution
  // Note [Sync-debug] (runtime.cpp): work was queued since the default stream was last drained.
  std::atomic<bool> queued{false};
  void mark_queued() noexcept {
    if (!queued.load(std::memory_order_relaxed)) queued.store(true, std::memory_order_relaxed);
  }
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Kernel>> kernel_store;
  std::array<std::atomic<Kernel*>, static_cast<size_t>(kNumOps) * kNumDTypes> kernels{};
  // Set once the backend has answered BP_ERROR_UNSUPPORTED for (op, dtype), so that
  // Device::supports and the fallbacks it guards (an old plugin without a fused op) ask the
  // plugin, and take `mu`, once per pair rather than once per call.
  std::array<std::atomic<bool>, static_cast<size_t>(kNumOps) * kNumDTypes> unsupported{};
  // Every buffer allocated through this device (Note [Memory accounting] in
  // memory_counters.hpp): counted in allocate, uncounted in release; imported buffers never.
  sdk::MemoryCounters memory;
  // Ordinal and DLPack type of this device's memory, for 0-byte buffers whose handle is NULL
  // (asked of the plugin once, with a small allocation).
  std::once_flag native_identity_once;
  NativeBuffer native_identity;
  // Note [Interceptors] (interceptor.hpp): the installed interceptor, else null, and the number
  // of calls into it in progress.
  std::atomic<Interceptor*> interceptor{nullptr};
  std::atomic<int> interceptor_pins{0};
  // The streams graph pools allocate on and native captures run on (never the default one, so
  // other threads' work on the default stream is never captured), created by the first capture.
  std::shared_ptr<StreamState> pool_stream;
  std::shared_ptr<StreamState> capture_stream;
  // Page-locked host memory from Device::host_alloc (start -> block), for the capture checks.
  // A block some graph copies from or to (`refs` > 0) is freed by its last graph, not by
  // host_free (Device::host_free).
  struct HostBlock {
    uint64_t bytes = 0;
    int refs = 0;
    bool freed = false;
  };
  std::mutex host_mu;
  std::map<uintptr_t, HostBlock> host_blocks;
  // Note [Buffers a graph keeps] (graph.cpp): buffers that graphs reference (handle -> entry);
  // a Buffer dropped while some graph holds it leaves its free here (`freed`), and the last
  // graph to let go runs it. `held_count` is the number of entries, tested by ~Buffer first.
  struct HeldBuffer {
    uint32_t holders = 0;
    bool freed = false;
    bool imported = false;
    uint64_t size = 0;
    std::shared_ptr<StreamState> stream;
  };
  std::atomic<uint32_t> held_count{0};
  std::mutex held_mu;
  std::map<bp_buffer*, HeldBuffer> held;
  // One more graph holds `b` (throws std::bad_alloc only).
  void hold_buffer(bp_buffer* b);
  // ~Buffer's test: true when a graph holds `b`, whose free is then left for the last graph
  // (`stream` is moved there).
  bool defer_free(bp_buffer* b, uint64_t size, std::shared_ptr<StreamState>& stream,
                  bool imported) noexcept;
  // `b` is held by one graph fewer; freed when that was the last and its Buffer went meanwhile.
  void unhold_buffer(bp_buffer* b) noexcept;
  // A Buffer's free: the profiler's record of it (not for imported memory), then release().
  void free_buffer(bp_buffer* b, uint64_t size, const StreamState* stream, bool imported) noexcept;
  // True when [p, p + n) lies in one block from host_alloc not yet freed; `ref` then counts a
  // reference to it (drop it with unref_host_block).
  bool is_host_block(const void* p, uint64_t n, bool ref = false);
  void unref_host_block(const void* p) noexcept;
  void free_host(void* p) noexcept;  // the plugin's host_free (or free without one)

  static size_t slot(Op op, DType dtype) {
    return static_cast<size_t>(op) * kNumDTypes + static_cast<size_t>(dtype);
  }
  Kernel& kernel(Op op, DType dtype) {
    Kernel* k = kernels[slot(op, dtype)].load(std::memory_order_acquire);
    return k ? *k : resolve_kernel(op, dtype);
  }
  // The default stream's plugin handle.
  bp_stream* stream_handle() {
    bp_stream* s = default_handle.load(std::memory_order_acquire);
    return s ? s : create_default_stream();
  }
  Stream& stream() {
    Stream* s = default_stream.load(std::memory_order_acquire);
    if (s) return *s;
    create_default_stream();
    return *default_stream.load(std::memory_order_acquire);
  }
  bool has_events() const { return api->event_create != nullptr; }

  Kernel& resolve_kernel(Op op, DType dtype);  // throws DTypeError, UnsupportedError
  Kernel* try_resolve(Op op, DType dtype);     // nullptr when the backend lacks it
  bp_stream* create_default_stream();
  // Allocates on a stream (NULL: the default one); throws OutOfMemory naming the request.
  std::shared_ptr<Buffer> allocate(uint64_t bytes, std::shared_ptr<StreamState> stream);
  // Frees a buffer on the stream it was allocated on (NULL: the default stream); `counted`:
  // made by allocate (not imported), so taken off the statistics.
  void release(bp_buffer* b, uint64_t size, const StreamState* stream, bool counted) noexcept;
  // MemoryStats: libbackplane's counts and the plugin's `reserved`. Throws on a plugin error.
  MemoryStats memory_stats();
  // Native address of byte `offset` of a buffer of this device (handle may be NULL for a
  // 0-byte allocation); `size` is the buffer's size, for the bounds check.
  NativeBuffer native_of(bp_buffer* handle, uint64_t size, uint64_t offset);
  void* stream_native(bp_stream* s);
  // UnsupportedError for a missing minor-2 slot: names the device, what was asked, the
  // plugin, its ABI and whether its table lacks the slot (`in_table` false) or leaves it NULL.
  [[noreturn]] void no_native_slot(const char* slot, const char* what, bool in_table) const;
};

// The runtime layer's access to the private parts of the public device classes (their one
// friend; the tensor layer has its own, TensorAccess in tensor/tensor_internal.hpp).
struct Access {
  // Device
  static DeviceState& state(const Device& d) { return *d.state_; }
  static std::unique_ptr<Device> make_device(std::unique_ptr<DeviceState> state) {
    return std::unique_ptr<Device>(new Device(std::move(state)));
  }

  // Buffer
  static bp_buffer* handle(const Buffer& b) { return static_cast<bp_buffer*>(b.handle_); }
  static std::shared_ptr<Buffer> make_buffer(Device& d, bp_buffer* h, uint64_t size,
                                             std::shared_ptr<StreamState> stream, bool imported) {
    return std::make_shared<Buffer>(Key{}, d, h, size, std::move(stream), imported);
  }
  // Device::import_buffer allocates its Buffer before the plugin takes the memory, so that
  // nothing can fail after it has: an unarmed Buffer (no device) frees nothing when dropped;
  // arm_import gives it the plugin's handle.
  static std::shared_ptr<Buffer> unarmed_import(Device& d) {
    auto b = std::make_shared<Buffer>(Key{}, d, nullptr, 0, nullptr, /*imported=*/true);
    b->device_ = nullptr;
    return b;
  }
  static void arm_import(Buffer& b, Device& d, bp_buffer* h, uint64_t size) noexcept {
    b.device_ = &d;
    b.handle_ = h;
    b.size_ = size;
  }

  // Stream
  static bp_stream* handle(const Stream& s) { return s.state_->s; }
  static const std::shared_ptr<StreamState>& shared_state(const Stream& s) { return s.state_; }
  static std::unique_ptr<Stream> make_stream(Device& d, bp_stream* h, bool imported = false) {
    return std::unique_ptr<Stream>(new Stream(d, std::make_shared<StreamState>(d, h, imported)));
  }

  // Event
  static bp_event* handle(const Event& e) { return static_cast<bp_event*>(e.handle_); }
  static std::unique_ptr<Event> make_event(Device& d, bp_event* e) {
    return std::unique_ptr<Event>(new Event(d, e));
  }

  // Kernel
  static bp_kernel* handle(const Kernel& k) { return static_cast<bp_kernel*>(k.handle_); }
  static std::unique_ptr<Kernel> make_kernel(Device& d, Op op, DType dtype, bp_kernel* k) {
    return std::unique_ptr<Kernel>(new Kernel(d, op, dtype, k));
  }

  // Registry
  static RegistryState& state(const Registry& r) { return *r.s_; }
};

inline DeviceState& state(const Device& d) {
  return Access::state(d);
}
inline bp_buffer* handle(const Buffer& b) {
  return Access::handle(b);
}
inline bp_stream* handle(const Stream& s) {
  return Access::handle(s);
}

// Queues `k` on `stream` with tensor descriptors and attributes (Note [Attribute ids]: plugins
// of minor 0 and 1 get attribute arrays of their own layout).
void launch(const Kernel& k, bp_stream* stream, std::span<const bp_tensor_desc> inputs,
            std::span<const bp_tensor_desc> outputs, std::span<const bp_attr> attrs);
// Throws DTypeError naming the op, the dtype and the op's domain (Note [Dtype domains] in
// plugin_abi.h).
[[noreturn]] void throw_domain_error(Op op, DType dtype);
// Throws DTypeError unless `dtype` lies in the dtype domain of `op`: every op checks this before
// it allocates or dispatches anything. A bit test; no string unless it throws.
inline void check_domain(Op op, DType dtype) {
  if (!bp_op_in_domain(static_cast<int32_t>(op), static_cast<int32_t>(dtype))) [[unlikely]]
    throw_domain_error(op, dtype);
}
// The launch of an op `dev`'s plugin lacks: copies the operands' bytes to a device of another
// plugin that has the op, runs it there and copies the outputs back, under the fallback policy
// (Note [Fallback by copy] in fallback.cpp). UnsupportedError naming the op, dtype, device and
// "devices that have it: none" when no device has it, or when the policy is error.
void launch_elsewhere(Device& dev, Op op, DType dtype, std::span<const bp_tensor_desc> in,
                      std::span<const bp_tensor_desc> out, std::span<const bp_attr> attrs);
// The per-op path (Note [Per-op hot path]): the kernel for (op, dtype) from the device's
// cache, launched on its default stream; an op the plugin lacks goes to launch_elsewhere.
inline void launch(Device& dev, Op op, DType dtype, std::span<const bp_tensor_desc> inputs,
                   std::span<const bp_tensor_desc> outputs, std::span<const bp_attr> attrs = {}) {
  DeviceState& s = state(dev);
  Kernel* k = s.kernels[DeviceState::slot(op, dtype)].load(std::memory_order_acquire);
  if (!k) [[unlikely]] {
    check_domain(op, dtype);
    k = s.try_resolve(op, dtype);
    if (!k) return launch_elsewhere(dev, op, dtype, inputs, outputs, attrs);
  }
  launch(*k, s.stream_handle(), inputs, outputs, attrs);
}

// True when `dev`'s plugin takes attribute ALPHA on add and sub (minor >= 2).
inline bool takes_alpha(const Device& dev) {
  return state(dev).plugin.has_minor2;
}

// Sync-debug hook: called before an implicit device-to-host read on `dev` by the library
// function `what` (a SyncDebugCall on this thread names the user's call instead).
void note_implicit_sync(const Device& dev, const char* what);

}  // namespace bp::detail
