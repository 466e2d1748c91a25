#include "opencl_allocator.hpp"

#include "opencl_device.hpp"

#include <bit>

namespace bp::opencl {

// Note [Size classes]
//   A request is rounded up to a class so that freed buffers can be reused by requests of
//   slightly different sizes: at least 512 bytes, powers of two up to 1 MiB, and above that
//   four classes per doubling (multiples of a quarter of the largest power of two below the
//   request), so at most 25% of a large buffer is slack. A class above the device's maximum
//   single allocation is clamped to it. The cache keeps freed buffers per class and never
//   splits or merges them.
//
// Note [Cross-stream reuse]
//   mem_free is stream-ordered: the work already queued on the freeing stream may still use
//   the buffer. A cached buffer records the id of the stream that freed it. Reusing it on the
//   same (in-order) stream needs nothing. Reusing it on another stream enqueues a marker on the
//   freeing stream (if that stream still exists; a destroyed stream has finished its work) and
//   a barrier waiting on that marker on the allocating stream, or waits on the host when the
//   allocation has no stream. Releasing a cached buffer to the driver needs no wait: OpenCL
//   deletes a cl_mem only after the commands using it have finished.

uint64_t Allocator::size_class(uint64_t size) {
  if (size <= 512) return 512;
  if (size <= (uint64_t{1} << 20)) return std::bit_ceil(size);
  uint64_t step = std::bit_floor(size) >> 2;
  return (size + step - 1) / step * step;
}

Allocator::Allocator(Device& device) : device_(device) {}

Allocator::~Allocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cache_locked();
}

void Allocator::release_cache_locked() {
  for (auto& [cls, list] : cache_) {
    for (Cached& c : list) {
      clReleaseMemObject(c.buf->mem);
      reserved_ -= c.buf->capacity;
      cached_ -= c.buf->capacity;
      delete c.buf;
    }
  }
  cache_.clear();
}

void Allocator::order_after(const Cached& c, bp_stream* stream) {
  if (c.stream_id == 0 || (stream && stream->id == c.stream_id)) return;
  cl_event marker = device_.enqueue_marker(c.stream_id);
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
  if (size == 0) {
    auto* buf = new bp_buffer{nullptr, 0, 0, device_.index()};
    std::lock_guard<std::mutex> lock(mutex_);
    ++num_allocs_;
    return buf;
  }
  if (size > info.max_alloc) {
    sdk::fail(BP_ERROR_OUT_OF_MEMORY,
              sdk::format("opencl: out of memory on %s: cannot allocate %llu bytes: larger than "
                          "the device's largest single allocation (CL_DEVICE_MAX_MEM_ALLOC_SIZE "
                          "= %llu bytes; device memory %llu bytes, %llu bytes free)",
                          device_.label().c_str(), static_cast<unsigned long long>(size),
                          static_cast<unsigned long long>(info.max_alloc),
                          static_cast<unsigned long long>(info.global_memory),
                          static_cast<unsigned long long>(info.global_memory - reserved())),
              "CL_INVALID_BUFFER_SIZE");
  }
  uint64_t cls = size_class(size);
  if (cls > info.max_alloc) cls = info.max_alloc;

  std::lock_guard<std::mutex> lock(mutex_);
  auto it = cache_.find(cls);
  if (it != cache_.end() && !it->second.empty()) {
    std::vector<Cached>& list = it->second;
    size_t pick = list.size() - 1;  // prefer a buffer freed on this stream: no ordering needed
    for (size_t i = list.size(); i-- > 0;) {
      if (stream && list[i].stream_id == stream->id) {
        pick = i;
        break;
      }
    }
    Cached c = list[pick];
    order_after(c, stream);
    list.erase(list.begin() + static_cast<std::ptrdiff_t>(pick));
    cached_ -= cls;
    c.buf->size = size;
    allocated_ += size;
    peak_ = std::max(peak_, allocated_);
    ++num_allocs_;
    return c.buf;
  }

  // Our own bookkeeping is the only view of free memory OpenCL offers: release the cache
  // before going past the device's memory, then refuse.
  if (reserved_ + cls > info.global_memory) release_cache_locked();
  cl_int status = CL_SUCCESS;
  cl_mem mem = nullptr;
  if (reserved_ + cls > info.global_memory) {
    status = CL_MEM_OBJECT_ALLOCATION_FAILURE;
  } else {
    mem = clCreateBuffer(device_.context(), CL_MEM_READ_WRITE, cls, nullptr, &status);
    if (status == CL_MEM_OBJECT_ALLOCATION_FAILURE || status == CL_OUT_OF_RESOURCES ||
        status == CL_OUT_OF_HOST_MEMORY) {
      release_cache_locked();
      mem = clCreateBuffer(device_.context(), CL_MEM_READ_WRITE, cls, nullptr, &status);
    }
  }
  if (status != CL_SUCCESS) {
    bp_error_code code =
        (status == CL_MEM_OBJECT_ALLOCATION_FAILURE || status == CL_OUT_OF_RESOURCES ||
         status == CL_OUT_OF_HOST_MEMORY || status == CL_INVALID_BUFFER_SIZE)
            ? BP_ERROR_OUT_OF_MEMORY
            : BP_ERROR_DEVICE;
    uint64_t free_bytes = info.global_memory > reserved_ ? info.global_memory - reserved_ : 0;
    sdk::fail(code,
              sdk::format("opencl: out of memory on %s: cannot allocate %llu bytes (size class "
                          "%llu): clCreateBuffer returned %s; device memory %llu bytes, this "
                          "process holds %llu bytes (%llu in use), %llu bytes free",
                          device_.label().c_str(), static_cast<unsigned long long>(size),
                          static_cast<unsigned long long>(cls), cl_error_name(status).c_str(),
                          static_cast<unsigned long long>(info.global_memory),
                          static_cast<unsigned long long>(reserved_),
                          static_cast<unsigned long long>(allocated_),
                          static_cast<unsigned long long>(free_bytes)),
              cl_error_name(status));
  }
  auto* buf = new bp_buffer{mem, size, cls, device_.index()};
  reserved_ += cls;
  allocated_ += size;
  peak_ = std::max(peak_, allocated_);
  ++num_allocs_;
  return buf;
}

void Allocator::release(bp_buffer* buf, bp_stream* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  --num_allocs_;
  if (!buf->mem) {
    delete buf;
    return;
  }
  allocated_ -= buf->size;
  cached_ += buf->capacity;
  cache_[buf->capacity].push_back(Cached{buf, stream ? stream->id : 0});
}

bp_memory_stats Allocator::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  bp_memory_stats s{};
  s.struct_size = sizeof s;
  s.allocated = allocated_;
  s.reserved = reserved_;
  s.peak_allocated = peak_;
  s.num_allocs = num_allocs_;
  return s;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_ = allocated_;
}

void Allocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cache_locked();
}

uint64_t Allocator::reserved() {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_;
}

}  // namespace bp::opencl
