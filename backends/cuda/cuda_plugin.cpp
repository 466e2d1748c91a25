// The CUDA backend's ABI table: the one file that touches bp_plugin_api (through the SDK).
// Each slot validates its handles and forwards to the Runtime/Device objects; errors become
// bp_error objects in the SDK.
#include "cuda_common.hpp"
#include "cuda_copy.hpp"
#include "cuda_device.hpp"
#include "cuda_kernels.hpp"
#include "cuda_nvtx.hpp"
#include "cuda_ops.hpp"

#include <backplane/sdk/plugin_sdk.hpp>

namespace bp::cuda {
namespace {

CudaEvent& event_of(bp_event* e) {
  if (!e) [[unlikely]]
    bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "cuda: NULL event");
  return *reinterpret_cast<CudaEvent*>(e);
}

// Note [Tagged buffer handles] in plugin_sdk.hpp: our own pointer, or an imported record.
char* buffer_at(bp_buffer* buf, uint64_t offset) {
  return bp::sdk::buffer_address(buf) + offset;
}

// The pairs the families implement: every pair of every op's dtype domain (Note [Dtype domains]
// in plugin_abi.h). Kernel handles are device-independent: the stream names the device.
bp::sdk::OpTable make_op_table() {
  return bp::sdk::OpTable("cuda", [](int32_t op, int32_t dtype, bp_op_decl& d) {
    if (const CudaKernel* k = kernel_for(op, dtype)) {
      d.kernel = reinterpret_cast<bp_kernel*>(const_cast<CudaKernel*>(k));
      d.support = BP_SUPPORT_YES;
    }
  });
}

// Note [Asynchronous errors] in plugin_abi.h: the stream's record as the host sees it (a lost
// device's beats it).
bp_stream_fault current_fault(CudaStream& s, bool clear) {
  if (s.device->lost()) return s.device->lost_record();
  return s.fault.read(clear);
}

// An event's record and what it watches, read together under its lock.
struct EventSnapshot {
  bp_stream_fault rec;
  std::shared_ptr<IndexLedger> ledger;
  std::shared_ptr<IndexWatch> watch;
};
EventSnapshot snapshot(CudaEvent& e) {
  std::lock_guard<std::mutex> lock(e.mu);
  return {e.rec, e.ledger, e.watch};
}

// Note [Events and deferred index errors]: the event's record, with the verdict on the index
// launches it watches once known (kept, so later waits agree). Call after the event completed.
bp_stream_fault verdict(CudaEvent& e) {
  auto [r, ledger, watch] = snapshot(e);
  if (r.severity != BP_FAULT_NONE || !watch) return r;
  const std::shared_ptr<const bp_stream_fault> f = resolve_watch(*ledger, *watch);
  if (!watch->resolved.load(std::memory_order_acquire)) return r;  // its stream is capturing
  std::lock_guard<std::mutex> lock(e.mu);
  if (e.watch == watch) {  // not recorded again meanwhile
    if (f) e.rec = *f;
    e.watch.reset();
    e.ledger.reset();
  }
  return f ? *f : r;
}

// Fails with the stream's record while it is set.
void raise_fault(CudaStream& s) {
  if (!s.fault.failed() && !s.device->lost()) [[likely]]
    return;
  const bp_stream_fault r = current_fault(s, false);
  if (r.severity == BP_FAULT_NONE) return;
  bp::sdk::fail(static_cast<bp_error_code>(r.code), r.message, r.native_name);
}

class CudaBackend final : public bp::sdk::Backend {
 public:
  void init() override { runtime().init(); }
  void shutdown() override { runtime().shutdown(); }

  int32_t device_count(const char** out_reason) override {
    Runtime& rt = runtime();
    *out_reason = rt.device_count() > 0 ? "" : rt.reason();
    return rt.device_count();
  }

  void device_properties(int32_t device, bp_device_properties& props) override {
    runtime().device(device).properties(props);
  }

  // ---- Streams and events ----

