// Devices and their execution state: Device (static facts, owned by a Registry), Allocator and
// Buffer (memory), Stream and Event (ordering), Kernel (a resolved op implementation).
//
// Every class here has one implementation, over a backend plugin's C table; backends are added
// as plugins (plugin_abi.h), never by deriving from these classes, which users obtain from the
// runtime only. Users hold Device references; devices compare by identity and live as long as
// their Registry (the process default's live until process exit).
//
// Thread-safety: every member function may be called from any thread, on one stream from
// several threads at once included. Work queued on one stream runs in call order: a call that
// returned before another began is ordered before it, and calls that overlap in time are
// ordered in some order, each as a whole (the plugin ABI's Note [Stream threading]). Order
// between threads that matters to you is yours to establish, as with CUDA streams.
#pragma once

#include <backplane/dtype.hpp>
#include <backplane/export.hpp>
#include <backplane/ops.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace bp {

class Device;
class Stream;
class Event;

namespace detail {
struct Access;  // libbackplane's way into the classes below
struct DeviceState;
struct StreamState;
// A constructor argument only libbackplane can produce.
class Key {
  Key() = default;
  friend struct Access;
};
}  // namespace detail

// What a device is, as its backend declares it. Accelerators that are not GPUs (NPUs, FPGAs,
// DSPs) are `accelerator`; a CPU behind OpenCL is `cpu`.
enum class DeviceKind { cpu, gpu, accelerator };
BP_API const char* device_kind_name(DeviceKind kind);  // "cpu", "gpu", "accelerator"

struct DeviceProperties {
  std::string name;  // "NVIDIA H100 80GB HBM3"
  std::string vendor;
  std::string uuid;        // "" when the backend has none
  std::string pci_bus_id;  // "" when the backend has none
  uint64_t total_memory = 0;
  uint64_t free_memory = 0;  // at the time properties() was first read; see Device::free_memory
  int compute_major = 0, compute_minor = 0;
  int cores = 0;
  bool supports_f64 = true;
  bool unified_memory = false;  // device buffers are host memory
  // From the plugin; for a plugin that does not say (built before ABI 1.2 declared kinds):
  // cpu when its memory is host memory, else accelerator.
  DeviceKind kind = DeviceKind::cpu;
};

// Counted by libbackplane, which sees every allocation and free (requested bytes, the same on
// every backend; no lock, a few relaxed atomics per allocation); `reserved` comes from the
// backend. Buffers made by Device::import_buffer are not counted; 0-byte buffers count as
// allocations of 0 bytes.
struct MemoryStats {
  uint64_t allocated = 0;       // live bytes handed out
  uint64_t reserved = 0;        // bytes held from the system, caches included (the backend's)
  uint64_t peak_allocated = 0;  // high-water mark of allocated since the last reset_peak()
  uint64_t num_allocs = 0;      // live allocations
  uint64_t total_allocs = 0;    // allocations made since the device was created
};

// Where one byte of device memory lives in the vendor's own terms (Note [Native handles] in
// plugin_abi.h), for DLPack, communicators and other libraries that take raw pointers.
struct NativeBuffer {
  void* address = nullptr;     // host address (cpu) or device pointer (cuda)
  int device_ordinal = 0;      // vendor ordinal: the CUDA device id; 0 for host memory
  int dlpack_device_type = 0;  // DLPack DLDeviceType: 1 kDLCPU, 2 kDLCUDA, 13 kDLCUDAManaged
};

// An owning handle of one device allocation, made by Allocator::allocate or
// Device::import_buffer. Freed when the last shared_ptr goes away, stream-ordered on the stream
// it was allocated on (which stays alive until then); keeps its device's plugin loaded. While a
// graph's work references its memory, the free waits for the last such graph (graph.hpp). A
// buffer made by Device::import_buffer wraps someone else's memory: "freed" then means handed
// back to its owner (the release function runs once, after the work queued before the free).
class BP_API Buffer {
 public:
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Device& device() const noexcept { return *device_; }
  uint64_t size() const noexcept { return size_; }
  // Host address when the device's memory is host memory, else nullptr.
  void* host_pointer() const noexcept;
  // The native address of byte `offset` (0 <= offset <= size()), the vendor's device ordinal
  // and the DLPack device type. Stable for the buffer's life; queues no work, so the bytes
  // there are only current once the stream that writes them has been synchronised (or the
  // reader is ordered after it). Throws UnsupportedError naming the device and why (OpenCL
  // buffers have no address; a plugin older than ABI 1.2), ShapeError for an offset past the
  // end.
  NativeBuffer native(uint64_t offset = 0) const;
  // True for a buffer made by Device::import_buffer (not counted in memory_stats()).
  bool imported() const noexcept { return imported_; }

