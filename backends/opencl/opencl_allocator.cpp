#include "opencl_allocator.hpp"

#include "opencl_device.hpp"

#include <algorithm>

namespace bp::opencl {

// Note [OpenCL buffer cache]
//   Requests are rounded up to a size class (Note [Size classes] in size_class_cache.hpp) and
//   freed buffers of classes up to 1 GiB are parked in one lock-free cache per device; a class
//   above the device's largest single allocation is not used: such a request gets a buffer of
//   exactly its size, released to the driver when freed, as is anything the full cache refuses.
//   OpenCL itself tells us nothing about free memory, so the allocator counts the bytes it holds
//   from the driver (`reserved`, live and cached) and empties the cache before going past the
//   device's memory, and again before the one retry after clCreateBuffer fails.
//
// Note [Cross-stream reuse]
//   mem_free is stream-ordered: the work already queued on the freeing stream may still use
//   the buffer. A cached buffer records the id of the stream that freed it. Reusing it on the
//   same (in-order) stream needs nothing. Reusing it on another stream enqueues a marker on the
//   freeing stream (if that stream still exists; a destroyed stream has finished its work) and
//   a barrier waiting on that marker on the allocating stream, or waits on the host when the
//   allocation has no stream. The lock-free cache hands out any parked buffer of the class, not
//   preferably one of the allocating stream; with one stream (libbackplane's default stream
//   does all per-op work) no ordering is ever needed. Releasing a cached buffer to the driver
//   needs no wait: OpenCL deletes a cl_mem only after the commands using it have finished.

namespace {
uint64_t cache_bound(const DeviceInfo& info) {
  return info.global_memory / 4;
}
}  // namespace

Allocator::Allocator(Device& device) : device_(device), cache_(cache_bound(device.info())) {}

Allocator::~Allocator() {
  empty_cache();
}

void Allocator::destroy(bp_buffer* buf) {
  clReleaseMemObject(buf->mem);
  reserved_.fetch_sub(buf->capacity, std::memory_order_relaxed);
  delete buf;
}

void Allocator::empty_cache() {
  cache_.drain([this](bp_buffer* buf, int) { destroy(buf); });
}

void Allocator::order_after(const bp_buffer& buf, bp_stream* stream) {
  if (buf.freed_on == 0 || (stream && stream->id == buf.freed_on)) return;
  cl_event marker = device_.enqueue_marker(buf.freed_on);
  if (!marker) return;
  cl_int status = stream ? clEnqueueBarrierWithWaitList(stream->queue, 1, &marker, nullptr)
                         : clWaitForEvents(1, &marker);
  clReleaseEvent(marker);
  if (status != CL_SUCCESS)
    fail_cl(status, stream ? "clEnqueueBarrierWithWaitList" : "clWaitForEvents",
            device_.label() + ": reusing a cached buffer freed on another stream");
}

bp_buffer* Allocator::allocate(uint64_t size, bp_stream* stream) {
  const DeviceInfo& info = device_.info();
  if (size == 0) return new bp_buffer{nullptr, 0, 0, device_.index(), -1, 0};
  if (size > info.max_alloc) {
    sdk::fail(BP_ERROR_OUT_OF_MEMORY,
              sdk::format("opencl: out of memory on %s: cannot allocate %llu bytes: larger than "
                          "the device's largest single allocation (CL_DEVICE_MAX_MEM_ALLOC_SIZE "
                          "= %llu bytes; device memory %llu bytes, %llu bytes free)",
                          device_.label().c_str(), static_cast<unsigned long long>(size),
                          static_cast<unsigned long long>(info.max_alloc),
                          static_cast<unsigned long long>(info.global_memory),
                          static_cast<unsigned long long>(
                              info.global_memory - std::min(info.global_memory, reserved()))),
              "CL_INVALID_BUFFER_SIZE");
  }
  int cls = Cache::class_of(size);
  if (cls >= 0 && sdk::class_bytes(cls) > info.max_alloc) cls = -1;
  if (cls >= 0) {
    if (bp_buffer* buf = cache_.take(cls)) {
      try {
        order_after(*buf, stream);
      } catch (...) {
        destroy(buf);
        throw;
      }
      buf->size = size;
      buf->freed_on = 0;
      return buf;
    }
  }
  const uint64_t bytes = cls >= 0 ? sdk::class_bytes(cls) : size;

  // Our own bookkeeping is the only view of free memory OpenCL offers: release the cache
  // before going past the device's memory, then refuse.
  if (reserved() + bytes > info.global_memory) empty_cache();
  cl_int status = CL_SUCCESS;
  cl_mem mem = nullptr;
  if (reserved() + bytes > info.global_memory) {
    status = CL_MEM_OBJECT_ALLOCATION_FAILURE;
  } else {
    mem = clCreateBuffer(device_.context(), CL_MEM_READ_WRITE, bytes, nullptr, &status);
    if (status == CL_MEM_OBJECT_ALLOCATION_FAILURE || status == CL_OUT_OF_RESOURCES ||
        status == CL_OUT_OF_HOST_MEMORY) {
      empty_cache();
      mem = clCreateBuffer(device_.context(), CL_MEM_READ_WRITE, bytes, nullptr, &status);
    }
  }
  if (status != CL_SUCCESS) {
    bp_error_code code =
        (status == CL_MEM_OBJECT_ALLOCATION_FAILURE || status == CL_OUT_OF_RESOURCES ||
         status == CL_OUT_OF_HOST_MEMORY || status == CL_INVALID_BUFFER_SIZE)
            ? BP_ERROR_OUT_OF_MEMORY
            : BP_ERROR_DEVICE;
    const uint64_t held = reserved(), cached = std::min(held, cache_.bytes());
    const uint64_t free_bytes = info.global_memory > held ? info.global_memory - held : 0;
    sdk::fail(code,
              sdk::format("opencl: out of memory on %s: cannot allocate %llu bytes (size class "
                          "%llu): clCreateBuffer returned %s; device memory %llu bytes, this "
                          "process holds %llu bytes (%llu in use), %llu bytes free",
                          device_.label().c_str(), static_cast<unsigned long long>(size),
                          static_cast<unsigned long long>(bytes), cl_error_name(status).c_str(),
                          static_cast<unsigned long long>(info.global_memory),
                          static_cast<unsigned long long>(held),
                          static_cast<unsigned long long>(held - cached),
                          static_cast<unsigned long long>(free_bytes)),
              cl_error_name(status));
  }
  reserved_.fetch_add(bytes, std::memory_order_relaxed);
  return new bp_buffer{mem, size, bytes, device_.index(), cls, 0};
}

void Allocator::release(bp_buffer* buf, bp_stream* stream) {
  if (!buf->mem) {
    delete buf;
    return;
  }
  buf->freed_on = stream ? stream->id : 0;
  if (buf->cls >= 0 && cache_.put(buf->cls, buf)) return;
  destroy(buf);
}

bp_memory_stats Allocator::stats() {
  bp_memory_stats s{};
  s.struct_size = sizeof s;
  counters_.fill(s);
  s.reserved = reserved();
  return s;
}

}  // namespace bp::opencl
