// Native handles of the CUDA backend (plugin ABI minor 2): foreign memory and foreign streams.
//
// Note [CUDA imported memory]
//   buffer_import wraps a device pointer (or managed memory) owned by someone else, such as a
//   PyTorch or CuPy tensor, as a tagged handle (Note [Tagged buffer handles] in
//   plugin_sdk.hpp); kernels and copies use it like our own memory. The owner's release must
//   run once, on a host thread, after the work queued on mem_free's stream before the free
//   (plugin_abi.h, Note [Imported memory]). mem_free therefore
//     - with a NULL stream (Note [NULL streams]): synchronises the device, then releases;
//     - when cudaStreamQuery says the stream is idle: releases at once (the common case of a
//       tensor dropped after its results were read);
//     - otherwise: records an event on the stream and parks {event, handle} on the device.
//   Parked releases are retired, on whichever host thread gets there first, by every later
//   mem_alloc, mem_free, buffer_import, stream_synchronize and event_synchronize of the device
//   (one atomic load when nothing is parked), by memory_empty_cache and by shutdown. So a
//   release runs at the latest when the freeing stream is next synchronised through the
//   table. No CUDA host callback (cudaLaunchHostFunc) is used: a release may take locks or the
//   Python GIL, which a driver thread must never do. The pending list's lock is dropped before
//   any release runs, since a release may call back into the plugin (drop a tensor, free).
//   Imported bytes are not counted in memory_stats.
#include "cuda_device.hpp"

namespace bp::cuda {

namespace {

const char* memory_type_name(cudaMemoryType t) {
  switch (t) {
    case cudaMemoryTypeUnregistered:
      return "ordinary host memory";
    case cudaMemoryTypeHost:
      return "page-locked host memory";
    case cudaMemoryTypeDevice:
      return "device memory";
    case cudaMemoryTypeManaged:
      return "managed memory";
  }
  return "memory of an unknown kind";
}

// The attributes of `p`; cudaErrorInvalidValue (older drivers, for pointers CUDA never saw)
// reads as ordinary host memory.
cudaPointerAttributes attributes_of(const void* p) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e == cudaErrorInvalidValue) {
    (void)cudaGetLastError();
    a = cudaPointerAttributes{};
    a.type = cudaMemoryTypeUnregistered;
    return a;
  }
  BP_CUDA_CHECK(e);
  return a;
}

}  // namespace

bp_buffer* Device::import_buffer(void* address, uint64_t size, bp_release_fn release, void* ctx) {
  ensure_ready();
  retire_releases();
  int32_t dl_type = BP_DLPACK_CUDA;
  if (size != 0) {
    const char* first = static_cast<const char*>(address);
    const char* ends[2] = {first, first + (size - 1)};
    for (const char* p : ends) {
      const cudaPointerAttributes a = attributes_of(p);
      const bool ok = a.type == cudaMemoryTypeManaged ||
                      (a.type == cudaMemoryTypeDevice && a.device == index());
      if (!ok) {
        const bool other_device = a.type == cudaMemoryTypeDevice;
        bp::sdk::fail(
            BP_ERROR_INVALID_ARGUMENT,
            bp::sdk::format("cuda:%d: buffer_import: %s %p (byte %llu of the %llu to import) is "
                            "%s%s, not device memory of cuda:%d%s",
                            index(), p == first ? "address" : "last byte at",
                            static_cast<const void*>(p), static_cast<unsigned long long>(p - first),
                            static_cast<unsigned long long>(size), memory_type_name(a.type),
                            other_device ? bp::sdk::format(" of cuda:%d", a.device).c_str() : "",
                            index(),
                            a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost
                                ? " (host memory is imported on cpu:0)"
                                : ""));
      }
      if (a.type == cudaMemoryTypeManaged) dl_type = BP_DLPACK_CUDA_MANAGED;
    }
  }
  auto* r = new bp::sdk::ImportedBuffer{address, size, release, ctx, index(), dl_type};
  return bp::sdk::imported_handle(r);
}

void Device::free_imported(CudaStream* s, bp_buffer* handle) {
  retire_releases();
  use_device(index());
  if (!s) {  // Note [NULL streams]: the whole device
    const cudaError_t e = cudaDeviceSynchronize();
    bp::sdk::release_imported(handle);  // a failed synchronise leaves no work that could run
    BP_CUDA_CHECK(e);
    return;
  }
  cudaError_t q = cudaStreamQuery(s->stream);
  if (q == cudaSuccess) {
    bp::sdk::release_imported(handle);
    return;
  }
  if (q == cudaErrorNotReady) {
    (void)cudaGetLastError();
    cudaEvent_t ev = nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, s->stream);
    if (e == cudaSuccess) {
      std::lock_guard<std::mutex> lock(pending_mutex_);
      pending_.push_back({ev, handle});
      pending_count_.store(pending_.size(), std::memory_order_release);
      return;
    }
    (void)cudaGetLastError();
    if (ev) (void)cudaEventDestroy(ev);
  }
  // The stream reported an error, or no event could be recorded: wait for it instead.
  const cudaError_t e = cudaStreamSynchronize(s->stream);
  bp::sdk::release_imported(handle);
  BP_CUDA_CHECK(q != cudaErrorNotReady && q != cudaSuccess ? q : e);
}

void Device::retire_pending(bool wait) {
  std::vector<PendingRelease> ready;
  cudaError_t first = cudaSuccess;
  auto note = [&](cudaError_t e) {
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();
    if (first == cudaSuccess) first = e;
  };
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    if (wait) {
      ready.swap(pending_);
    } else {
      size_t keep = 0;
      for (PendingRelease& p : pending_) {
        const cudaError_t e = cudaEventQuery(p.event);
        if (e == cudaErrorNotReady) {
          (void)cudaGetLastError();
          pending_[keep++] = p;
          continue;
        }
        // Complete, or failed: a failed stream runs nothing more, so the memory is free
        // either way; the first error is reported after the releases.
        note(e);
        ready.push_back(p);
      }
      pending_.resize(keep);
    }
    pending_count_.store(pending_.size(), std::memory_order_release);
  }
  for (PendingRelease& p : ready) {
    if (wait) note(cudaEventSynchronize(p.event));
    (void)cudaEventDestroy(p.event);
    bp::sdk::release_imported(p.handle);
  }
  BP_CUDA_CHECK(first);
}

CudaStream* Device::import_stream(cudaStream_t native) {
  ensure_ready();
  if (native != nullptr && native != cudaStreamLegacy && native != cudaStreamPerThread) {
    int owner = -1;
    const cudaError_t e = cudaStreamGetDevice(native, &owner);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                    bp::sdk::format("cuda:%d: stream_import: %p is not a valid cudaStream_t "
                                    "(cudaStreamGetDevice: %s)",
                                    index(), static_cast<void*>(native), cudaGetErrorName(e)),
                    cudaGetErrorName(e));
    }
    if (owner != index())
      bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                    bp::sdk::format("cuda:%d: stream_import: stream %p belongs to cuda:%d; import "
                                    "it on cuda:%d",
                                    index(), static_cast<void*>(native), owner, owner));
  }
  auto s = std::make_unique<CudaStream>();
  s->stream = native;
  s->device = this;
  s->index = index();
  s->owned = false;
  std::lock_guard<std::mutex> lock(streams_mutex_);
  streams_.push_back(s.get());
  return s.release();
}

}  // namespace bp::cuda
