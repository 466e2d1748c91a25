// The per-device caching allocator of the OpenCL backend. Device memory is cl_mem buffers;
// freed buffers are parked in the SDK's lock-free size-class cache (bp::sdk::SizeClassCache) and
// handed out again to later requests of the same class (Note [Size classes] in
// size_class_cache.hpp, Note [Cross-stream reuse] in opencl_allocator.cpp).
#pragma once

#include "opencl_common.hpp"

#include <backplane/sdk/memory_counters.hpp>
#include <backplane/sdk/size_class_cache.hpp>

#include <atomic>
#include <cstdint>

// A device allocation: bp_buffer* handed to the host points at one of these. `mem` is NULL for
// zero-byte allocations. Owned by the Allocator of `device` between allocate and release.
struct bp_buffer {
  cl_mem mem;
  uint64_t size;      // bytes requested
  uint64_t capacity;  // bytes of the cl_mem (its size class, or the request when uncached)
  int32_t device;
  int32_t cls;        // size class, or -1: released to the driver when freed
  uint64_t freed_on;  // while cached: id of the stream that freed it, 0 for none
};

namespace bp::opencl {

using sdk::MemoryCounters;

class Device;

// Thread-safety: every member may be called from any thread; no lock is taken on the way
// through the cache (Note [Size-class cache] in size_class_cache.hpp).
class Allocator {
 public:
  explicit Allocator(Device& device);
  // Releases the cache. Buffers still live are the host's; they are not touched.
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Returns a buffer of at least `size` bytes, usable by work queued on `stream` (may be NULL)
  // after this call. size 0 gives a buffer without device memory. Throws BP_ERROR_OUT_OF_MEMORY
  // naming the size and the device when the device cannot satisfy the request, after one
  // retry with the cache released.
  bp_buffer* allocate(uint64_t size, bp_stream* stream);

  // Returns `buf` to the cache once the work already queued on `stream` no longer needs it
  // (stream-ordered; `stream` NULL means no work is pending). Takes ownership of `buf`.
  void release(bp_buffer* buf, bp_stream* stream);

  // The statistics of memory_stats: user allocations (mem_alloc/mem_free, counted by the
  // plugin for hosts other than libbackplane) and the bytes held from the driver.
  MemoryCounters& counters() { return counters_; }
  bp_memory_stats stats();
  // Releases every cached buffer back to the driver.
  void empty_cache();
  // Bytes held from the driver (live + cached).
  uint64_t reserved() const { return reserved_.load(std::memory_order_relaxed); }

  // Classes up to 1 GiB, 16 buffers each; at most a quarter of the device's memory parked.
  using Cache = sdk::SizeClassCache<bp_buffer, 30, 16>;

 private:
  // Makes work on `stream` wait for the work queued on the stream that freed `buf`.
  void order_after(const bp_buffer& buf, bp_stream* stream);
  // Gives a buffer's cl_mem back to the driver and deletes it.
  void destroy(bp_buffer* buf);

  Device& device_;
  Cache cache_;
  std::atomic<uint64_t> reserved_{0};
  MemoryCounters counters_;
};

}  // namespace bp::opencl
