// Devices and their execution state: Device (static facts, owned by the runtime), Allocator and
// Buffer (memory), Stream and Event (ordering), Kernel (a resolved op implementation).
//
// Users hold Device references; devices compare by identity and live until process exit.
// Thread-safety: every member function may be called from any thread; work queued on one
// stream from several threads at once is ordered by whichever call comes first.
#pragma once

#include <backplane/plugin_abi.h>
#include <backplane/dtype.hpp>
#include <backplane/ops.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace bp {

class Device;
class Stream;

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
};

struct MemoryStats {
  uint64_t allocated = 0;       // live bytes handed out
  uint64_t reserved = 0;        // bytes held from the system, caches included
  uint64_t peak_allocated = 0;  // since the last reset_peak()
  uint64_t num_allocs = 0;      // live allocations
};

// Where one byte of device memory lives in the vendor's own terms (Note [Native handles] in
// plugin_abi.h), for DLPack, communicators and other libraries that take raw pointers.
struct NativeBuffer {
  void* address = nullptr;     // host address (cpu) or device pointer (cuda)
  int device_ordinal = 0;      // vendor ordinal: the CUDA device id; 0 for host memory
  int dlpack_device_type = 0;  // DLPack DLDeviceType: 1 kDLCPU, 2 kDLCUDA, 13 kDLCUDAManaged
};

// An owning handle of one device allocation. Freed (stream-ordered on the device's default
// stream) when the last shared_ptr goes away; keeps its device's plugin loaded. A buffer made
// by Device::import_buffer wraps someone else's memory: "freed" then means handed back to its
// owner (the release function runs once, after the work queued before the free).
class Buffer {
 public:
  Buffer(Device& device, bp_buffer* handle, uint64_t size, bool imported = false) noexcept
      : device_(&device), handle_(handle), size_(size), imported_(imported) {}
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Device& device() const noexcept { return *device_; }
  bp_buffer* handle() const noexcept { return handle_; }
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

 private:
  Device* device_;
  bp_buffer* handle_;
  uint64_t size_;
  bool imported_;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Allocates `bytes` usable by work queued on `stream`. Throws OutOfMemory naming the device,
  // the request and the free memory.
  virtual std::shared_ptr<Buffer> allocate(uint64_t bytes, Stream& stream) = 0;
  // Allocates on the device's default stream.
  virtual std::shared_ptr<Buffer> allocate(uint64_t bytes) = 0;
  virtual MemoryStats stats() = 0;
  virtual void reset_peak() = 0;
  // Returns cached free memory to the system.
  virtual void empty_cache() = 0;
};

class Event;

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device& device() const = 0;
  virtual bp_stream* handle() const = 0;
  // Blocks until all work queued so far has finished.
  virtual void synchronize() = 0;
  // Future work on this stream waits for `event` (recorded on any stream of the device).
  virtual void wait(Event& event) = 0;
  // The backend's own queue behind this stream (cudaStream_t on cuda, cl_command_queue on
  // opencl), owned by Backplane: valid while this Stream lives, never to be destroyed by the
  // caller. nullptr on cpu, whose streams execute eagerly and have no native object. The same
  // value on every call. Throws UnsupportedError naming the device when the plugin does not
  // expose it.
  virtual void* native_handle() const = 0;
};

class Event {
 public:
  virtual ~Event() = default;
  virtual void record(Stream& stream) = 0;
  virtual void synchronize() = 0;
  // Milliseconds from this event to `end`; both recorded and complete.
  virtual double elapsed_ms(Event& end) = 0;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual Op op() const = 0;
  virtual DType dtype() const = 0;
  virtual void launch(Stream& stream, std::span<const bp_tensor_desc> inputs,
                      std::span<const bp_tensor_desc> outputs, std::span<const bp_attr> attrs) = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const std::string& str() const noexcept { return str_; }    // "cuda:1"
  const std::string& type() const noexcept { return type_; }  // "cuda"
  int index() const noexcept { return index_; }
  bool operator==(const Device& o) const noexcept { return this == &o; }

  virtual const std::string& backend_name() const = 0;  // the plugin serving it
  virtual const DeviceProperties& properties() const = 0;
  virtual uint64_t free_memory() const = 0;  // read now
  virtual Allocator& allocator() = 0;
  MemoryStats memory_stats() { return allocator().stats(); }

  virtual Stream& default_stream() = 0;
  virtual std::unique_ptr<Stream> create_stream() = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // Waits for every stream of the device that Backplane created.
  virtual void synchronize() = 0;

  // The kernel for (op, dtype), resolved once and cached. Throws UnsupportedError naming the
  // op, dtype, this device and the devices that do have it.
  virtual Kernel& kernel(Op op, DType dtype) = 0;
  // True when the backend has (op, dtype); never throws.
  virtual bool supports(Op op, DType dtype) = 0;

  // Stream-ordered copies between host memory and a buffer on this device. The host memory
  // must stay valid until the stream has passed the copy.
  virtual void copy_from_host(Stream& s, Buffer& dst, uint64_t dst_off, const void* src,
                              uint64_t n) = 0;
  virtual void copy_to_host(Stream& s, void* dst, const Buffer& src, uint64_t src_off,
                            uint64_t n) = 0;
  virtual void copy_within(Stream& s, Buffer& dst, uint64_t dst_off, const Buffer& src,
                           uint64_t src_off, uint64_t n) = 0;
  virtual void memset(Stream& s, Buffer& dst, uint64_t off, int value, uint64_t n) = 0;
  // Page-locked host memory for fast transfers to and from this device (ordinary 64-byte
  // aligned memory when the backend has none). Free with host_free. Throws OutOfMemory.
  virtual void* host_alloc(uint64_t n) = 0;
  virtual void host_free(void* p) noexcept = 0;
  // Copies between this device and another device; same plugin -> peer copy, else staged
  // through host memory. Ordered after prior work on both devices' default streams.
  virtual void copy_from_device(Buffer& dst, uint64_t dst_off, const Buffer& src, uint64_t src_off,
                                uint64_t n) = 0;

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
  virtual std::shared_ptr<Buffer> import_buffer(void* address, uint64_t size,
                                                std::function<void()> release) = 0;
  // Wraps a native queue of this device (a cudaStream_t, including the legacy default stream
  // nullptr, on cuda; a cl_command_queue of the device's context on opencl; nullptr on cpu) as
  // a Stream that does not own it: destroying the Stream leaves the native queue alive, and
  // its owner must keep it alive while the Stream exists. Throws UnsupportedError or
  // DeviceError (a queue of another device) as import_buffer does.
  virtual std::unique_ptr<Stream> import_stream(void* native_stream) = 0;

 protected:
  Device(std::string type, int index)
      : str_(type + ":" + std::to_string(index)), type_(std::move(type)), index_(index) {}

 private:
  std::string str_, type_;
  int index_;
};

}  // namespace bp
