// The per-device caching allocator of the OpenCL backend. Device memory is cl_mem buffers;
// freed buffers are kept in a cache keyed by size class and handed out again to later requests
// of the same class (Note [Size classes], Note [Cross-stream reuse] in opencl_allocator.cpp).
#pragma once

#include "opencl_common.hpp"

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

// A device allocation: bp_buffer* handed to the host points at one of these. `mem` is NULL for
// zero-byte allocations. Owned by the Allocator of `device` between allocate and release.
struct bp_buffer {
  cl_mem mem;
  uint64_t size;      // bytes requested
  uint64_t capacity;  // bytes of the cl_mem (the size class)
  int32_t device;
};

namespace bp::opencl {

class Device;

// Thread-safety: every member may be called from any thread (one mutex per device).
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

  bp_memory_stats stats();
  void reset_peak();
  // Releases every cached buffer back to the driver.
  void empty_cache();
  // Bytes held from the driver (live + cached).
  uint64_t reserved();

  // The size class a request of `size` bytes is rounded up to (exposed for tests).
  static uint64_t size_class(uint64_t size);

 private:
  struct Cached {
    bp_buffer* buf;
    uint64_t stream_id;  // stream it was freed on, 0 for none
  };

  void release_cache_locked();
  // Makes work on `stream` wait for the work that was queued on the freeing stream.
  void order_after(const Cached& c, bp_stream* stream);

  Device& device_;
  std::mutex mutex_;
  std::map<uint64_t, std::vector<Cached>> cache_;  // size class -> free buffers
  uint64_t allocated_ = 0, reserved_ = 0, cached_ = 0, peak_ = 0, num_allocs_ = 0;
};

}  // namespace bp::opencl