  bp_stream* stream_create(int32_t device) override {
    return reinterpret_cast<bp_stream*>(runtime().device(device).create_stream());
  }
  void stream_destroy(bp_stream* stream) override {
    CudaStream& s = stream_of(stream);
    Device* d = s.device;
    d->destroy_stream(&s);
    d->retire_releases();
  }
  void stream_synchronize(bp_stream* stream) override {
    CudaStream& s = stream_of(stream);
    raise_fault(s);
    BP_CUDA_CHECK(cudaStreamSynchronize(s.stream));
    s.device->retire_releases();  // Note [CUDA imported memory]
    check_index_errors(s);        // Note [Deferred index errors]
    resolve_waits(s, true);       // Note [Events and deferred index errors]
    raise_fault(s);
  }

  bool has_stream_fault() const override { return true; }
  void stream_fault(bp_stream* stream, bool clear, bp_stream_fault& out) override {
    CudaStream& s = stream_of(stream);
    resolve_waits(s, false);  // never blocks: verdicts already known
    out = current_fault(s, clear);
  }

  bool has_events() const override { return true; }
  bool has_event_timing() const override { return true; }

  bp_event* event_create(int32_t device) override {
    Device& d = runtime().device(device);
    d.ensure_ready();
    use_device(device);
    auto* e = new CudaEvent;
    e->device = device;
    const cudaError_t err = cudaEventCreate(&e->event);  // timing enabled (event_elapsed_ms)
    if (err != cudaSuccess) {
      delete e;
      BP_CUDA_CHECK(err);
    }
    return reinterpret_cast<bp_event*>(e);
  }
  void event_destroy(bp_event* event) override {
    if (!event) return;
    CudaEvent* e = &event_of(event);
    const cudaError_t err = cudaEventDestroy(e->event);
    delete e;
    BP_CUDA_CHECK(err);
  }
  // Note [Asynchronous errors]: an event recorded while its stream's record is set carries
  // it; one recorded after index launches not checked yet watches them (Note [Events and
  // deferred index errors]).
  void event_record(bp_event* event, bp_stream* stream) override {
    CudaStream& s = stream_of(stream);
    CudaEvent& e = event_of(event);
    use_device(s.index);
    bp_stream_fault r{};
    std::shared_ptr<IndexWatch> watch = record_event(s, e.event, r);
    if (s.device->lost()) {
      r = s.device->lost_record();
      watch.reset();
    }
    std::lock_guard<std::mutex> lock(e.mu);
    e.rec = r;
    e.ledger = watch ? s.index_ledger : nullptr;
    e.watch = std::move(watch);
  }
  void stream_wait_event(bp_stream* stream, bp_event* event) override {
    CudaStream& s = stream_of(stream);
    CudaEvent& e = event_of(event);
    use_device(s.index);
    BP_CUDA_CHECK(cudaStreamWaitEvent(s.stream, e.event, 0));
    auto [r, ledger, watch] = snapshot(e);
    if (r.severity != BP_FAULT_NONE || !watch) {
      s.fault.merge(r, BP_FAULT_STREAM_POISONED);
    } else if (watch->resolved.load(std::memory_order_acquire)) {
      if (watch->fault) s.fault.merge(*watch->fault, BP_FAULT_STREAM_POISONED);
    } else if (!s.capture.load(std::memory_order_acquire)) {
      add_pending_wait(s, std::move(ledger), std::move(watch));
    }
  }
  void event_synchronize(bp_event* event) override {
    CudaEvent& e = event_of(event);
    BP_CUDA_CHECK(cudaEventSynchronize(e.event));
    runtime().device(e.device).retire_releases();
    const bp_stream_fault r = verdict(e);
    if (r.severity != BP_FAULT_NONE)
      bp::sdk::fail(static_cast<bp_error_code>(r.code), r.message, r.native_name);
  }
  double event_elapsed_ms(bp_event* start, bp_event* end) override {
    float ms = 0.0f;
    BP_CUDA_CHECK(cudaEventElapsedTime(&ms, event_of(start).event, event_of(end).event));
    return ms;
  }

  // ---- Memory ----