  // Made by libbackplane only (detail::Key), so that one allocation holds a buffer and its
  // shared count.
  Buffer(detail::Key, Device& device, void* handle, uint64_t size,
         std::shared_ptr<detail::StreamState> stream, bool imported) noexcept
      : device_(&device),
        handle_(handle),
        size_(size),
        stream_(std::move(stream)),
        imported_(imported) {}

 private:
  friend struct detail::Access;
  Device* device_;
  void* handle_;  // the plugin's opaque buffer handle
  uint64_t size_;
  std::shared_ptr<detail::StreamState> stream_;  // null: the device's default stream
  bool imported_;
};

// The memory of one device (Device::allocator()).
class BP_API Allocator {
 public:
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Allocates `bytes` usable by work queued on `stream`, a stream of this device. The buffer
  // is freed on that stream, which it keeps alive. Throws OutOfMemory naming the device, the
  // request and the free memory; DeviceMismatch for a stream of another device.
  std::shared_ptr<Buffer> allocate(uint64_t bytes, Stream& stream);
  // Allocates on the device's default stream.
  std::shared_ptr<Buffer> allocate(uint64_t bytes);
  MemoryStats stats();
  // Starts peak_allocated again from the current allocated (libbackplane's count; the
  // backend is not asked).
  void reset_peak();
  // Returns cached free memory to the system.
  void empty_cache();

 private:
  friend class Device;
  explicit Allocator(Device& device) noexcept : device_(&device) {}
  Device* device_;
};

// An in-order queue of work on one device. The queue is destroyed, once its work has finished,
// when the Stream object and every buffer allocated on it are gone: a buffer outliving its
// Stream object is still freed on that queue.
class BP_API Stream {
 public:
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device& device() const noexcept { return *device_; }
  // Blocks until all work queued so far has finished.
  void synchronize();
  // Future work on this stream waits for `event` (recorded on any stream of the device).
  void wait(Event& event);
  // The backend's own queue behind this stream (cudaStream_t on cuda, cl_command_queue on
  // opencl), owned by Backplane: valid while this Stream lives, never to be destroyed by the
  // caller. nullptr on cpu, whose streams execute eagerly and have no native object. The same
  // value on every call. Throws UnsupportedError naming the device when the plugin does not
  // expose it.
  void* native_handle() const;

 private:
  friend struct detail::Access;
  Stream(Device& device, std::shared_ptr<detail::StreamState> state) noexcept;
  Device* device_;
  std::shared_ptr<detail::StreamState> state_;
};

// A marker in a stream's work, for ordering between streams and for timing.
class BP_API Event {
 public:
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(Stream& stream);
  void synchronize();
  // Milliseconds from this event to `end`; both recorded and complete.
  double elapsed_ms(Event& end);

 private:
  friend struct detail::Access;
  Event(Device& device, void* handle) noexcept : device_(&device), handle_(handle) {}
  Device* device_;
  void* handle_;  // the plugin's opaque event; null without plugin events (Note [Events
                  // without plugin support]: record synchronises and stamps host_time_)
  std::chrono::steady_clock::time_point host_time_{};
  std::weak_ptr<detail::StreamState> recorded_on_;  // the stream of the last record
};

// An op implementation of one device, resolved once and cached (Device::kernel). Ops are
// launched by libbackplane's tensor operations.
class BP_API Kernel {
 public:
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  Device& device() const noexcept { return *device_; }
  Op op() const noexcept { return op_; }
  DType dtype() const noexcept { return dtype_; }

 private:
  friend struct detail::Access;
  Kernel(Device& device, Op op, DType dtype, void* handle) noexcept
      : device_(&device), op_(op), dtype_(dtype), handle_(handle) {}
  Device* device_;
  Op op_;
  DType dtype_;
  void* handle_;  // the plugin's opaque kernel handle
};

class BP_API Device {
 public:
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const std::string& str() const noexcept { return str_; }    // "cuda:1"
  const std::string& type() const noexcept { return type_; }  // "cuda"
  int index() const noexcept { return index_; }
  bool operator==(const Device& o) const noexcept { return this == &o; }

