// Stream-ordered allocation (Note [Stream-ordered pool], Note [Small-block cache]) and the
// memory statistics of a device.
#include "cuda_device.hpp"

namespace bp::cuda {

void* Device::allocate(CudaStream& s, uint64_t size) {
  if (size == 0) return nullptr;
  void* p = cached_alloc(s, size);
  counters_.on_alloc(size);
  return p;
}

void Device::deallocate(CudaStream& s, void* ptr, uint64_t size) {
  if (!ptr) return;
  counters_.on_free(size);
  cached_free(s, ptr, size);
}

// Note [Scratch in graphs] (cuda_graph.cpp): a capturing stream's scratch belongs to its graph.
void* Device::allocate_scratch(CudaStream& s, uint64_t size) {
  if (CudaGraph* g = s.capture.load(std::memory_order_acquire)) [[unlikely]]
    return graph_scratch(*g, size);
  return cached_alloc(s, size);
}

void Device::free_scratch(CudaStream& s, void* ptr, uint64_t size) {
  if (CudaGraph* g = s.capture.load(std::memory_order_acquire)) [[unlikely]] {
    graph_scratch_free(*g, ptr, size);
    return;
  }
  cached_free(s, ptr, size);
}

void* Device::cached_alloc(CudaStream& s, uint64_t size) {
  const int cls = BlockCache::class_of(size == 0 ? 1 : size);
  if (cls >= 0) {
    if (void* p = s.cache.take(cls)) return p;
    return pool_alloc(s, bp::sdk::class_bytes(cls), size);
  }
  return pool_alloc(s, size, size);
}

void Device::cached_free(CudaStream& s, void* ptr, uint64_t size) {
  if (!ptr) return;
  const int cls = BlockCache::class_of(size == 0 ? 1 : size);
  if (cls >= 0 && s.cache.put(cls, ptr)) return;
  use_device(index());
  BP_CUDA_CHECK(cudaFreeAsync(ptr, s.stream));
}

void* Device::pool_alloc(CudaStream& s, uint64_t bytes, uint64_t requested) {
  use_device(index());
  void* p = nullptr;
  cudaError_t e = cudaErrorMemoryAllocation;
  // A request above the device's memory can never succeed: skip the driver and its retry.
  if (bytes <= info_.total_memory) {
    e = cudaMallocFromPoolAsync(&p, bytes, pool_, s.stream);
    if (e == cudaSuccess) return p;
    (void)cudaGetLastError();
    if (e != cudaErrorMemoryAllocation)
      bp::sdk::fail(BP_ERROR_DEVICE,
                    bp::sdk::format("cuda:%d: allocating %llu bytes failed: %s (%s)", index(),
                                    static_cast<unsigned long long>(requested), cudaGetErrorName(e),
                                    cudaGetErrorString(e)),
                    cudaGetErrorName(e));
    // Out of memory: give every cached block back to the pool, wait for the frees, return the
    // pool's unused memory to the driver, and try once more. While a stream captures, its cache
    // stays as it is (a free queued there would be captured, not run) and only the other
    // streams are waited for (a device-wide synchronisation is illegal during a capture).
    drain_caches();
    BP_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
    e = cudaMallocFromPoolAsync(&p, bytes, pool_, s.stream);
    if (e == cudaSuccess) return p;
    (void)cudaGetLastError();
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
  bp::sdk::fail(BP_ERROR_OUT_OF_MEMORY,
                bp::sdk::format("cuda:%d: out of memory allocating %llu bytes (%llu bytes free of "
                                "%llu; %llu allocated through Backplane)",
                                index(), static_cast<unsigned long long>(requested),
                                static_cast<unsigned long long>(free_bytes),
                                static_cast<unsigned long long>(total_bytes),
                                static_cast<unsigned long long>(counters_.allocated())),
                cudaGetErrorName(cudaErrorMemoryAllocation));
}

// Also waits for the frees: a device-wide synchronisation, or, while a stream captures, one of
// each drained stream.
void Device::drain_caches() {
  use_device(index());
  cudaError_t first = cudaSuccess;
  std::vector<cudaStream_t> eager;
  bool capturing = false;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    for (CudaStream* s : streams_) {
      if (s->capture.load(std::memory_order_acquire)) {
        capturing = true;
        continue;
      }
      eager.push_back(s->stream);
      s->cache.drain([&](void* p, int) {
        const cudaError_t e = cudaFreeAsync(p, s->stream);
        if (e != cudaSuccess && first == cudaSuccess) first = e;
      });
    }
  }
  BP_CUDA_CHECK(first);
  if (!capturing) {
    BP_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  for (cudaStream_t st : eager) BP_CUDA_CHECK(cudaStreamSynchronize(st));
}

void Device::memory_stats(bp_memory_stats& out) {
  counters_.fill(out);
  out.reserved = 0;
  if (ready_.load(std::memory_order_acquire)) {
    uint64_t reserved = 0;  // cuuint64_t
    BP_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved));
    out.reserved = reserved;
  }
}

void Device::reset_peak() {
  counters_.reset_peak();
}

void Device::empty_cache() {
  if (!ready_.load(std::memory_order_acquire)) return;
  drain_caches();
  retire_releases();  // everything queued has finished: every parked release is due
  BP_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
}

}  // namespace bp::cuda