  bp_buffer* mem_alloc(int32_t device, bp_stream* stream, uint64_t size) override {
    Device& d = runtime().device(device);
    d.ensure_ready();
    d.retire_releases();
    if (!stream) {  // Note [NULL streams]
      CudaStream& s = *d.internal_stream();
      void* p = d.allocate(s, size);
      const cudaError_t e = cudaStreamSynchronize(s.stream);
      if (e != cudaSuccess) {
        d.deallocate(s, p, size);
        BP_CUDA_CHECK(e);
      }
      return static_cast<bp_buffer*>(p);
    }
    CudaStream& s = stream_of(stream);
    check_stream_device(s, d);
    return static_cast<bp_buffer*>(d.allocate(s, size));
  }
  void mem_free(int32_t device, bp_stream* stream, bp_buffer* buf, uint64_t size) override {
    Device& d = runtime().device(device);
    d.ensure_ready();
    if (bp::sdk::is_imported(buf)) [[unlikely]] {  // Note [CUDA imported memory]
      const bp::sdk::ImportedBuffer& r = *bp::sdk::imported_record(buf);
      if (r.device != device)
        bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                      bp::sdk::format("cuda: mem_free: a buffer imported on cuda:%d freed on "
                                      "cuda:%d",
                                      r.device, device));
      CudaStream* s = stream ? &stream_of(stream) : nullptr;
      if (s) check_stream_device(*s, d);
      d.free_imported(s, buf);
      return;
    }
    d.retire_releases();
    if (!stream) {  // Note [NULL streams]
      use_device(device);
      BP_CUDA_CHECK(cudaDeviceSynchronize());
      d.deallocate(*d.internal_stream(), buf, size);
      return;
    }
    CudaStream& s = stream_of(stream);
    check_stream_device(s, d);
    d.deallocate(s, buf, size);
  }
  void memory_stats(int32_t device, bp_memory_stats& stats) override {
    runtime().device(device).memory_stats(stats);
  }
  void memory_reset_peak(int32_t device) override { runtime().device(device).reset_peak(); }
  bool has_empty_cache() const override { return true; }
  void memory_empty_cache(int32_t device) override { runtime().device(device).empty_cache(); }