  const std::string& backend_name() const noexcept { return backend_; }  // the plugin serving it
  const DeviceProperties& properties() const noexcept { return props_; }
  uint64_t free_memory() const;  // read now
  Allocator& allocator() noexcept { return allocator_; }
  MemoryStats memory_stats() { return allocator_.stats(); }

  Stream& default_stream();
  std::unique_ptr<Stream> create_stream();
  std::unique_ptr<Event> create_event();
  // Waits for every stream of the device that Backplane created.
  void synchronize();

  // The kernel for (op, dtype), resolved once and cached. Throws DTypeError when dtype lies
  // outside the op's dtype domain (plugin_abi.h, Note [Dtype domains]), UnsupportedError naming
  // the op, dtype, this device and the devices that do have it when the backend lacks it.
  Kernel& kernel(Op op, DType dtype);
  // True when the backend has (op, dtype), false outside the op's domain; never throws.
  bool supports(Op op, DType dtype);

  // Stream-ordered copies between host memory and a buffer on this device. The host memory
  // must stay valid until the stream has passed the copy.
  void copy_from_host(Stream& s, Buffer& dst, uint64_t dst_off, const void* src, uint64_t n);
  void copy_to_host(Stream& s, void* dst, const Buffer& src, uint64_t src_off, uint64_t n);
  void copy_within(Stream& s, Buffer& dst, uint64_t dst_off, const Buffer& src, uint64_t src_off,
                   uint64_t n);
  void memset(Stream& s, Buffer& dst, uint64_t off, int value, uint64_t n);
  // Page-locked host memory for fast transfers to and from this device (ordinary 64-byte
  // aligned memory when the backend has none). Free with host_free. Throws OutOfMemory. The
  // only host memory a graph capture copies from or to (graph.hpp).
  void* host_alloc(uint64_t n);
  void host_free(void* p) noexcept;
  // Copies between this device and another device; same plugin -> peer copy, else staged
  // through host memory. Ordered after prior work on both devices' default streams.
  void copy_from_device(Buffer& dst, uint64_t dst_off, const Buffer& src, uint64_t src_off,
                        uint64_t n);

  // ---- Native handles and external memory (plugin ABI 1.2) ----
  // Wraps `size` bytes at `address`, memory of this device owned by someone else (a host
  // address on cpu, a device pointer or managed memory of this GPU on cuda), as a Buffer
  // without copying. `release` (may be empty) runs exactly once, on a host thread, after the
  // last reference to the Buffer is gone and the work queued on the device's default stream
  // before then has finished with the memory; until it runs the owner must keep the memory
  // valid. Imported bytes are not counted in memory_stats(). When this throws, release is not
  // called and the caller still owns the memory. Throws UnsupportedError naming the device and
  // the reason (OpenCL, or a plugin older than ABI 1.2), DeviceError for a NULL address with a
  // non-zero size or memory that is not this device's (the backend's message says whose).
  std::shared_ptr<Buffer> import_buffer(void* address, uint64_t size,
                                        std::function<void()> release);
  // The same with a C release function: `release(release_ctx)` runs once as above (NULL:
  // nothing runs), and must not throw. Nothing is allocated for it, which makes this the form
  // for importers that wrap memory often (DLPack's from_dlpack).
  using ReleaseFn = void (*)(void* release_ctx);
  std::shared_ptr<Buffer> import_buffer(void* address, uint64_t size, ReleaseFn release,
                                        void* release_ctx);
  // Wraps a native queue of this device (a cudaStream_t, including the legacy default stream
  // nullptr, on cuda; a cl_command_queue of the device's context on opencl; nullptr on cpu) as
  // a Stream that does not own it: destroying the Stream leaves the native queue alive, and
  // its owner must keep it alive while the Stream exists. Throws UnsupportedError or
  // DeviceError (a queue of another device) as import_buffer does.
  std::unique_ptr<Stream> import_stream(void* native_stream);

 private:
  friend struct detail::Access;
  explicit Device(std::unique_ptr<detail::DeviceState> state);

  std::string str_, type_, backend_;
  int index_;
  DeviceProperties props_;
  Allocator allocator_;
  std::unique_ptr<detail::DeviceState> state_;
};

}  // namespace bp