  bool has_host_alloc() const override { return true; }
  void* host_alloc(int32_t device, uint64_t size) override {
    runtime().device(device).ensure_ready();
    if (size == 0) return nullptr;
    use_device(device);
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      bp::sdk::fail(BP_ERROR_OUT_OF_MEMORY,
                    bp::sdk::format("cuda:%d: cannot allocate %llu bytes of pinned host memory "
                                    "(%s: %s)",
                                    device, static_cast<unsigned long long>(size),
                                    cudaGetErrorName(e), cudaGetErrorString(e)),
                    cudaGetErrorName(e));
    }
    return p;
  }
  void host_free(int32_t device, void* ptr) override {
    runtime().device(device);
    if (!ptr) return;
    BP_CUDA_CHECK(cudaFreeHost(ptr));
  }

  // ---- Copies ----

  void memset(bp_stream* stream, bp_buffer* buf, uint64_t offset, int32_t value,
              uint64_t size) override {
    (void)bp::sdk::take_op_id();  // only launches carry ids into the device records
    if (size == 0) return;
    CudaStream& s = stream_of(stream);
    use_device(s.index);
    BP_CUDA_CHECK(cudaMemsetAsync(buffer_at(buf, offset), value, size, s.stream));
  }
  void copy_h2d(bp_stream* stream, bp_buffer* dst, uint64_t dst_off, const void* src,
                uint64_t size) override {
    (void)bp::sdk::take_op_id();  // only launches carry ids into the device records
    if (size == 0) return;
    CudaStream& s = stream_of(stream);
    use_device(s.index);
    char* d = buffer_at(dst, dst_off);
    if (size > kStageThreshold && is_pageable(src) &&
        s.device->staging().h2d(s, d, static_cast<const char*>(src), size))
      return;
    BP_CUDA_CHECK(cudaMemcpyAsync(d, src, size, cudaMemcpyHostToDevice, s.stream));
  }
  void copy_d2h(bp_stream* stream, void* dst, bp_buffer* src, uint64_t src_off,
                uint64_t size) override {
    (void)bp::sdk::take_op_id();
    if (size == 0) return;
    CudaStream& s = stream_of(stream);
    raise_fault(s);  // a host read reports the stream's record
    use_device(s.index);
    const char* from = buffer_at(src, src_off);
    if (size > kStageThreshold && is_pageable(dst) &&
        s.device->staging().d2h(s, static_cast<char*>(dst), from, size)) {
      check_index_errors(s);   // Note [Deferred index errors]
      resolve_waits(s, true);  // Note [Events and deferred index errors]
      raise_fault(s);
      return;
    }
    // For pageable dst the driver returns only after the copy completed (plugin_abi.h needs
    // the data in place when the call returns); pinned dst stays asynchronous.
    BP_CUDA_CHECK(cudaMemcpyAsync(dst, from, size, cudaMemcpyDeviceToHost, s.stream));
    check_index_errors(s);
    resolve_waits(s, true);
    raise_fault(s);
  }
  void copy_d2d(bp_stream* stream, bp_buffer* dst, uint64_t dst_off, bp_buffer* src,
                uint64_t src_off, uint64_t size) override {
    (void)bp::sdk::take_op_id();  // only launches carry ids into the device records
    if (size == 0) return;
    CudaStream& s = stream_of(stream);
    use_device(s.index);
    BP_CUDA_CHECK(cudaMemcpyAsync(buffer_at(dst, dst_off), buffer_at(src, src_off), size,
                                  cudaMemcpyDeviceToDevice, s.stream));
  }
  bool has_copy_peer() const override { return true; }
  void copy_peer(bp_stream* dst_stream, int32_t dst_device, bp_buffer* dst, uint64_t dst_off,
                 int32_t src_device, bp_buffer* src, uint64_t src_off, uint64_t size) override {
    (void)bp::sdk::take_op_id();  // only launches carry ids into the device records
    Device& dd = runtime().device(dst_device);
    Device& sd = runtime().device(src_device);
    CudaStream& s = stream_of(dst_stream);
    check_stream_device(s, dd);
    if (size == 0) return;
    if (&dd != &sd) {
      // Direct access both ways where the hardware allows; otherwise the driver stages the
      // copy through host memory, which cudaMemcpyPeerAsync does by itself.
      dd.enable_peer_access(sd);
      sd.enable_peer_access(dd);
    }
    use_device(dst_device);
    BP_CUDA_CHECK(cudaMemcpyPeerAsync(buffer_at(dst, dst_off), dst_device, buffer_at(src, src_off),
                                      src_device, size, s.stream));
  }

  // ---- Kernels ----

  bp_kernel* find_kernel_id(int32_t device, int32_t op, int32_t dtype) override {
    runtime().device(device);
    return ops_.find(op, dtype);
  }

  // Note [Launch path] in cuda_kernels.hpp.
  void launch(bp_kernel* kernel, bp_stream* stream, const bp_tensor_desc* inputs,
              int32_t num_inputs, const bp_tensor_desc* outputs, int32_t num_outputs,
              const bp::sdk::Attrs& attrs) override {
    if (!kernel) [[unlikely]]
      bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT, "cuda: launch with a NULL kernel");
    const CudaKernel& k = *reinterpret_cast<const CudaKernel*>(kernel);
    CudaStream& s = stream_of(stream);
    use_device(s.index);
    const LaunchArgs args{s.stream, &s,          s.device, s.device->info().sm_count,
                          k.op,     k.dtype,     inputs,   num_inputs,
                          outputs,  num_outputs, &attrs,   bp::sdk::take_op_id()};
    try {
      NvtxRange range(k.op);  // Note [NVTX ranges]
      k.fn(args);
    } catch (const bp::sdk::Failure& f) {
      bp::sdk::fail(f.code(),
                    bp::sdk::format("cuda:%d: op '%s' (%s): %s", s.index, op_name(k.op),
                                    bp_dtype_name(k.dtype), f.what()),
                    f.native_name());
    }
  }

  bool has_list_ops() const override { return true; }
  void list_ops(int32_t device, const bp_op_support** out_list, int32_t* out_count) override {
    runtime().device(device);
    ops_.list(out_list, out_count);
  }

  // ---- Native handles (cuda_native.cpp, Note [CUDA imported memory]) ----

  bool has_buffer_native() const override { return true; }
  void buffer_native(bp_buffer* buf, uint64_t offset, bp_native_buffer& out) override {
    if (bp::sdk::is_imported(buf)) {
      const bp::sdk::ImportedBuffer& r = *bp::sdk::imported_record(buf);
      if (offset > r.size)
        bp::sdk::fail(BP_ERROR_INVALID_ARGUMENT,
                      bp::sdk::format("cuda:%d: buffer_native: offset %llu is past the end of an "
                                      "imported buffer of %llu bytes",
                                      r.device, static_cast<unsigned long long>(offset),
                                      static_cast<unsigned long long>(r.size)));
      out.address = static_cast<char*>(r.address) + offset;
      out.device_ordinal = r.device;
      out.dlpack_device_type = r.dlpack_device_type;
      return;
    }
    out.address = buffer_at(buf, offset);
    out.device_ordinal = device_of(buf);
    out.dlpack_device_type = BP_DLPACK_CUDA;
  }
  bool has_stream_native() const override { return true; }
  void* stream_native(bp_stream* stream) override {
    return static_cast<void*>(stream_of(stream).stream);
  }
  bool has_buffer_import() const override { return true; }
  bp_buffer* buffer_import(int32_t device, void* address, uint64_t size, bp_release_fn release,
                           void* release_ctx) override {
    return runtime().device(device).import_buffer(address, size, release, release_ctx);
  }
  // ---- Graphs (cuda_graph.cpp) ----

  bool has_graphs() const override { return true; }
  void graph_begin_capture(bp_stream* stream) override {
    cuda::graph_begin_capture(stream_of(stream));
  }
  bp_graph* graph_end_capture(bp_stream* stream) override {
    return reinterpret_cast<bp_graph*>(cuda::graph_end_capture(stream_of(stream)));
  }
  void graph_instantiate(bp_graph* graph) override {
    cuda::graph_instantiate(*reinterpret_cast<CudaGraph*>(graph));
  }
  void graph_launch(bp_graph* graph, bp_stream* stream) override {
    (void)bp::sdk::take_op_id();
    cuda::graph_launch(*reinterpret_cast<CudaGraph*>(graph), stream_of(stream));
  }
  void graph_destroy(bp_graph* graph) override {
    cuda::graph_destroy(reinterpret_cast<CudaGraph*>(graph));
  }

  bool has_stream_import() const override { return true; }
  bp_stream* stream_import(int32_t device, void* native_stream) override {
    return reinterpret_cast<bp_stream*>(
        runtime().device(device).import_stream(static_cast<cudaStream_t>(native_stream)));
  }

 private:
  const bp::sdk::OpTable ops_ = make_op_table();

  // The CUDA device of one of our own allocations: 0 on a one-GPU machine, else asked of the
  // driver (our pools hold device memory only).
  static int32_t device_of(bp_buffer* buf) {
    if (runtime().device_count() == 1) return 0;
    cudaPointerAttributes a{};
    BP_CUDA_CHECK(cudaPointerGetAttributes(&a, bp::sdk::buffer_address(buf)));
    return a.device;
  }
  static void check_stream_device(const CudaStream& s, const Device& d) {
    if (s.device != &d) [[unlikely]]
      bp::sdk::fail(
          BP_ERROR_INVALID_ARGUMENT,
          bp::sdk::format("cuda: stream of cuda:%d used for cuda:%d", s.index, d.index()));
  }
};

}  // namespace
}  // namespace bp::cuda

BP_SDK_DEFINE_PLUGIN(bp::cuda::CudaBackend, "cuda", "cuda", "1.0.0")
